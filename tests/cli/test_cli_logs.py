"""`gpumux logs -f` follows a trial's output across the rotations of its log, in order."""

from __future__ import annotations

import sys
from pathlib import Path

from ports import free_port
from test_cli import cli_env, gpumux, start_gpumux

LINES = 3000


def chatty(flag: Path) -> str:
    """A trial that says it is ready, waits for `flag`, then prints about 60 kB of numbered
    lines over some 8 s: a 16 kB piece of log every 2 s, a follower polls every 0.5 s."""
    return (
        "import pathlib, time\n"
        "print('ready', flush=True)\n"
        f"while not pathlib.Path({str(flag)!r}).exists(): time.sleep(0.02)\n"
        f"for n in range({LINES}):\n"
        "    print(f'{n:06d} ' + 'x' * 13, flush=True)\n"
        "    if n % 20 == 0: time.sleep(0.05)\n"
    )


def test_logs_follow_reads_every_line_once_across_rotations(tmp_path: Path) -> None:
    port = free_port()
    env = cli_env(
        home=tmp_path / "home",
        url=f"http://127.0.0.1:{port}",
        GPUMUX_LOG_MAX_MB="0.016",
        GPUMUX_LOG_KEEP="1",
    )
    daemon = start_gpumux("serve", "--port", str(port), env=env)
    try:
        assert daemon.stdout is not None
        assert daemon.stdout.readline().startswith("gpumux: serving on")
        flag = tmp_path / "go"
        submitted = gpumux("sweep", "--detach", "--", sys.executable, "-c", chatty(flag), env=env)
        assert submitted.returncode == 0, submitted.stderr
        follower = start_gpumux("logs", "-f", "1", env=env)
        assert follower.stdout is not None
        for line in follower.stdout:
            if line == "ready\n":
                break
        flag.touch()
        followed, errors = follower.communicate(timeout=120)
        assert follower.returncode == 0, errors
    finally:
        daemon.terminate()
        daemon.communicate(timeout=60)
    numbers = [int(line[:6]) for line in followed.splitlines() if line[:6].isdigit()]
    assert "rotated away unread" not in followed
    assert numbers == list(range(LINES)), "every line once, in order"
    logs = tmp_path / "home" / "logs" / "sweep-1"
    assert (logs / "trial-1.1.log.1").exists(), "the log was rotated while it was followed"
