"""`gpumux serve --db`: an SQLite file (a relative one resolved against the current directory)
or the URL of a PostgreSQL database, taken as given."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
from ports import free_port
from test_cli import DEADLINE_S, cli_env, wait_for

from gpumux.storage.dialects import dialect_for


@contextmanager
def serving(db: str, *, cwd: Path) -> Iterator[tuple[dict[str, Any], Path]]:
    """`gpumux serve --db DB` as a real process run in `cwd`: its /health body once it answers,
    and its log; it must stop cleanly on SIGTERM."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = cli_env(home=cwd / "home", url=url)
    log_path = cwd / "serve.log"
    with open(log_path, "w") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "gpumux", "serve", "--port", str(port), "--db", db],
            env=env,
            cwd=cwd,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            with httpx.Client(base_url=url, timeout=5) as client:

                def healthy() -> httpx.Response | None:
                    assert process.poll() is None, log_path.read_text()
                    try:
                        answer = client.get("/health")
                    except httpx.TransportError:
                        return None
                    return answer if answer.status_code == 200 else None

                wait_for(f"gpumux serve to answer at {url}", healthy)
                health = client.get("/health")
                assert health.status_code == 200, health.text
                yield health.json(), log_path
        finally:
            process.send_signal(signal.SIGTERM)
            returncode = process.wait(timeout=DEADLINE_S)
    assert returncode == 0, log_path.read_text()


def test_serve_takes_a_postgresql_url_as_the_database(pg_database: str, tmp_path: Path) -> None:
    label = dialect_for(pg_database).label
    assert label.startswith("postgresql+psycopg://postgres@/gpumux_test_")
    with serving(pg_database, cwd=tmp_path) as (health, log):
        assert health["database"] == label
        assert f"(database {label})" in log.read_text()
    # Nothing was taken for a file under the current directory.
    assert sorted(path.name for path in tmp_path.iterdir()) == ["home", "serve.log"]


def test_serve_resolves_a_relative_database_file_against_the_current_directory(
    tmp_path: Path,
) -> None:
    with serving("state/gpumux.db", cwd=tmp_path) as (health, log):
        file = (tmp_path / "state" / "gpumux.db").resolve()
        assert health["database"] == str(file)
        assert f"(database {file})" in log.read_text()
    assert file.is_file()
