"""A damaged database: refused at start with what and what to do; /health says so after."""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from builders import stored_sweep
from sqlalchemy import select

from gpumux.config import Settings
from gpumux.home.lockfile import DaemonError
from gpumux.server.daemon import embedded
from gpumux.storage.dialects.base import DatabaseError
from gpumux.storage.engine import make_engine, make_sessions
from gpumux.storage.migrate import upgrade
from gpumux.storage.models import Trial

TRIALS = 300


def migrated_with_rows(path: Path) -> None:
    """A migrated database file at `path` holding a sweep of TRIALS trials, its WAL folded in."""
    path.parent.mkdir(parents=True, exist_ok=True)
    engine = make_engine(f"sqlite:///{path}")
    upgrade(engine)
    with make_sessions(engine).write.begin() as session:
        stored_sweep(session, path.parent, n=TRIALS)
    # The last connection to close checkpoints the WAL into the file and removes it.
    engine.dispose()


def damage(path: Path, name: str) -> None:
    """Overwrite the first bytes of the root page of table or index `name`, as a bad disk would."""
    with sqlite3.connect(path) as database:
        (root,) = database.execute("SELECT rootpage FROM sqlite_master WHERE name = ?", (name,))
        (page_size,) = database.execute("PRAGMA page_size").fetchone()
    database.close()
    descriptor = os.open(path, os.O_WRONLY)
    try:
        os.pwrite(descriptor, b"\xa5" * 64, (root[0] - 1) * page_size)
    finally:
        os.close(descriptor)


def refusal(path: Path) -> str:
    with pytest.raises(DatabaseError) as caught:
        upgrade(make_engine(f"sqlite:///{path}"))
    return str(caught.value)


def test_an_intact_database_passes_the_check(tmp_path: Path) -> None:
    path = tmp_path / "gpumux.db"
    migrated_with_rows(path)
    engine = make_engine(f"sqlite:///{path}")
    with engine.connect() as connection:
        assert make_sessions(engine).dialect.check_integrity(connection) == []
    upgrade(engine)
    engine.dispose()


def test_a_damaged_index_is_refused_with_the_path_what_and_what_to_do(tmp_path: Path) -> None:
    path = tmp_path / "gpumux.db"
    migrated_with_rows(path)
    damage(path, "ix_trials_status_id")
    message = refusal(path)
    assert message.startswith(f"{path} is damaged (quick_check: "), message
    assert "Page " in message and "\n" not in message, message
    assert "backup" in message and f"sqlite3 {path} .recover | sqlite3 " in message, message


@pytest.mark.parametrize("name", ["trials", "ix_trials_sweep_id_number"])
def test_a_page_too_damaged_to_walk_is_refused_as_damaged(tmp_path: Path, name: str) -> None:
    path = tmp_path / "gpumux.db"
    migrated_with_rows(path)
    damage(path, name)
    message = refusal(path)
    assert message.startswith(f"{path} is damaged (quick_check: "), message
    assert ".recover" in message, message


def test_a_truncated_database_is_refused_as_damaged(tmp_path: Path) -> None:
    path = tmp_path / "gpumux.db"
    migrated_with_rows(path)
    os.truncate(path, path.stat().st_size // 2)
    message = refusal(path)
    assert message.startswith(f"{path} is damaged"), message


def test_a_file_that_is_not_a_database_says_so_and_what_to_do(tmp_path: Path) -> None:
    path = tmp_path / "gpumux.db"
    path.write_bytes(b"\x00not a database\xff" * 500)
    message = refusal(path)
    assert message.startswith(f"{path} cannot be opened as a database"), message
    assert "--db" in message and "backup" in message, message


@pytest.mark.skipif(shutil.which("sqlite3") is None, reason="needs the sqlite3 command")
def test_the_recovery_the_refusal_gives_yields_a_database_gpumux_starts_on(
    tmp_path: Path,
) -> None:
    path = tmp_path / "gpumux.db"
    migrated_with_rows(path)
    damage(path, "ix_trials_status_id")
    message = refusal(path)
    recover = message[message.index("`") + 1 : message.index("` (")]
    recovered = message.rsplit("GPUMUX_DB=", 1)[1]
    assert recovered == str(tmp_path / "gpumux.recovered.db")
    subprocess.run(recover, shell=True, check=True, capture_output=True)
    if not tables_in(recovered):
        # Some builds of the sqlite3 shell (Debian's 3.40) lack what .recover needs.
        subprocess.run(recover.replace(" .recover ", " .dump "), shell=True, check=True)
    engine = make_engine(f"sqlite:///{recovered}")
    upgrade(engine)
    with make_sessions(engine).read() as session:
        assert len(session.scalars(select(Trial.id)).all()) == TRIALS
    engine.dispose()


def tables_in(path: str) -> list[str]:
    with sqlite3.connect(path) as database:
        rows = database.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall()
    database.close()
    return [name for (name,) in rows]


def gpumux(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The real command line on the database in `home`, with no daemon running."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUMUX_")}
    return subprocess.run(
        [sys.executable, "-m", "gpumux", *args],
        env={**env, "GPUMUX_HOME": str(home)},
        cwd=home,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize(
    "args", [("serve",), ("sweep", "x=1,2", "--", "true")], ids=["serve", "sweep"]
)
def test_serve_and_the_embedded_daemon_refuse_a_damaged_database_in_one_line(
    tmp_path: Path, args: tuple[str, ...]
) -> None:
    home = tmp_path / "home"
    migrated_with_rows(home / "gpumux.db")
    damage(home / "gpumux.db", "ix_trials_status_id")
    done = gpumux(home, *args)
    assert done.returncode == 1, done
    assert "Traceback" not in done.stdout + done.stderr, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, done.stderr
    assert errors[0].startswith(f"error: {home / 'gpumux.db'} is damaged"), errors
    assert not (home / "gpumux.sock").exists()


def test_health_answers_503_with_a_problem_when_the_database_is_damaged_after_start(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    path = home / "gpumux.db"
    migrated_with_rows(path)
    settings = Settings(home=home, url=f"unix:{home / 'gpumux.sock'}")
    transport = httpx.HTTPTransport(uds=str(home / "gpumux.sock"))
    with embedded(settings), httpx.Client(transport=transport, base_url="http://x") as client:
        assert client.get("/health").status_code == 200
        damage(path, "ix_trials_status_id")
        damage(path, "trials")
        # Another writer: the daemon's connections drop the pages they cached before.
        with sqlite3.connect(path) as other:
            other.execute("PRAGMA user_version = 1")
        other.close()
        answer = client.get("/health")
    assert answer.status_code == 503, answer.text
    assert set(answer.json()) == {"detail", "errors"}
    assert answer.json()["errors"] == []
    assert answer.json()["detail"].startswith(f"the database {path} cannot be read (database "), (
        answer.json()
    )


def test_health_documents_its_503_as_a_problem(tmp_path: Path) -> None:
    with embedded(Settings(home=tmp_path / "home")) as daemon:
        transport = httpx.HTTPTransport(uds=daemon.url.removeprefix("unix:"))
        with httpx.Client(transport=transport, base_url="http://x") as client:
            document = client.get("/openapi.json").json()
    answers = document["paths"]["/health"]["get"]["responses"]
    schema = answers["503"]["content"]["application/json"]["schema"]
    assert schema == {"$ref": "#/components/schemas/Problem"}


def test_a_daemon_refused_for_damage_leaves_no_lock_behind(tmp_path: Path) -> None:
    home = tmp_path / "home"
    migrated_with_rows(home / "gpumux.db")
    damage(home / "gpumux.db", "trials")
    settings = Settings(home=home)
    with pytest.raises(DaemonError, match="is damaged"):
        with embedded(settings):
            pass
    (home / "gpumux.db").unlink()
    with embedded(settings) as daemon:
        assert daemon.url == settings.url
