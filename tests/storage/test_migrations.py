"""Migrations on databases with rows in them: up from every revision, down to the base and back.

Each earlier revision's rows are written with that revision's own columns, in raw SQL (the
models know only the newest schema), then read back through the store.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from postgres import BACKENDS
from sqlalchemy import Connection, Engine, inspect, text
from sqlalchemy.engine.interfaces import ReflectedColumn

from gpumux.scheduling.next_trials import next_trials
from gpumux.status import SweepStatus, TrialStatus
from gpumux.storage import lifecycle, tokens
from gpumux.storage import profiles as profile_store
from gpumux.storage import reports as report_store
from gpumux.storage import sweeps as sweep_store
from gpumux.storage import trials as trial_store
from gpumux.storage.dialects.base import DatabaseError
from gpumux.storage.engine import Sessions, make_engine, make_sessions
from gpumux.storage.migrate import alembic_config, head_revision, upgrade
from gpumux.storage.models import Base, token_hash

EARLIER = [
    "0001", "0002", "0003", "0004", "0005", "0006", "0007", "0008", "0009", "0010", "0011",
    "0012", "0013", "0014", "0015", "0016", "0017",
]  # fmt: skip
HEAD = head_revision()
# Before 0013 the split search stored a profile's directory as the first word of its command.
WORKDIR = "/home/alice/project"
TOKEN = "gmx_issued-before-the-upgrade"
QUEUED_AT = datetime(2026, 1, 2, 3, 4, 5, 123456, tzinfo=UTC)
STARTED_AT = datetime(2026, 1, 2, 3, 5, 0, tzinfo=UTC)
ENDED_AT = datetime(2026, 1, 2, 4, 0, 0, tzinfo=UTC)
# Every table and how many rows populate() writes to it at the newest revision.
ROWS = {
    "owners": 1,
    "sweeps": 2,
    "trials": 4,
    "trial_reports": 3,
    "profiles": 1,
    "api_tokens": 1,
    "nodes": 0,
}
# The revision that created each table.
CREATED_AT_REVISION = {"profiles": "0002", "api_tokens": "0003", "nodes": "0008"}


def stored(moment: datetime) -> str:
    """A timestamp as SQLAlchemy stores one in SQLite: naive UTC text."""
    return moment.replace(tzinfo=None).isoformat(sep=" ", timespec="microseconds")


# The columns that are booleans: SQLite takes 0 and 1, PostgreSQL wants true and false.
BOOLEANS = {"cancel_requested", "settled"}


def insert(connection: Connection, table: str, rows: list[dict[str, Any]]) -> None:
    for written in rows:
        row = {name: bool(v) if name in BOOLEANS else v for name, v in written.items()}
        columns = ", ".join(row)
        values = ", ".join(f":{name}" for name in row)
        connection.execute(text(f"INSERT INTO {table} ({columns}) VALUES ({values})"), row)


def sweep_row(sweep_id: int, status: str, revision: str) -> dict[str, Any]:
    row: dict[str, Any] = {
        "id": sweep_id,
        "name": f"sweep {sweep_id}",
        "owner_id": 1,
        "status": status,
        "command": json.dumps(["python", "train.py", "--lr", "{lr}"]),
        "param_tokens": json.dumps(["lr"]),
        "workdir": "/work",
        "env": json.dumps({"PATH": "/usr/bin"}),
        "seed": 7,
        "split": 2,
        "objective_metric": "loss",
        "objective_mode": "min",
        "time_limit_s": 600.0,
        "trial_count": 2,
        "cancel_requested": 0,
        "created_at": stored(QUEUED_AT),
        "finished_at": stored(ENDED_AT) if status == "finished" else None,
    }
    # The second sweep is a random search of 2 draws: 0005 names its search method.
    budget = "trial_budget" if revision >= "0015" else "random_trials"
    row[budget] = 2 if sweep_id == 2 else None
    if revision >= "0003":
        row |= {"retries": sweep_id, "priority": 10 * sweep_id}
    if revision >= "0005":
        row |= {"search": "random" if sweep_id == 2 else "grid"}
    if revision >= "0007":
        # The second sweep's trials start preloaded: 0007's `warm`, `preload` from 0016.
        row |= {"warm" if revision < "0016" else "preload": sweep_id == 2}
    return row


def trial_row(trial_id: int, sweep_id: int, status: str, revision: str) -> dict[str, Any]:
    started = status != "queued"
    ended = status in {"succeeded", "failed"}
    row: dict[str, Any] = {
        "id": trial_id,
        "sweep_id": sweep_id,
        "number": trial_id,
        "params": json.dumps({"lr": 0.1 * trial_id}),
        "status": status,
        "attempt": 1,
        "device": "gpu:0" if started else None,
        "slot": 0 if started else None,
        "split": 2 if started else None,
        "memory_limit_mb": 4096 if started else None,
        "cpu_threads": 1 if started else None,
        "pid": 1000 + trial_id if started else None,
        "pid_started": 555 if started else None,
        "token_hash": "ab" * 32 if started else None,
        "log_path": f"/logs/trial-{trial_id}.1.log" if started else None,
        "queued_at": stored(QUEUED_AT),
        "started_at": stored(STARTED_AT) if started else None,
        "ended_at": stored(ENDED_AT) if ended else None,
        "exit_code": {"succeeded": 0, "failed": 3}.get(status),
        "signal": None,
        "error": "exit 3" if status == "failed" else None,
        "objective": 0.25 if status == "succeeded" else None,
        "samples_per_s": 120.5 if started else None,
        "last_report_at": stored(ENDED_AT) if started else None,
    }
    if revision >= "0003":
        row |= {"failures": 1 if status == "failed" else 0}
    if revision == "0003":
        row |= {
            "supervisor_pid": 2000 + trial_id if started else None,
            "supervisor_started": 777 if started else None,
        }
    return row


def report_row(report_id: int, trial_id: int, epoch: int, revision: str) -> dict[str, Any]:
    # Keras epochs as the hook counted them before 0005, from 1; a step from 0 since.
    step = {"step": epoch - 1} if revision >= "0005" else {"epoch": epoch}
    return {
        "id": report_id,
        "trial_id": trial_id,
        "attempt": 1,
        "kind": "epoch",
        "at": stored(ENDED_AT),
        **step,
        "samples": 1000.0,
        "seconds": 8.0,
        "samples_per_s": 125.0,
        "metrics": json.dumps({"loss": 1.0 / epoch}),
    }


def populate(connection: Connection, revision: str) -> None:
    """Two sweeps of alice's, four trials in four states, reports, and what `revision` adds."""
    alice = {"id": 1, "name": "alice", "uid": 1000, "created_at": stored(QUEUED_AT)}
    insert(connection, "owners", [alice])
    insert(
        connection,
        "sweeps",
        [sweep_row(1, "finished", revision), sweep_row(2, "running", revision)],
    )
    statuses = [(1, 1, "succeeded"), (2, 1, "failed"), (3, 2, "running"), (4, 2, "queued")]
    insert(connection, "trials", [trial_row(t, s, status, revision) for t, s, status in statuses])
    reports = [report_row(1, 1, 1, revision), report_row(2, 1, 2, revision)]
    insert(connection, "trial_reports", [*reports, report_row(3, 3, 1, revision)])
    if revision >= "0002":
        profile = {
            "id": 1,
            "device_name": "NVIDIA H200",
            "fingerprint": "f" * 64,
            "command": json.dumps([WORKDIR, "python", "train.py"]),
            "param_tokens": json.dumps(["lr"]),
            "unit": "samples/s",
            "curve": json.dumps([{"split": 1, "throughput": 100.0}]),
            "best_split": 1,
            "settled": 1,
            "reason": "one is best",
            "sweep_id": 1,
            "created_at": stored(QUEUED_AT),
            "updated_at": stored(ENDED_AT),
        }
        if revision >= "0013":
            # From 0013 the directory is a column of its own, no longer the command's first word.
            profile.update(command=json.dumps(["python", "train.py"]), workdir=WORKDIR)
        insert(connection, "profiles", [profile])
    if revision >= "0003":
        token = {
            "id": 1,
            "owner_id": 1,
            "token_hash": token_hash(TOKEN),
            "created_at": stored(QUEUED_AT),
            "last_used_at": None,
            "revoked_at": None,
        }
        insert(connection, "api_tokens", [token])
    if connection.dialect.name == "postgresql":
        # The rows name their ids; the server's sequences must move past them as SQLite's
        # rowids do, or the next row the store writes would take id 1 again.
        for table in ("owners", "sweeps", "trials", "trial_reports", "profiles", "api_tokens"):
            if inspect(connection).has_table(table):
                connection.execute(
                    text(
                        f"SELECT setval(pg_get_serial_sequence('{table}', 'id'), "
                        f"(SELECT max(id) FROM {table}))"
                    )
                )


@pytest.fixture(params=BACKENDS)
def engine(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Engine]:
    """An engine over an empty database: an SQLite file, or one on the PostgreSQL cluster."""
    if request.param == "postgresql":
        url = request.getfixturevalue("pg_database")
    else:
        url = f"sqlite:///{tmp_path / 'gpumux.db'}"
    engine = make_engine(url)
    yield engine
    engine.dispose()


def migrate(engine: Engine, to: str) -> None:
    """Upgrade to, or downgrade to, a revision ("base" is before any)."""
    config = alembic_config(engine)
    with engine.connect() as connection:
        current = MigrationContext.configure(connection).get_current_revision()
    if to == "base" or (current is not None and to < current):
        command.downgrade(config, to)
    else:
        command.upgrade(config, to)


def revision_of(engine: Engine) -> str | None:
    with engine.connect() as connection:
        return MigrationContext.configure(connection).get_current_revision()


def row_counts(engine: Engine) -> dict[str, int]:
    with engine.connect() as connection:
        tables = set(inspect(connection).get_table_names()) - {"alembic_version"}
        return {
            table: connection.execute(text(f"SELECT count(*) FROM {table}")).scalar_one()
            for table in tables
        }


def assert_sound(engine: Engine) -> None:
    """Every reference points at a row, and SQLite finds the file intact (PostgreSQL checks
    each reference as it is written, and every constraint stays validated)."""
    with engine.connect() as connection:
        if connection.dialect.name == "postgresql":
            unchecked = "SELECT count(*) FROM pg_constraint WHERE NOT convalidated"
            assert connection.exec_driver_sql(unchecked).scalar() == 0
            return
        assert connection.exec_driver_sql("PRAGMA foreign_key_check").all() == []
        assert connection.exec_driver_sql("PRAGMA integrity_check").scalar() == "ok"


def populated_then_upgraded(engine: Engine, revision: str) -> None:
    """A database populated as gpumux at `revision` wrote it, then upgraded to head."""
    migrate(engine, revision)
    with engine.begin() as connection:
        populate(connection, revision)
    upgrade(engine)


def columns_of(engine: Engine, table: str) -> set[str]:
    with engine.connect() as connection:
        return {c["name"] for c in inspect(connection).get_columns(table)}


def test_head_is_the_newest_revision_and_the_earlier_ones_lead_to_it(engine: Engine) -> None:
    scripts = ScriptDirectory.from_config(alembic_config(engine))
    # What a daemon takes for head, read from the scripts' file names, is Alembic's.
    assert scripts.get_current_head() == HEAD
    walked = [script.revision for script in scripts.walk_revisions()]
    assert walked == [HEAD, *reversed(EARLIER)]


def test_the_models_match_the_migrations(engine: Engine) -> None:
    migrate(engine, "head")
    with engine.connect() as connection:
        diff = compare_metadata(MigrationContext.configure(connection), Base.metadata)
    assert diff == [], f"models and migrations differ; write a migration: {diff}"


@pytest.fixture
def second_engine(
    engine: Engine, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[Engine]:
    """An engine over another empty database of `engine`'s backend."""
    if engine.dialect.name == "postgresql":
        cluster = request.getfixturevalue("pg_cluster")
        name = cluster.create_database()
        second = make_engine(cluster.url(name))
        yield second
        second.dispose()
        cluster.drop_database(name)
        return
    second = make_engine(f"sqlite:///{tmp_path / 'second.db'}")
    yield second
    second.dispose()


def schema_of(engine: Engine) -> dict[str, Any]:
    """Each table's columns, keys, indexes and constraints and its rows, and PostgreSQL's
    sequences, as the database reports them (in no order: a migration adds a column last)."""

    def shown(found: Iterable[Any]) -> list[str]:
        return sorted(" ".join(repr(item).split()) for item in found)

    def column(described: ReflectedColumn) -> ReflectedColumn:
        # PostgreSQL shows a default as the literal cast to the column's type ('0'::bigint), or
        # bare (0) where 0009 widened the column after: the same value.
        default = described["default"]
        if default is not None:
            described["default"] = re.sub(r"^'(.*)'::[a-z ]+$", r"\1", default)
        return described

    with engine.connect() as connection:
        inspector = inspect(connection)
        schema: dict[str, Any] = {
            table: {
                "columns": shown([column(c) for c in inspector.get_columns(table)]),
                "primary key": shown([inspector.get_pk_constraint(table)]),
                "foreign keys": shown(inspector.get_foreign_keys(table)),
                "indexes": shown(inspector.get_indexes(table)),
                "unique": shown(inspector.get_unique_constraints(table)),
                "checks": shown(inspector.get_check_constraints(table)),
                "rows": shown(connection.execute(text(f"SELECT * FROM {table}")).all()),
            }
            for table in inspector.get_table_names()
        }
        if connection.dialect.name == "postgresql":
            sequences = "SELECT sequence_name, data_type FROM information_schema.sequences"
            schema["sequences"] = shown(connection.execute(text(sequences)).all())
        else:
            tables = "SELECT name FROM sqlite_master WHERE type = 'table' AND name LIKE 'sqlite_%'"
            schema["SQLite's own tables"] = shown(connection.execute(text(tables)).all())
            for table, described in schema.items():
                if isinstance(described, dict):
                    described["SQLite's indexes"] = sqlite_indexes(connection, table)
    return schema


def sqlite_indexes(connection: Connection, table: str) -> list[str]:
    """Each index of `table` as SQLite keeps it: unique, partial, and each key's column, order
    and collation (what the inspector leaves out)."""
    found = []
    for _, name, unique, origin, partial in connection.exec_driver_sql(
        f"PRAGMA index_list({table})"
    ):
        keys = connection.exec_driver_sql(f"PRAGMA index_xinfo({name})").all()
        # (seqno, cid, column, desc, collation, key) less cid: the column's place in the table.
        shown_keys = [
            (seqno, column, desc, coll, key) for seqno, _, column, desc, coll, key in keys
        ]
        found.append(repr((name, unique, origin, partial, shown_keys)))
    return sorted(found)


def test_a_new_database_is_made_as_the_migrations_from_nothing_make_it(
    engine: Engine, second_engine: Engine
) -> None:
    migrate(engine, "head")
    upgrade(second_engine)
    assert revision_of(second_engine) == HEAD
    migrated, made = schema_of(engine), schema_of(second_engine)
    assert sorted(made) == sorted(migrated)
    for name, described in migrated.items():
        parts = described if isinstance(described, dict) else {"": described}
        for part, items in parts.items():
            ours = made[name][part] if part else made[name]
            assert ours == items, (
                f"{name} {part}: migrated only {sorted(set(items) - set(ours))}; "
                f"made only {sorted(set(ours) - set(items))}"
            )
    # The same rows go into both.
    for either in (engine, second_engine):
        with either.begin() as connection:
            populate(connection, HEAD)
        assert_sound(either)
    assert row_counts(second_engine) == row_counts(engine)


@pytest.mark.parametrize("revision", EARLIER)
def test_a_populated_database_is_upgraded_to_head_and_reads_back_through_the_store(
    engine: Engine, revision: str
) -> None:
    migrate(engine, revision)
    with engine.begin() as connection:
        populate(connection, revision)

    upgrade(engine)

    assert revision_of(engine) == HEAD
    assert_sound(engine)
    expected = {
        table: count
        for table, count in ROWS.items()
        if count and CREATED_AT_REVISION.get(table, "0001") <= revision
    }
    assert {t: n for t, n in row_counts(engine).items() if n} == expected
    sessions = make_sessions(engine)
    with sessions.read() as session:
        sweeps, count = sweep_store.list_sweeps(session=session)
        assert count == 2
        assert [(s.id, s.status, s.owner.name) for s in sweeps] == [
            (2, SweepStatus.running, "alice"),
            (1, SweepStatus.finished, "alice"),
        ]
        finished = sweeps[1]
        assert finished.command == ["python", "train.py", "--lr", "{lr}"]
        assert finished.env == {"PATH": "/usr/bin"} and finished.finished_at == ENDED_AT
        # Columns added by 0003 take their defaults in rows written before it.
        newer = revision >= "0003"
        assert (finished.retries, finished.priority) == ((1, 10) if newer else (0, 0))
        assert [(s.search, s.prune) for s in sweeps] == [("random", None), ("grid", None)]
        # 0015: the random search's draws are its budget, as they were its random_trials.
        assert [s.trial_budget for s in sweeps] == [2, None]
        # 0007: sweeps written before it start their trials fresh; 0016 keeps the flag.
        assert [s.preload for s in sweeps] == [revision >= "0007", False]

        trials, _ = trial_store.list_trials(session=session, sweep_id=1)
        assert [(t.status, t.exit_code) for t in trials] == [
            (TrialStatus.succeeded, 0),
            (TrialStatus.failed, 3),
        ]
        succeeded, failed = trials
        assert succeeded.params == {"lr": 0.1} and succeeded.objective == 0.25
        assert (succeeded.queued_at, succeeded.started_at) == (QUEUED_AT, STARTED_AT)
        assert failed.failures == (1 if newer else 0)
        # 0008: a trial written before it is on no node (the one daemon of its time adopts it).
        assert [t.node_id for t in trials] == [None, None]
        reports, _ = report_store.list_reports(session=session, trial_id=succeeded.id)
        assert [(r.step, r.metrics) for r in reports] == [(0, {"loss": 1.0}), (1, {"loss": 0.5})]
        # 0011: reports and trials from before it counted no optimizer steps.
        assert [r.steps for r in reports] == [None, None] and succeeded.steps_per_s is None
        # 0012: trials from before it saw a GPU, as far as anyone knew.
        assert [t.no_gpu for t in trials] == [None, None]
        # 0017: their frameworks' pools were never told.
        assert [(t.pool_mb, t.pool_at) for t in trials] == [(None, None), (None, None)]
        assert sweep_store.best_trial(session=session, sweep=finished) == succeeded
        assert [t.id for t in trial_store.active_trials(session=session)] == [3]
        assert [t.id for t in next_trials(session=session, limit=10)] == [4]

        profile = profile_store.get_profile(
            session=session, device_name="NVIDIA H200", fingerprint="f" * 64
        )
        assert (profile is not None) == (revision >= "0002")
        if profile is not None:
            # 0006's limits are unknown for a profile measured before them: nothing is avoided.
            assert (profile.best_split, profile.oom_at, profile.ceiling) == (1, None, None)
            # 0013: the directory moves out of the command into a column of its own.
            assert (profile.workdir, profile.command) == (WORKDIR, ["python", "train.py"])
            # 0018: no CUDA context was measured before it.
            assert profile.context_mb is None
        owner = tokens.resolve_token(session=session, token=TOKEN)
        assert (owner.name if owner else None) == ("alice" if newer else None)

    with sessions.write.begin() as session:
        queued = trial_store.get_trial(session=session, trial_id=4)
        assert queued is not None
        lifecycle.set_trial_status(session=session, trial=queued, status=TrialStatus.starting)
    with sessions.read() as session:
        assert {t.id for t in trial_store.active_trials(session=session)} == {3, 4}


def test_a_populated_database_goes_down_to_the_base_step_by_step_and_back_up(
    engine: Engine,
) -> None:
    migrate(engine, "0003")
    with engine.begin() as connection:
        populate(connection, "0003")
    upgrade(engine)

    for down_to in ["0003", "0002", "0001"]:
        migrate(engine, down_to)
        assert revision_of(engine) == down_to
        assert_sound(engine)
        # A step down drops the tables it created and nothing else: no row is lost to a
        # table copied while foreign keys cascade.
        assert row_counts(engine) == {
            table: count
            for table, count in ROWS.items()
            if CREATED_AT_REVISION.get(table, "0001") <= down_to
        }
        columns = columns_of(engine, "trials")
        assert ("supervisor_pid" in columns) == (down_to == "0003")
        assert ("failures" in columns) == (down_to == "0003")

    migrate(engine, "base")
    assert revision_of(engine) is None
    assert row_counts(engine) == {}

    upgrade(engine)
    assert revision_of(engine) == HEAD
    assert row_counts(engine) == dict.fromkeys(ROWS, 0)
    with engine.connect() as connection:
        assert compare_metadata(MigrationContext.configure(connection), Base.metadata) == []


def test_head_down_to_0003_and_up_again_keeps_every_row(engine: Engine) -> None:
    migrate(engine, "0003")
    with engine.begin() as connection:
        populate(connection, "0003")
    upgrade(engine)
    migrate(engine, "0003")
    upgrade(engine)
    assert row_counts(engine) == ROWS
    assert_sound(engine)


def test_0006_down_drops_the_profile_limits_and_keeps_the_profile(engine: Engine) -> None:
    populated_then_upgraded(engine, "0005")
    with engine.begin() as connection:
        connection.execute(text("UPDATE profiles SET oom_at = 8, ceiling = 6"))

    migrate(engine, "0005")

    columns = columns_of(engine, "profiles")
    assert {"oom_at", "ceiling"}.isdisjoint(columns) and "best_split" in columns
    assert row_counts(engine) == {table: n for table, n in ROWS.items() if table != "nodes"}
    assert_sound(engine)
    upgrade(engine)
    with make_sessions(engine).read() as session:
        profile = profile_store.get_profile_by_id(session=session, profile_id=1)
        assert profile is not None and (profile.oom_at, profile.ceiling) == (None, None)


def test_0013_down_puts_the_directory_back_in_front_of_the_command(engine: Engine) -> None:
    populated_then_upgraded(engine, "0012")

    migrate(engine, "0012")

    assert "workdir" not in columns_of(engine, "profiles")
    with engine.connect() as connection:
        command = connection.execute(text("SELECT command FROM profiles")).scalar_one()
    assert (json.loads(command) if isinstance(command, str) else command) == [
        WORKDIR,
        "python",
        "train.py",
    ]
    assert_sound(engine)


def test_0015_down_names_the_budget_random_trials_again_and_keeps_it(engine: Engine) -> None:
    populated_then_upgraded(engine, "0014")

    migrate(engine, "0014")

    assert "trial_budget" not in columns_of(engine, "sweeps")
    with engine.connect() as connection:
        budgets = connection.execute(text("SELECT random_trials FROM sweeps ORDER BY id"))
        assert [row[0] for row in budgets] == [None, 2]
    assert row_counts(engine) == ROWS
    assert_sound(engine)


def test_0016_renames_warm_to_preload_and_back_keeping_the_flag(engine: Engine) -> None:
    populated_then_upgraded(engine, "0015")
    with engine.connect() as connection:
        rows = connection.execute(text("SELECT id, preload FROM sweeps ORDER BY id")).all()
    assert [(sweep_id, bool(flag)) for sweep_id, flag in rows] == [(1, False), (2, True)]

    migrate(engine, "0015")

    columns = columns_of(engine, "sweeps")
    assert "warm" in columns and "preload" not in columns
    with engine.connect() as connection:
        rows = connection.execute(text("SELECT id, warm FROM sweeps ORDER BY id")).all()
    assert [(sweep_id, bool(flag)) for sweep_id, flag in rows] == [(1, False), (2, True)]
    assert_sound(engine)


def test_upgrade_is_idempotent(sessions: Sessions) -> None:
    upgrade(sessions.engine)
    assert revision_of(sessions.engine) == HEAD


# In a fresh interpreter, as a daemon starts: whether upgrading the database at the URL given
# imported Alembic.
UPGRADED = """
import sys
from gpumux.storage.engine import make_engine
from gpumux.storage.migrate import upgrade
upgrade(make_engine(sys.argv[1]))
print("alembic" in sys.modules)
"""


def alembic_imported_upgrading(url: str) -> bool:
    done = subprocess.run(
        [sys.executable, "-c", UPGRADED, url], capture_output=True, text=True, check=True
    )
    return done.stdout.split() == ["True"]


def test_only_a_database_of_an_earlier_gpumux_imports_alembic(
    engine: Engine, second_engine: Engine
) -> None:
    new = engine.url.render_as_string(hide_password=False)
    # A new database is made without it, and then, at head, checked without it.
    assert not alembic_imported_upgrading(new)
    assert revision_of(engine) == HEAD
    assert not alembic_imported_upgrading(new)
    migrate(second_engine, EARLIER[-1])
    assert alembic_imported_upgrading(second_engine.url.render_as_string(hide_password=False))
    assert revision_of(second_engine) == HEAD


def test_a_database_from_a_newer_gpumux_is_refused(sessions: Sessions) -> None:
    with sessions.write.begin() as session:
        session.execute(text("UPDATE alembic_version SET version_num = 'fffffffffff'"))
    with pytest.raises(DatabaseError, match="newer than this gpumux knows"):
        upgrade(sessions.engine)


@pytest.mark.sqlite_only(reason="a file that is not SQLite's")
def test_a_file_that_is_not_a_database_is_reported(tmp_path: Path) -> None:
    path = tmp_path / "broken.db"
    path.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(DatabaseError, match="cannot be opened as a database") as caught:
        upgrade(make_engine(f"sqlite:///{path}"))
    assert str(path) in str(caught.value) and "--db" in str(caught.value)
