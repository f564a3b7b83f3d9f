"""The `gpumux` command line as a user runs it: real processes against a real `gpumux serve`."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from builders import daemon_token, terminal_signals
from ports import free_port

from gpumux.client import Client, DaemonUnreachable
from gpumux.config import Settings
from gpumux.schemas.sweeps import SweepCreate, SweepDetail
from gpumux.server.daemon import embedded
from gpumux.status import ObjectiveMode, SweepStatus, TrialStatus

FIXTURES = Path(__file__).parents[1] / "fixtures"
ECHO = str(FIXTURES / "echo_params.py")
REPORT = str(FIXTURES / "report_objective.py")
WAIT_FOR_FILE = str(FIXTURES / "wait_for_file.py")
BLOCK = str(FIXTURES / "block.py")
MAX_GRID = 50
DEADLINE_S = 60.0


def cli_env(*, home: Path, url: str, **extra: str) -> dict[str, str]:
    """The environment of a user whose gpumux lives in `home` and talks to `url`."""
    env = {name: value for name, value in os.environ.items() if not name.startswith("GPUMUX_")}
    # Wide, so that table rows stay on one line each in what the tests read. --split auto
    # means the configured default N here: these tests are about the CLI, not the split search.
    env.update(
        GPUMUX_HOME=str(home), GPUMUX_URL=url, COLUMNS="200", GPUMUX_SPLIT_SEARCH="0", **extra
    )
    return env


def gpumux(
    *args: str, env: dict[str, str], cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpumux", *args],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=DEADLINE_S * 2,
    )


def start_gpumux(*args: str, env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "gpumux", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=terminal_signals,
    )


def wait_for(condition: str, check: object) -> None:
    """Poll `check()` until it is true, for at most DEADLINE_S."""
    assert callable(check)
    deadline = time.monotonic() + DEADLINE_S
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {condition}")
        time.sleep(0.05)


def wait_ended(client: Client, sweep_id: int) -> SweepDetail:
    wait_for(
        f"sweep {sweep_id} to end",
        lambda: client.get_sweep(sweep_id).status in (SweepStatus.finished, SweepStatus.cancelled),
    )
    return client.get_sweep(sweep_id)


def wait_running(client: Client, sweep_id: int, count: int) -> None:
    wait_for(
        f"{count} running trials in sweep {sweep_id}",
        lambda: client.get_sweep(sweep_id).counts.get(TrialStatus.running, 0) == count,
    )


@dataclass
class Server:
    url: str
    db: Path
    env: dict[str, str]
    root: Path


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """`gpumux serve` as a real process on a free port, with a fresh database."""
    root = tmp_path_factory.mktemp("cli")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = cli_env(home=root / "home", url=url, GPUMUX_MAX_GRID=str(MAX_GRID), GPUMUX_KILL_GRACE="5")
    db = root / "data" / "gpumux.db"
    with open(root / "serve.log", "w") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "gpumux", "serve", "--port", str(port), "--db", str(db)],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            with Client(url, timeout=5) as client:
                wait_for(f"gpumux serve to answer at {url}", lambda: _answers(client, process))
            yield Server(url=url, db=db, env=env, root=root)
        finally:
            process.send_signal(signal.SIGTERM)
            returncode = process.wait(timeout=DEADLINE_S)
    assert returncode == 0, (root / "serve.log").read_text()


def _answers(client: Client, process: subprocess.Popen[bytes]) -> bool:
    assert process.poll() is None, "gpumux serve exited before it answered"
    try:
        return client.health().status == "ok"
    except DaemonUnreachable:
        return False


@pytest.fixture
def client(server: Server) -> Iterator[Client]:
    with Client(server.url, timeout=10, token=daemon_token(server.root / "home")) as api:
        yield api


def submit(client: Client, workdir: Path, command: list[str], *params: str) -> SweepDetail:
    """A sweep submitted over HTTP, for tests about the commands that come after `sweep`."""
    return client.create_sweep(
        SweepCreate(
            params=list(params), command=command, workdir=str(workdir), env=dict(os.environ)
        )
    )


def row(output: str, text: str) -> str:
    """The one line of `output` that contains `text`."""
    lines = [line for line in output.splitlines() if text in line]
    assert len(lines) == 1, f"{text!r} in {len(lines)} lines of:\n{output}"
    return lines[0]


def test_a_detached_sweep_is_stored_as_submitted(
    server: Server, client: Client, tmp_path: Path
) -> None:
    env = server.env | {"ECHO_MARKER": "from-the-submitter"}
    result = gpumux(
        "sweep", "x=1,2", "mode=fast", "--name", "echo", "--split", "2", "--detach",
        "--", sys.executable, ECHO, "--flag", "{x}",
        env=env, cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    found = re.fullmatch(r"sweep (\d+) \(echo\): 2 trials queued\n", result.stdout)
    assert found, result.stdout
    sweep = client.get_sweep(int(found.group(1)))
    assert sweep.name == "echo"
    assert sweep.command == [sys.executable, ECHO, "--flag", "{x}"]
    assert sweep.params == ["x=1,2", "mode=fast"]
    assert sweep.workdir == str(tmp_path)
    assert sweep.split == 2
    trials = client.all_trials(sweep.id)
    assert [t.params for t in trials] == [{"x": 1, "mode": "fast"}, {"x": 2, "mode": "fast"}]
    assert wait_ended(client, sweep.id).counts == {TrialStatus.succeeded: 2}
    log = client.get_log(trials[0].id, 0).data
    assert 'argv: ["--flag", "1", "--mode=fast"]' in log
    assert 'params: {"x": 1, "mode": "fast"}' in log
    assert f"cwd: {tmp_path}" in log
    assert "marker: from-the-submitter" in log

    logs = gpumux("logs", str(trials[1].id), env=server.env)
    assert logs.returncode == 0, logs.stderr
    assert 'argv: ["--flag", "2", "--mode=fast"]' in logs.stdout


def test_following_a_sweep_ends_with_the_ranked_table(
    server: Server, client: Client, tmp_path: Path
) -> None:
    result = gpumux(
        "sweep", "x=1..4", "--objective", "loss:min", "--", sys.executable, REPORT,
        env=server.env, cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    first, *rest = result.stdout.splitlines()
    found = re.fullmatch(r"sweep (\d+): 4 trials queued", first)
    assert found, result.stdout
    sweep_id = int(found.group(1))
    out = "\n".join(rest)
    assert re.search(r"\[\d/4\] trial \d+ x=3: failed .*boom: x=3 is too large", out), out
    # Each new best is a line once its trial has ended; the last one is the winner.
    news = [line for line in rest if line.startswith("best so far: ")]
    assert re.fullmatch(r"best so far: trial \d+  x=2  loss=0", news[-1]), out
    assert f"sweep {sweep_id} finished after" in out
    assert "3 succeeded, 1 failed" in out
    # Best first by loss = (x - 2)**2; the failed trial, with no loss, last.
    table = [line for line in rest if line.startswith("│")]
    assert [line.split("│")[2].strip() for line in table] == ["2", "1", "4", "3"]
    assert "400.0" in table[0]
    assert "exited with code 1: boom: x=3 is too large" in table[3]
    best_line = row(out, "best: trial")
    assert re.fullmatch(r"best: trial \d+  x=2  loss=0", best_line), best_line

    best = gpumux("best", str(sweep_id), env=server.env)
    assert best.returncode == 0, best.stderr
    assert re.match(rf"trial \d+ of sweep {sweep_id}: loss=0 \(min of 4 finished", best.stdout)
    assert "\n  x=2\n" in best.stdout
    assert best.stdout.rstrip().endswith(f"{REPORT} --x=2")
    as_json = json.loads(gpumux("best", str(sweep_id), "--json", env=server.env).stdout)
    assert as_json["params"] == {"x": 2}
    assert as_json["objective"] == {"loss": 0.0, "mode": "min"}

    show = gpumux("show", str(sweep_id), env=server.env)
    assert show.returncode == 0, show.stderr
    assert "3 succeeded, 1 failed" in show.stdout
    assert re.search(r"trial \d+ \(x=3\) failed: exited with code 1\n", show.stdout)
    assert "training with x=3" in show.stdout
    assert "boom: x=3 is too large" in show.stdout


def test_piped_follow_estimates_the_time_left_once_a_trial_has_ended(
    server: Server, tmp_path: Path
) -> None:
    flags = tmp_path / "go{x}"
    follower = start_gpumux(
        "sweep", "x=1,2", "--split", "1", "--", sys.executable, WAIT_FOR_FILE, str(flags),
        env=server.env,
    )  # fmt: skip
    assert follower.stdout is not None
    lines = []
    for line in follower.stdout:
        lines.append(line)
        if re.match(r"\[0/2\] trial \d+ x=1: running", line):
            (tmp_path / "go1").touch()
        if line.startswith("[1/2]"):
            break
    assert not any("ETA" in line for line in lines[:-1]), lines
    assert re.fullmatch(r"\[1/2\] trial \d+ x=1: succeeded \(after .*\); ETA \d.*\n", lines[-1])
    (tmp_path / "go2").touch()
    rest, errors = follower.communicate(timeout=DEADLINE_S)
    assert follower.returncode == 0, errors
    last = row(rest, "[2/2]")
    assert re.fullmatch(r"\[2/2\] trial \d+ x=2: succeeded \(after [^)]*\)", last), last


def test_a_sweep_whose_trials_all_fail_exits_1(server: Server, tmp_path: Path) -> None:
    result = gpumux("sweep", "x=3", "--", sys.executable, REPORT, env=server.env, cwd=tmp_path)
    assert result.returncode == 1
    assert "finished after" in result.stdout
    assert "1 failed" in result.stdout


CMD = ["--", "python", "t.py"]
NO_COMMAND = "no command: write gpumux sweep PARAMS -- COMMAND, e.g. gpumux sweep lr=1e-3..1e-1"


@pytest.mark.parametrize(
    ("args", "messages"),
    [
        (["lr=1e-3...1e-1", *CMD], ["lr=1e-3...1e-1:", "two dots: lr=1e-3..1e-1"]),
        (["lr=", *CMD], ["lr=: no value; expected name=value"]),
        (["=3", *CMD], ["=3: no parameter name; expected name=value"]),
        (["lr=a..b", *CMD], ["lr=a..b: range ends must be numbers", "name=lo..hi"]),
        (["lr=1e-3..1e-1"], [NO_COMMAND]),
        (["lr=1e-3..1e-1", "--"], [NO_COMMAND]),
        (["x=1", "--", " "], ["the command's first word is empty"]),
        (["x=1..100", *CMD], ["the grid has 100 trials, over the limit of 50"]),
        (["x=1", "--objective", "loss", "--", "python"], ["objective", "METRIC:min or METRIC:max"]),
        (["x=1", "--split", "many", "--", "python"], ["--split many: expected a number"]),
        (["x=1", "--split", "0", "--", "python"], ["split must be 1..64 or 'auto'"]),
    ],
)  # fmt: skip
def test_bad_input_is_refused_with_its_message_and_changes_nothing(
    server: Server, client: Client, args: list[str], messages: list[str]
) -> None:
    before = client.list_sweeps().count
    result = gpumux("sweep", *args, env=server.env)
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("error: ")
    for message in messages:
        assert message in result.stderr
    assert "Traceback" not in result.stderr
    assert result.stdout == ""
    assert client.list_sweeps().count == before


def test_bad_parameters_are_refused_before_any_daemon_is_looked_for(tmp_path: Path) -> None:
    env = cli_env(home=tmp_path / "home", url=f"http://127.0.0.1:{free_port()}")
    result = gpumux("sweep", "lr=a..b", "--", "python", "t.py", env=env)
    assert result.returncode == 2
    assert "lr=a..b: range ends must be numbers" in result.stderr
    assert "embedded" not in result.stderr
    assert not (tmp_path / "home").exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["show", "999999"], "sweep 999999 not found"),
        (["cancel", "999999"], "sweep 999999 not found"),
        (["best", "999999"], "sweep 999999 not found"),
        (["logs", "999999"], "trial 999999 not found"),
    ],
)
def test_an_unknown_id_is_named_in_the_error(
    server: Server, client: Client, args: list[str], message: str
) -> None:
    before = client.list_sweeps().count
    result = gpumux(*args, env=server.env)
    assert result.returncode == 1
    assert result.stderr == f"error: {message}\n"
    assert client.list_sweeps().count == before


def test_a_sweep_is_found_by_its_name_the_newest_of_that_name_first(
    server: Server, client: Client, tmp_path: Path
) -> None:
    name = f"digits-{tmp_path.name}"
    older = client.create_sweep(
        SweepCreate(
            params=["x=1"],
            command=[sys.executable, REPORT],
            workdir=str(tmp_path),
            metric="loss",
            mode=ObjectiveMode.min,
            name=name,
        )
    )
    newer = client.create_sweep(
        SweepCreate(
            params=["x=2"],
            command=[sys.executable, REPORT],
            workdir=str(tmp_path),
            metric="loss",
            mode=ObjectiveMode.min,
            name=name,
        )
    )
    wait_ended(client, older.id)
    wait_ended(client, newer.id)

    show = gpumux("show", name, env=server.env)
    best = gpumux("best", name, "--json", env=server.env)
    by_id = gpumux("best", str(older.id), "--json", env=server.env)
    cancel = gpumux("cancel", name, env=server.env)
    missing = gpumux("show", "no-such-sweep", env=server.env)

    assert show.returncode == 0, show.stderr
    assert re.search(rf"\bsweep\b.*\b{newer.id}\b", show.stdout), show.stdout
    assert json.loads(best.stdout)["sweep"] == newer.id
    assert json.loads(by_id.stdout)["sweep"] == older.id
    quiet = gpumux("best", name, "-q", env=server.env)
    assert quiet.stdout == f"{json.loads(best.stdout)['trial']}\n", quiet.stderr
    assert cancel.stderr == f"gpumux: sweep {newer.id} already finished; nothing to cancel\n"
    assert missing.returncode == 1
    assert missing.stderr == "error: no sweep named 'no-such-sweep'; gpumux ls lists your sweeps\n"


def test_best_without_an_objective_says_how_to_get_one(
    server: Server, client: Client, tmp_path: Path
) -> None:
    sweep = submit(client, tmp_path, [sys.executable, ECHO], "x=1")
    result = gpumux("best", str(sweep.id), env=server.env)
    assert result.returncode == 1
    assert f"sweep {sweep.id} has no objective; submit it with --objective" in result.stderr
    wait_ended(client, sweep.id)


def test_logs_follow_prints_until_the_trial_ends(
    server: Server, client: Client, tmp_path: Path
) -> None:
    flag = tmp_path / "go"
    sweep = submit(client, tmp_path, [sys.executable, WAIT_FOR_FILE, str(flag)])
    trial = client.all_trials(sweep.id)[0]
    follower = start_gpumux("logs", "-f", str(trial.id), env=server.env)
    assert follower.stdout is not None
    for line in follower.stdout:
        if line == "first line\n":
            break
    assert follower.poll() is None, "logs -f returned before the trial ended"
    flag.touch()
    rest, errors = follower.communicate(timeout=DEADLINE_S)
    assert follower.returncode == 0, errors
    assert rest.splitlines()[-1] == "second line"


def test_cancel_stops_running_trials_and_waits_for_it(
    server: Server, client: Client, tmp_path: Path
) -> None:
    sweep = submit(client, tmp_path, [sys.executable, BLOCK], "x=1,2,3")
    wait_running(client, sweep.id, 2)
    result = gpumux("cancel", str(sweep.id), env=server.env)
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"sweep {sweep.id} cancelled: 3 cancelled\n"
    assert client.get_sweep(sweep.id).status == SweepStatus.cancelled
    assert {t.status for t in client.all_trials(sweep.id)} == {TrialStatus.cancelled}

    again = gpumux("cancel", str(sweep.id), "--no-wait", env=server.env)
    assert again.returncode == 0
    assert again.stdout == f"sweep {sweep.id} cancelled: 3 cancelled\n"


def test_ctrl_c_stops_following_but_not_the_sweep(
    server: Server, client: Client, tmp_path: Path
) -> None:
    follower = start_gpumux("sweep", "--", sys.executable, BLOCK, env=server.env)
    assert follower.stdout is not None
    found = re.fullmatch(r"sweep (\d+): 1 trial queued\n", follower.stdout.readline())
    assert found
    sweep_id = int(found.group(1))
    wait_running(client, sweep_id, 1)
    follower.send_signal(signal.SIGINT)
    _, errors = follower.communicate(timeout=DEADLINE_S)
    assert follower.returncode == 130
    assert f"stopped following; sweep {sweep_id} continues on {server.url}" in errors
    assert f"gpumux cancel {sweep_id}" in errors
    assert client.get_sweep(sweep_id).counts == {TrialStatus.running: 1}
    client.cancel_sweep(sweep_id)
    assert wait_ended(client, sweep_id).status == SweepStatus.cancelled


def test_ls_show_and_devices(server: Server, client: Client, tmp_path: Path) -> None:
    sweep = submit(client, tmp_path, [sys.executable, ECHO], "x=1,2")
    wait_ended(client, sweep.id)
    listing = gpumux("ls", env=server.env)
    assert listing.returncode == 0, listing.stderr
    assert re.search(rf"│ +{sweep.id} │ .* finished +│ +2/2 │ 2 succeeded", listing.stdout)
    running_only = gpumux("ls", "--status", "running", env=server.env)
    assert f"│ {sweep.id} " not in running_only.stdout
    show = gpumux("show", str(sweep.id), env=server.env)
    assert show.returncode == 0, show.stderr
    assert "2 succeeded" in show.stdout
    assert f"{sys.executable} {ECHO}" in show.stdout
    assert "x=1,2" in show.stdout
    assert re.search(r"┃ trial ┃ x ┃ status", show.stdout), show.stdout
    assert re.search(r"│ +\d+ │ +2 │ succeeded", show.stdout), show.stdout
    followed = gpumux("show", str(sweep.id), "--follow", env=server.env)
    assert followed.returncode == 0, followed.stderr
    # Both run at once, so either may end first: each is told once, in the order they ended.
    ended = re.findall(r"^\[(\d)/2\] trial \d+ x=(\d): succeeded", followed.stdout, re.MULTILINE)
    assert [count for count, _ in ended] == ["1", "2"], followed.stdout
    assert sorted(x for _, x in ended) == ["1", "2"], followed.stdout
    assert "2 succeeded" in followed.stdout
    devices = gpumux("devices", env=server.env)
    assert devices.returncode == 0, devices.stderr
    assert row(devices.stdout, "│ cpu ")


def test_serve_refuses_a_second_daemon_on_the_same_database(server: Server) -> None:
    port = str(free_port())
    result = gpumux("serve", "--port", port, "--db", str(server.db), env=server.env)
    assert result.returncode == 1
    assert "another gpumux daemon" in result.stderr
    assert server.url in result.stderr


def test_the_help_documents_the_exit_status(server: Server) -> None:
    result = gpumux("sweep", "--help", env=server.env)
    assert result.returncode == 0
    assert "at least one trial succeeded" in " ".join(result.stdout.split())


def test_with_no_daemon_a_sweep_runs_on_an_embedded_one(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    home = tmp_path / "home"
    env = cli_env(home=home, url=url)
    result = gpumux("sweep", "x=1,2", "--", sys.executable, ECHO, env=env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert (
        f"no daemon at {url}; running an embedded one on {home / 'gpumux.db'} "
        "until the queue is empty"
    ) in " ".join(result.stderr.split())
    assert "finished after" in result.stdout
    assert "2 succeeded" in result.stdout
    assert (home / "gpumux.db").exists()
    with Client(url, timeout=5) as api, pytest.raises(DaemonUnreachable):
        api.health()


def test_preload_is_stored_with_the_sweep_whose_trials_run_as_ever(tmp_path: Path) -> None:
    home = tmp_path / "home"
    env = cli_env(home=home, url=f"http://127.0.0.1:{free_port()}", GPUMUX_PRELOAD="numpy")
    result = gpumux(
        "sweep", "x=1,2", "--preload", "--", sys.executable, ECHO, env=env, cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr
    assert "2 succeeded" in result.stdout
    with contextlib.closing(sqlite3.connect(home / "gpumux.db")) as db:
        assert db.execute("SELECT preload FROM sweeps").fetchall() == [(1,)]


def test_the_embedded_daemon_waits_for_the_sweeps_of_others(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    env = cli_env(home=tmp_path / "home", url=url)
    mine, theirs = tmp_path / "mine", tmp_path / "theirs"
    owner = start_gpumux("sweep", "--", sys.executable, WAIT_FOR_FILE, str(mine), env=env)
    assert owner.stdout is not None and owner.stderr is not None
    assert owner.stdout.readline() == "sweep 1: 1 trial queued\n"
    other = gpumux("sweep", "--detach", "--", sys.executable, WAIT_FOR_FILE, str(theirs), env=env)
    assert other.returncode == 0, other.stderr
    assert other.stdout == "sweep 2: 1 trial queued\n"
    mine.touch()
    for line in owner.stderr:
        if "trials of other sweeps are queued or running" in line:
            break
    assert owner.poll() is None, "the embedded daemon stopped under another user's sweep"
    with Client(url, timeout=10, token=daemon_token(tmp_path / "home")) as api:
        assert api.get_sweep(1).status == SweepStatus.finished
        theirs.touch()
        assert wait_ended(api, 2).counts == {TrialStatus.succeeded: 1}
    _, errors = owner.communicate(timeout=DEADLINE_S)
    assert owner.returncode == 0, errors


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_ctrl_c_kill_or_hangup_with_an_embedded_daemon_requeues_the_trials(
    tmp_path: Path, signum: signal.Signals
) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    env = cli_env(home=tmp_path / "home", url=url, GPUMUX_KILL_GRACE="5")
    follower = start_gpumux("sweep", "--", sys.executable, BLOCK, env=env)
    assert follower.stdout is not None
    assert follower.stdout.readline() == "sweep 1: 1 trial queued\n"
    with Client(url, timeout=10, token=daemon_token(tmp_path / "home")) as api:
        wait_running(api, 1, 1)
    follower.send_signal(signum)
    _, errors = follower.communicate(timeout=DEADLINE_S)
    assert follower.returncode == 130
    assert "requeues them; they resume with the next gpumux sweep or gpumux serve" in " ".join(
        errors.split()
    )
    # The next gpumux finds the trial queued again, on its second attempt.
    settings = Settings(home=tmp_path / "home", url=url)
    with (
        embedded(settings) as running,
        Client(running.url, timeout=10, token=daemon_token(tmp_path / "home")) as api,
    ):
        trial = api.all_trials(1)[0]
        assert trial.attempt == 2
        assert trial.status in (TrialStatus.queued, TrialStatus.starting, TrialStatus.running)
        api.cancel_sweep(1)
        assert wait_ended(api, 1).status == SweepStatus.cancelled


def test_detach_needs_a_running_daemon(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    env = cli_env(home=tmp_path / "home", url=url)
    result = gpumux("sweep", "x=1", "--detach", "--", sys.executable, ECHO, env=env)
    assert result.returncode == 1
    assert f"no gpumux daemon answers at {url}" in result.stderr
    assert "--detach needs a running daemon" in result.stderr
    assert not (tmp_path / "home" / "gpumux.db").exists()


def test_a_token_file_other_users_can_read_is_refused_with_the_fix(tmp_path: Path) -> None:
    env = cli_env(
        home=tmp_path / "home",
        url=f"http://127.0.0.1:{free_port()}",
        XDG_CONFIG_HOME=str(tmp_path / "config"),
    )
    token = tmp_path / "config" / "gpumux" / "token"
    token.parent.mkdir(parents=True)
    token.write_text("gmx_secret\n")
    token.chmod(0o644)
    result = gpumux("ls", env=env)
    assert result.returncode == 1
    assert f"run `chmod 600 {token}`" in " ".join(result.stderr.split())
    assert "Traceback" not in result.stderr
