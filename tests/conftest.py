"""Shared fixtures: a migrated SQLite file per test, settings pointing into tmp_path, and a
throwaway PostgreSQL cluster for the tests that need one.

Each backend makes a database at head once per run, as a daemon does at start (make_engine,
then upgrade), into a template that each test's database copies: a file copy or CREATE
DATABASE ... TEMPLATE, without even the models' tables to create. The tests of the migrations
themselves (tests/storage/test_migrations.py) migrate their own databases with Alembic.
"""

from __future__ import annotations

import itertools
import os
import shutil
import signal
import tempfile
import time
from collections.abc import Generator, Iterator
from pathlib import Path

import httpx
import pytest
from builders import TEST_MARK, bearer, served
from postgres import (
    NO_QUERY,
    SQLITE_ONLY,
    Cluster,
    on_both_backends,
    statements_beyond_authentication,
    throwaway_cluster,
)

from gpumux.config import Settings
from gpumux.server.api import create_app
from gpumux.storage.dialects import dialect_for
from gpumux.storage.dialects.sqlite import SqliteDialect
from gpumux.storage.engine import Sessions, make_engine, make_sessions
from gpumux.storage.migrate import upgrade

FIXTURES = Path(__file__).parent / "fixtures"
# Set by .ci/run for the tests themselves (where the browser test leaves its screenshot).
FOR_THE_TESTS = {"GPUMUX_ARTIFACTS"}


@pytest.fixture(autouse=True)
def _no_gpumux_settings_of_the_developer(monkeypatch: pytest.MonkeyPatch) -> None:
    """A developer's own GPUMUX_* settings (their database, their daemon's URL) reach no test."""
    for name in list(os.environ):
        if name.startswith("GPUMUX_") and name not in FOR_THE_TESTS:
            monkeypatch.delenv(name)


@pytest.fixture(autouse=True)
def _gpus_hidden(monkeypatch: pytest.MonkeyPatch) -> None:
    """The host's GPUs reach no daemon or trial the tests start: expectations are written for
    the CPU device or a scripted NVML, on a GPU host too. The real-NVML tests make their probe
    themselves; a test that wants the host's GPUs through a daemon deletes the variable."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")


# How long what a test started may take to end on its own once the test is over.
LEFTOVER_GRACE_S = 5.0
_marks = itertools.count()


def pids() -> set[int]:
    """The pids of the processes now running."""
    return {int(name) for name in os.listdir("/proc") if name.isdigit()}


def marked(mark: str, among: set[int]) -> list[int]:
    """Those of `among` whose environment carries TEST_MARK=`mark` (an exited one is not)."""
    needle = f"{TEST_MARK}={mark}".encode()
    found = []
    for pid in among:
        try:
            with open(f"/proc/{pid}/environ", "rb") as environ:
                if needle in environ.read().split(b"\0"):
                    found.append(pid)
        except OSError:
            continue
    return found


@pytest.fixture(autouse=True)
def _no_process_left_behind(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """After each test, whatever it started and left running (a `gpumux sweep`, a supervisor, a
    trial; a failed test's above all) is killed, and the test errors saying so.

    Set up before the test's own fixtures and torn down after them: what they stop is not
    left over. What a module's or the session's fixtures start is theirs, unmarked (see
    WiderFixturesUnmarked). Only processes that started during the test are read: one running
    before cannot carry its mark.
    """
    mark = f"{os.getpid()}.{next(_marks)}"
    before = pids()
    monkeypatch.setenv(TEST_MARK, mark)
    yield
    deadline = time.monotonic() + LEFTOVER_GRACE_S
    while (left := marked(mark, pids() - before)) and time.monotonic() < deadline:
        time.sleep(0.05)
    if not left:
        return
    shown = {pid: kill_process(pid) for pid in left}
    pytest.fail(f"processes left running, now killed: {shown}", pytrace=False)


class WiderFixturesUnmarked:
    """A fixture wider than a test (the PostgreSQL cluster, a module's `gpumux serve`) starts
    its processes without the mark of the test that happens to set it up: they outlive it.

    A plugin of the whole run, not this conftest's hook: pytest asks only the session's plugins
    about session-scoped fixtures, and a conftest's hooks reach only the tests below it.
    """

    @pytest.hookimpl(wrapper=True)
    def pytest_fixture_setup(
        self, fixturedef: pytest.FixtureDef[object]
    ) -> Generator[None, object, object]:
        if fixturedef.scope == "function":
            return (yield)
        mark = os.environ.pop(TEST_MARK, None)
        try:
            return (yield)
        finally:
            if mark is not None:
                os.environ[TEST_MARK] = mark


def kill_process(pid: int) -> str:
    """SIGKILL `pid`; its command line, as it was."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            shown = cmdline.read().replace(b"\0", b" ").decode(errors="replace").strip()
        os.kill(pid, signal.SIGKILL)
    except (OSError, ProcessLookupError):
        return "(gone)"
    return shown


# Each worker starts on its own (imports, its PostgreSQL cluster, its migrated templates) and
# the slowest files, a minute or two each, bound what more workers gain; its directory
# (popen-gwN) lengthens the tests' Unix socket paths, 107 bytes at most, by a digit from gw10.
MAX_WORKERS = 8


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """The workers of `-n auto`: two per core this run may use (most tests wait on what they
    start, a daemon, its trials, PostgreSQL, more than they compute), MAX_WORKERS at most, at
    most one per test file named; none for a single file, which runs in this process."""
    files: set[Path] = set()
    for arg in config.args:
        path = config.invocation_params.dir / arg.split("::")[0]
        files |= {path} if path.is_file() else set(path.rglob("test_*.py"))
    workers = min(2 * len(os.sched_getaffinity(0)), MAX_WORKERS, len(files))
    return workers if len(files) > 1 else 0


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The slow tests first, in their order, then the rest: parallel workers start each of them
    at once instead of one worker running the last of them alone at the end."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(WiderFixturesUnmarked())
    config.addinivalue_line(
        "markers",
        f"{SQLITE_ONLY}(reason): a test of SQLite itself (query plans, pragmas, its file and "
        "lock), run on SQLite alone where a directory runs its tests on both backends",
    )
    config.addinivalue_line(
        "markers",
        f"{NO_QUERY}: requests answered before any query but their token's, run on SQLite alone "
        "where a directory runs its tests on both backends (a statement beyond fails the test)",
    )


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, None, None]:
    """A test marked no_query fails if its requests ran a statement beyond authenticating them:
    then it has a query to run on PostgreSQL too, and loses the mark."""
    if item.get_closest_marker(NO_QUERY) is None:
        return (yield)
    sessions = getattr(item, "funcargs", {}).get("sessions")
    if not isinstance(sessions, Sessions):
        pytest.fail(f"marked {NO_QUERY}: its statements are watched through `sessions`, not asked")
    with statements_beyond_authentication(sessions.engine) as found:
        result = yield
    if found:
        pytest.fail(f"marked {NO_QUERY}, yet ran {len(found)} statements: {found[0]}")
    return result


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    on_both_backends(metafunc, Path(__file__).parent)


@pytest.fixture
def short_tmp_path() -> Iterator[Path]:
    """A directory of the test's own with a short path, removed after it: for a Unix socket
    (107 bytes at most), too long below tmp_path where a parallel worker's directory
    (popen-gwN) lengthens it."""
    path = Path(tempfile.mkdtemp(prefix="gmx-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def backend() -> str:
    """The database behind `settings`: SQLite, unless the test is of a directory run on both
    (tests/postgres.py ON_BOTH_BACKENDS)."""
    return "sqlite"


@pytest.fixture
def settings(tmp_path: Path, backend: str, request: pytest.FixtureRequest) -> Settings:
    """Settings whose data directory is this test's own, over its own database: an SQLite file
    in that directory, or a fresh database on the throwaway PostgreSQL cluster."""
    home = tmp_path / "home"
    if backend == "postgresql":
        url = request.getfixturevalue("pg_migrated_database")
        return Settings(home=home, database_url=url, kill_grace=2.0, poll_interval=0.2)
    return Settings(home=home, kill_grace=2.0, poll_interval=0.2)


@pytest.fixture(scope="session")
def sqlite_migrated_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An SQLite file at head, made once per run, that each test's database copies."""
    path = tmp_path_factory.mktemp("template") / "gpumux.db"
    engine = make_engine(f"sqlite:///{path}")
    upgrade(engine)
    engine.dispose()
    # The last connection closed checkpoints the WAL into the file and removes it: the file
    # alone is the whole database.
    assert not path.with_name(f"{path.name}-wal").exists()
    return path


@pytest.fixture
def sessions(settings: Settings, request: pytest.FixtureRequest) -> Iterator[Sessions]:
    """Sessions over a database of its own at head (a copy of the migrated template)."""
    settings.home.mkdir(parents=True, exist_ok=True)
    dialect = dialect_for(settings.database_url)
    if isinstance(dialect, SqliteDialect):
        shutil.copyfile(request.getfixturevalue("sqlite_migrated_template"), dialect.file)
    # At head already: a copy of the template, file or database, is the template. Checking it
    # again as a daemon checks its database at start (upgrade) took 0.1 s of each of a thousand
    # tests; the daemons the tests start check theirs.
    engine = make_engine(settings.database_url)
    yield make_sessions(engine)
    engine.dispose()


@pytest.fixture
def api(settings: Settings, sessions: Sessions) -> Iterator[httpx.Client]:
    """A client of the API served by uvicorn on a real TCP socket (no scheduler behind it),
    carrying a token of the user running the tests."""
    app = create_app(settings=settings, sessions=sessions)
    with served(app, bearer(sessions)) as client:
        yield client


@pytest.fixture(scope="session")
def pg_cluster() -> Iterator[Cluster]:
    """One PostgreSQL server for the whole run, on a Unix socket (skips, saying why, without)."""
    yield from throwaway_cluster("gpumux-pg-")


@pytest.fixture
def pg_database(pg_cluster: Cluster) -> Iterator[str]:
    """The URL of a new, empty database on the throwaway cluster, dropped after the test."""
    name = pg_cluster.create_database()
    yield pg_cluster.url(name)
    pg_cluster.drop_database(name)


@pytest.fixture(scope="session")
def pg_migrated_template(pg_cluster: Cluster) -> str:
    """A database at head, made once per run, that each test's database copies."""
    name = pg_cluster.create_database()
    engine = make_engine(pg_cluster.url(name))
    upgrade(engine)
    engine.dispose()
    return name


@pytest.fixture
def pg_migrated_database(pg_cluster: Cluster, pg_migrated_template: str) -> Iterator[str]:
    """The URL of a new database already at head (a copy of the template), dropped after."""
    name = pg_cluster.create_database(template=pg_migrated_template)
    yield pg_cluster.url(name)
    pg_cluster.drop_database(name)
