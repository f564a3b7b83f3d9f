"""What a person reads, as the CLI prints it at a fixed width through a real `gpumux serve`:
pruned trials in one phrase, one line per trial, steps from 1, short floats, slots, learning
curves, help without typer's labels, the daemon's address said once."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import typer
from builders import daemon_token
from ports import free_port
from test_cli import cli_env, gpumux, row, start_gpumux, wait_for, wait_running

from gpumux.cli.app import app
from gpumux.client import Client, DaemonUnreachable

STEPPER = str(Path(__file__).parents[1] / "fixtures" / "stepper.py")
BLOCK = str(Path(__file__).parents[1] / "fixtures" / "block.py")
# A trial that reports its lr as its loss, at one step.
REPORT_LR = (
    "import json, os; lr = json.loads(os.environ['GPUMUX_PARAMS'])['lr']; "
    "print('GPUMUX_REPORT ' + json.dumps({'step': 0, 'loss': lr}), flush=True)"
)
# typer's type labels and number ranges, which a user does not type.
TYPE_LABELS = re.compile(r"<(bool|str|int|float|path|list|int range|float range)[^>]*>|<=x|x>=")


@dataclass
class Daemon:
    url: str
    env: dict[str, str]
    home: Path


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    """`gpumux serve` on a free port; the CLI's output 120 columns wide unless a test says."""
    root = tmp_path_factory.mktemp("glance")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = cli_env(home=root / "home", url=url, GPUMUX_KILL_GRACE="5") | {"COLUMNS": "120"}
    process = start_gpumux("serve", "--port", str(port), env=env)
    try:
        with Client(url, timeout=5) as client:
            wait_for("gpumux serve to answer", lambda: _answers(client, process))
        yield Daemon(url=url, env=env, home=root / "home")
    finally:
        process.send_signal(signal.SIGTERM)
        process.communicate(timeout=60)


def _answers(client: Client, process: subprocess.Popen[str]) -> bool:
    assert process.poll() is None, "gpumux serve exited before it answered"
    try:
        return client.health().status == "ok"
    except DaemonUnreachable:
        return False


def table_rows(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.startswith("│")]


def table(output: str) -> list[dict[str, str]]:
    """The rows of the table in `output`, each cell by its column's header."""
    header = [cell.strip() for cell in row(output, "┃ trial").split("┃")[1:-1]]
    return [
        dict(zip(header, (cell.strip() for cell in line.split("│")[1:-1]), strict=True))
        for line in table_rows(output)
    ]


@dataclass
class Pruned:
    """A finished sweep with a pruned trial, as `gpumux sweep` printed it 120 columns wide."""

    out: str
    sweep_id: int
    trial_id: int


@pytest.fixture(scope="module")
def pruned(daemon: Daemon, tmp_path_factory: pytest.TempPathFactory) -> Pruned:
    # x=1 and x=0.5 run their 5 steps; x=50 is a slow loser the median pruner stops at its
    # first step, by which time it has reported more (the daemon reads reports once a tick).
    folder = tmp_path_factory.mktemp("stepper")
    result = gpumux(
        "sweep", "x=1,50,0.5", "--split", "1", "--objective", "loss:min",
        "--prune", "median:n_startup_trials=1", "--", sys.executable, STEPPER, str(folder),
        env=daemon.env, cwd=folder,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    out = result.stdout
    loser = row(out, "x=50: pruned")
    return Pruned(out=out, sweep_id=int(out.split()[1].rstrip(":")), trial_id=int(loser.split()[2]))


def test_a_pruned_trials_line_says_in_one_phrase_where_it_lost(pruned: Pruned) -> None:
    line = row(pruned.out, "x=50: pruned")
    # The step that lost counted from 1, of the 5 a whole trial runs, the pruner, the losing
    # value, and where the trial was when it stopped; no parenthesis inside another.
    assert re.fullmatch(
        r"\[\d/3\] trial \d+ x=50: pruned at step 1 of 5 by median: loss 50 "
        r"\((stopped at step \d+, )?after \d+\.\ds\)(; ETA .*)?",
        line,
    ), line
    stopped = re.search(r"stopped at step (\d+)", line)
    assert stopped is None or int(stopped.group(1)) > 1
    assert "pruner (" not in pruned.out


def test_the_final_table_keeps_each_trial_to_one_line(pruned: Pruned) -> None:
    assert len(table_rows(pruned.out)) == 3, pruned.out
    assert all(len(line) <= 120 for line in pruned.out.splitlines()), pruned.out
    by_x = {cells["x"]: cells for cells in table(pruned.out)}
    assert by_x["50"]["reason"].startswith("at step 1 by median"), pruned.out


def test_steps_are_counted_from_one(pruned: Pruned) -> None:
    # The stepper reports steps 0 to 4 (the API's): the user reads "step 5 of 5".
    assert re.search(r"x=1: succeeded \(after [\d.]+s, step 5 of 5, loss=", pruned.out), pruned.out
    assert "step 0" not in pruned.out
    by_x = {cells["x"]: cells for cells in table(pruned.out)}
    assert (by_x["1"]["step"], by_x["0.5"]["step"]) == ("5", "5"), pruned.out
    # Where the loser stopped depends on how many steps the daemon read before it judged
    # step 1 (none more on a busy host): counted from 1, it is at least 1.
    assert by_x["50"]["status"] == "pruned" and int(by_x["50"]["step"]) >= 1, pruned.out


def test_slots_are_named_as_slots(pruned: Pruned) -> None:
    # Whether the follower sees a trial running depends on the host's pace (test_follow.py
    # checks the line itself); every running line it printed names the slot.
    running = re.findall(r": running.*$", pruned.out, re.MULTILINE)
    assert all(re.fullmatch(r": running in slot cpu/\d+", line) for line in running), running
    header = row(pruned.out, "┃ trial")
    assert "┃ slot " in header and "device" not in header, header
    assert {cells["slot"] for cells in table(pruned.out)} == {"cpu/0"}


def test_show_trial_gives_the_whole_reason_in_the_users_steps(
    daemon: Daemon, pruned: Pruned
) -> None:
    whole = gpumux("show", "--trial", str(pruned.trial_id), env=daemon.env)
    assert whole.returncode == 0, whole.stderr
    assert re.search(
        r"^reason +pruned at step 1 by the median:n_startup_trials=1 pruner: loss 50 at that "
        r"step *$",
        whole.stdout,
        re.MULTILINE,
    ), whole.stdout
    assert re.search(r"^  x +50 *$", whole.stdout, re.MULTILINE), whole.stdout


@pytest.mark.parametrize("columns", [100, 120])
def test_show_draws_the_learning_curves_at_the_terminals_width(
    daemon: Daemon, pruned: Pruned, columns: int
) -> None:
    shown = gpumux("show", str(pruned.sweep_id), env=daemon.env | {"COLUMNS": str(columns)})
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert "lower is better" in row(shown.stdout, "loss against step")
    curves = [line for line in lines if re.match(r" *trial \d+ [▁▂▃▄▅▆▇█ ]+ ", line)]
    assert len(curves) == 3, shown.stdout
    # The best first and marked, the pruned one marked, every line within the width.
    assert curves[0].endswith("◀ best") and "x=0.5" in row(shown.stdout, "best: trial")
    marked = [line for line in curves if line.endswith("pruned")]
    assert marked == [row(shown.stdout, f"trial {pruned.trial_id} ")], shown.stdout
    assert all(len(line) <= columns for line in lines), shown.stdout
    assert len(table_rows(shown.stdout)) == 3


def test_show_draws_no_curve_when_no_trial_reported_a_step(daemon: Daemon, tmp_path: Path) -> None:
    ran = gpumux(
        "sweep", "x=1", "--objective", "loss:min", "--", sys.executable, "-c", "pass",
        env=daemon.env, cwd=tmp_path,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    shown = gpumux("show", ran.stdout.split()[1].rstrip(":"), env=daemon.env)
    assert shown.returncode == 0, shown.stderr
    assert "against step" not in shown.stdout and "Traceback" not in shown.stderr
    assert len(table_rows(shown.stdout)) == 1


def test_float_parameters_print_short_enough_to_tell_apart(daemon: Daemon, tmp_path: Path) -> None:
    values = ["0.07976438287373289", "0.00014118578563194437", "0.0123456", "0.0123499", "0.5"]
    result = gpumux(
        "sweep", "lr=" + ",".join(values), "--objective", "loss:min", "--split", "2",
        "--", sys.executable, "-c", REPORT_LR,
        env=daemon.env, cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    out = result.stdout
    shown = set(re.findall(r"lr=(\S+): succeeded", out))
    # Three significant digits, five where two values need them to differ, short ones as given.
    assert shown == {"0.0798", "0.000141", "0.012346", "0.01235", "0.5"}, out
    assert {cells["lr"] for cells in table(out)} == shown, out
    assert re.search(r"^best: trial \d+  lr=0.000141  loss=", out, re.MULTILINE), out
    # The exact values stay where a person copies them from: best and show --trial.
    sweep_id = int(out.split()[1].rstrip(":"))
    best = gpumux("best", str(sweep_id), env=daemon.env)
    assert "\n  lr=0.00014118578563194437\n" in best.stdout, best.stdout
    as_json = json.loads(gpumux("best", str(sweep_id), "--json", env=daemon.env).stdout)
    assert as_json["params"] == {"lr": 0.00014118578563194437}
    trial_id = int(row(out, "lr=0.0798: succeeded").split()[2])
    whole = gpumux("show", "--trial", str(trial_id), env=daemon.env)
    assert re.search(r"^  lr +0\.07976438287373289 *$", whole.stdout, re.MULTILINE), whole.stdout


def test_devices_names_the_slot_of_each_trial(daemon: Daemon, tmp_path: Path) -> None:
    submitted = gpumux(
        "sweep", "x=1,2", "--split", "2", "--detach", "--", sys.executable, BLOCK,
        env=daemon.env, cwd=tmp_path,
    )  # fmt: skip
    assert submitted.returncode == 0, submitted.stderr
    sweep_id = int(submitted.stdout.split()[1].rstrip(":"))
    with Client(daemon.url, timeout=10, token=daemon_token(daemon.home)) as client:
        wait_running(client, sweep_id, 2)
        trials = sorted(client.all_trials(sweep_id), key=lambda trial: trial.slot or 0)
        try:
            shown = gpumux("devices", env=daemon.env | {"COLUMNS": "100"})
        finally:
            client.cancel_sweep(sweep_id)
    assert shown.returncode == 0, shown.stderr
    assert "slots: trial in each" in row(shown.stdout, "┃ device")
    expected = ", ".join(f"cpu/{t.slot}: {t.id}" for t in trials)
    assert expected in row(shown.stdout, "│ cpu "), shown.stdout


def command_paths() -> list[list[str]]:
    """Every command of the CLI (and gpumux itself), as a user types it before --help."""
    paths: list[list[str]] = [[]]
    groups: list[tuple[list[str], object]] = [([], typer.main.get_command(app))]
    while groups:
        words, group = groups.pop()
        for name, command in getattr(group, "commands", {}).items():
            paths.append([*words, name])
            groups.append(([*words, name], command))
    return paths


@pytest.mark.parametrize("words", command_paths(), ids=lambda words: " ".join(words) or "gpumux")
def test_help_names_values_without_typers_type_labels(words: list[str], tmp_path: Path) -> None:
    env = cli_env(home=tmp_path / "home", url=f"http://127.0.0.1:{free_port()}")
    env["COLUMNS"] = "100"
    result = gpumux(*words, "--help", env=env)
    assert result.returncode == 0, result.stderr
    assert not TYPE_LABELS.search(result.stdout), result.stdout
    usage = row(result.stdout, "Usage: gpumux")
    # Arguments by their metavars (SWEEP, USER), not the function's parameter names.
    assert not re.search(r"[\[{][a-z_]+[\]}]", usage), usage


def test_show_help_names_its_arguments_as_the_user_writes_them(tmp_path: Path) -> None:
    env = cli_env(home=tmp_path / "home", url=f"http://127.0.0.1:{free_port()}")
    env["COLUMNS"] = "100"
    result = gpumux("show", "--help", env=env)
    assert "Usage: gpumux show [OPTIONS] [SWEEP]" in result.stdout
    assert re.search(r"--trial +TRIAL ", result.stdout) and re.search(r"--url +URL ", result.stdout)
    assert re.search(r"│ +--all +every trial", result.stdout), result.stdout


def test_serve_says_where_it_serves_once(tmp_path: Path) -> None:
    port = free_port()
    env = cli_env(home=tmp_path / "home", url=f"http://127.0.0.1:{port}")
    process = subprocess.Popen(
        [sys.executable, "-m", "gpumux", "serve", "--port", str(port)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        with Client(f"http://127.0.0.1:{port}", timeout=5) as client:
            wait_for("gpumux serve to answer", lambda: _answers(client, process))
    finally:
        process.send_signal(signal.SIGTERM)
        output, _ = process.communicate(timeout=60)
    assert process.returncode == 0, output
    said = [line for line in output.splitlines() if "serving on" in line]
    assert len(said) == 1, output
    assert said[0].startswith(f"gpumux: serving on http://127.0.0.1:{port}")
