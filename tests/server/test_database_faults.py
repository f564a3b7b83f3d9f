"""A daemon on a PostgreSQL server that cannot be used: `gpumux serve` says why in one line
and exits 1, before it serves anything (the server unreachable, the user refused, no such
database, a schema from a newer gpumux)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from ports import free_port
from postgres import Cluster
from sqlalchemy import text

from gpumux.storage.engine import make_engine
from gpumux.storage.migrate import upgrade

# Well past the connect timeout: a start that hangs on an unreachable server fails here.
DEADLINE_S = 60


def serve(home: Path, database: str) -> subprocess.CompletedProcess[str]:
    """`gpumux serve` on a free port over `database` (GPUMUX_DB), run until it exits."""
    env = {name: value for name, value in os.environ.items() if not name.startswith("GPUMUX_")}
    env.update(GPUMUX_HOME=str(home), GPUMUX_DB=database)
    return subprocess.run(
        [sys.executable, "-m", "gpumux", "serve", "--port", "0"],
        env=env,
        capture_output=True,
        text=True,
        timeout=DEADLINE_S,
    )


def refused(home: Path, database: str) -> str:
    """The one line `gpumux serve` exits 1 with, no traceback."""
    result = serve(home, database)
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


def closed_port() -> int:
    """A TCP port nothing listens on (bound, then released)."""
    return free_port()


def test_a_socket_directory_with_no_server_is_unreachable(tmp_path: Path) -> None:
    empty = tmp_path / "no-server"
    empty.mkdir()
    line = refused(tmp_path / "home", f"postgresql+psycopg://gpumux@/gpumux?host={empty}")
    assert f"cannot use PostgreSQL at {empty}:5432" in line, line
    assert "Check that the server runs and that this node reaches it" in line, line


def test_a_closed_port_is_unreachable(tmp_path: Path) -> None:
    port = closed_port()
    line = refused(tmp_path / "home", f"postgresql+psycopg://gpumux@127.0.0.1:{port}/gpumux")
    assert f"cannot use PostgreSQL at 127.0.0.1:{port}" in line and "refused" in line, line
    assert "Check that the server runs" in line, line


def test_a_wrong_password_says_the_user_was_refused(
    tmp_path: Path, pg_cluster: Cluster, pg_database: str
) -> None:
    role = f"gpumux_{os.getpid()}"
    with pg_cluster.connect() as admin:
        admin.execute(f"CREATE ROLE {role} LOGIN PASSWORD 'right-one'")
    try:
        database = pg_database.rsplit("/", 1)[1].split("?")[0]
        url = pg_cluster.url(database, user=role, password="wrong-one")
        line = refused(tmp_path / "home", url)
    finally:
        with pg_cluster.connect() as admin:
            admin.execute(f"DROP ROLE {role}")
    assert f"refused user {role}" in line, line
    assert "password" in line and "wrong-one" not in line, line


def test_a_database_that_does_not_exist_is_named_with_how_to_create_it(
    tmp_path: Path, pg_cluster: Cluster
) -> None:
    line = refused(tmp_path / "home", pg_cluster.url("no_such_database"))
    assert "has no database no_such_database" in line, line
    assert "createdb" in line, line


def test_a_database_from_a_newer_gpumux_is_refused(tmp_path: Path, pg_database: str) -> None:
    engine = make_engine(pg_database)
    upgrade(engine)
    with engine.begin() as connection:
        connection.execute(text("UPDATE alembic_version SET version_num = 'fffffffffff'"))
    engine.dispose()
    line = refused(tmp_path / "home", pg_database)
    assert "schema revision fffffffffff is newer than this gpumux knows" in line, line
