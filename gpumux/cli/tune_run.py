"""The rounds of `gpumux tune`: one sweep per N on its daemon, waited for with progress and
measured, each next N started up beside the one before and let compute as it ends (overlap.py)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.text import Text

from gpumux.cli import plot, render
from gpumux.cli.follow import sweep_ended
from gpumux.cli.overlap import Gate, all_exited, launch_split, out_of_memory
from gpumux.cli.rounds import Round, measure_round, seconds
from gpumux.cli.state import CliState
from gpumux.cli.tune_result import HostLoad, startup_s
from gpumux.client import Client
from gpumux.schemas.reports import ReportPublic
from gpumux.schemas.sweeps import SweepCreate, SweepDetail
from gpumux.schemas.trials import TrialPublic
from gpumux.status import ACTIVE_TRIAL_STATUSES, TrialStatus

POLL_S = 0.25
# How often the gates are looked at (files and processes, no request to the daemon): the
# device's idle time between two N.
WATCH_S = 0.02
ERRORS_SHOWN = 3


def _wait(
    state: CliState,
    client: Client,
    created: SweepDetail,
    split: int,
    load: HostLoad,
    watch: Callable[[], None] | None = None,
) -> None:
    """Show one progress line on a terminal until the sweep of this N ends; elsewhere a line
    when its trials all run. Samples the host's load meanwhile, and calls `watch` every
    WATCH_S (it launches and releases the next N)."""
    columns = (
        TextColumn(f"N={split}", style="bold"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[running]} running"),
        TextColumn("{task.fields[failed]} failed"),
        TimeElapsedColumn(),
    )
    sweep = created
    # Off a terminal the line after the round says it all; a transient bar would leave blanks.
    quiet = not state.out.is_terminal
    told = False
    with Progress(*columns, console=state.out, transient=True, disable=quiet) as progress:
        task = progress.add_task("", total=created.trial_count, running=0, failed=0)
        while not sweep_ended(sweep):
            polled = time.monotonic()
            while watch is not None and time.monotonic() - polled < POLL_S:
                watch()
                time.sleep(WATCH_S)
            if watch is None:
                time.sleep(POLL_S)
            sweep = client.get_sweep(created.id)
            counts = sweep.counts
            running = sum(counts.get(status, 0) for status in ACTIVE_TRIAL_STATUSES)
            load.sample(running)
            progress.update(
                task,
                completed=render.finished_count(counts),
                running=running,
                failed=counts.get(TrialStatus.failed, 0),
            )
            if quiet and not told and running + render.finished_count(counts) >= split:
                state.note(f"N={split}: {render.plural(running, 'trial')} running; measuring")
                told = True


def _reports(state: CliState, client: Client, trial: TrialPublic) -> list[ReportPublic]:
    """The trial's reports, as many as can be read."""
    reports = client.list_reports(trial.id)
    if reports.count > len(reports.data):
        state.note(
            f"trial {trial.id}: only {len(reports.data)} of its {reports.count} reports could "
            "be read; its samples are undercounted"
        )
    return reports.data


@dataclass
class Next:
    """An N to measure, and its sweep once started: the next one by the round before it."""

    sweep_in: SweepCreate
    launched: int
    # Where its trials wait, launched ahead (overlap.py); None: it runs as it starts.
    gate: Gate | None = None
    created: SweepDetail | None = None

    @property
    def split(self) -> int:
        return int(self.sweep_in.split)

    def start(self, state: CliState, client: Client) -> SweepDetail:
        """Submit its sweep under the split it is launched at, through its gate if any."""
        state.note(f"N={self.split}: starting {render.plural(self.sweep_in.trials or 1, 'trial')}")
        update: dict[str, object] = {"split": self.launched}
        if self.gate is not None:
            update["env"] = {**self.sweep_in.env, **self.gate.env}
        self.created = client.create_sweep(self.sweep_in.model_copy(update=update))
        return self.created


class Handover:
    """Launches the next N once every trial of this one is ready, and lets it compute as this
    one's last trial exits (see overlap.py)."""

    def __init__(
        self, state: CliState, client: Client, current: SweepDetail, gate: Gate, *,
        following: Next, gates: Path,
    ) -> None:  # fmt: skip
        self._state, self._client, self._current, self._gate = state, client, current, gate
        self._following, self._gates = following, gates
        self._pids: list[int | None] = []
        self._read_at = 0.0

    def __call__(self) -> None:
        following = self._following
        if following.created is None:
            if len(self._gate.ready()) >= self._current.trial_count:
                following.gate = Gate(self._gates / f"N={following.split}", closed=True)
                following.start(self._state, self._client)
            return
        if following.gate is None or following.gate.opened_at is not None:
            return
        if (None in self._pids or not self._pids) and time.monotonic() - self._read_at > POLL_S:
            self._read_at = time.monotonic()
            self._pids = [t.pid for t in self._client.all_trials(self._current.id)]
        if self._pids and all_exited(self._pids):
            following.gate.open()


def run_round(
    state: CliState,
    client: Client,
    current: Next,
    load: HostLoad,
    *,
    gates: Path,
    following: Next | None = None,
) -> tuple[Round, list[TrialPublic]]:
    """Submit the sweep of one N (unless the round before did), wait for it, and measure it;
    print its outcome in one line. With `following`, launch the next N's sweep through a
    closed gate once this one's trials are ready, and open it as they exit."""
    split = current.split
    if current.created is None:
        if current.launched != split:
            current.gate = Gate(gates / f"N={split}", closed=False)
        current.start(state, client)
    created = current.created
    assert created is not None
    watch = None
    if following is not None and current.gate is not None:
        watch = Handover(state, client, created, current.gate, following=following, gates=gates)
    _wait(state, client, created, split, load, watch)
    if following is not None and following.gate is not None:
        # Its trials wait for this round to end: now, if no process was seen exiting.
        following.gate.open()
    trials = client.all_trials(created.id)
    held = current.gate.held_s() if current.gate is not None else {}
    samples, startups = {}, {}
    for trial in trials:
        if trial.started_at is None:
            continue
        reports = _reports(state, client, trial)
        ours = [r for r in reports if r.attempt == trial.attempt]
        samples[trial.id] = sum(r.samples or 0.0 for r in ours)
        start = startup_s(trial, reports)
        if start is not None:
            startups[trial.id] = max(0.0, start - held.get(trial.id, 0.0))
    measured = measure_round(split, trials, samples, startups, held)
    line = Text(f"N={split}: {measured.succeeded}/{measured.trials} succeeded", style="bold")
    line.append(f", round {seconds(measured.makespan_s)}")
    if measured.samples:
        line.append(f", {plot.format_throughput(measured.samples)} samples reported")
    alone = _computing_alone_s(current.gate, trials)
    if alone is not None and alone > 0:
        line.append(f"; {seconds(alone)} computing alone")
        if measured.samples:
            line.append(f", {plot.format_throughput(measured.samples / alone)} samples/s")
    state.out.print(line, soft_wrap=True)
    for error in measured.errors[:ERRORS_SHOWN]:
        state.out.print(Text(f"  {error}", style="red"), soft_wrap=True)
    if len(measured.errors) > ERRORS_SHOWN:
        more = len(measured.errors) - ERRORS_SHOWN
        state.out.print(Text(f"  ... {render.plural(more, 'more failed trial')}", style="red"))
    return measured, trials


def _computing_alone_s(gate: Gate | None, trials: Sequence[TrialPublic]) -> float | None:
    """Seconds from when every trial of a gated round was ready and let compute to its last
    end: its window with no other N computing (None: not gated, or not all ready)."""
    if gate is None or gate.opened_at is None:
        return None
    ready = gate.ready()
    ends = [t.ended_at for t in trials if t.ended_at is not None]
    if not ready or len(ready) < len(trials) or not ends:
        return None
    return (max(ends) - max(gate.opened_at, *ready.values())).total_seconds()


def run_rounds(
    state: CliState,
    client: Client,
    sweeps: Sequence[SweepCreate],
    load: HostLoad,
    *,
    work_cores: int | None,
    rounds: int,
    gates: Path,
) -> list[Round]:
    """Every N in turn; on a device that computes apart from the host's cores (`work_cores`
    None: a GPU) each next N starts up as the one before computes and computes
    as it ends (see overlap.py), its gates' directories under `gates`."""
    measured: list[Round] = []
    started: Next | None = None
    shared = True
    splits = [int(s.split) for s in sweeps]
    for index, sweep_in in enumerate(sweeps):
        split = splits[index]
        if started is None:
            alone = not shared or len(splits) == 1
            launch = (
                split
                if alone
                else launch_split(splits, index, work_cores=work_cores, rounds=rounds)
            )
            started = Next(sweep_in, launch)
        following = None
        if index + 1 < len(sweeps) and shared and started.launched != split:
            launch = launch_split(splits, index + 1, work_cores=work_cores, rounds=rounds)
            following = Next(sweeps[index + 1], launch)
        launched = started.launched
        result, _ = run_round(state, client, started, load, gates=gates, following=following)
        if launched != split and out_of_memory(result):
            state.note(
                f"N={split}: out of memory in a slice shared with the next N's start-up; "
                "measured again alone, and every N after it alone"
            )
            shared = False
            if following is not None and following.created is not None:
                # The next N started already: it ends before this one runs again alone.
                _wait(state, client, following.created, following.split, load)
            result, _ = run_round(state, client, Next(sweep_in, split), load, gates=gates)
        measured.append(result)
        started = following if following is not None and following.created else None
    return measured
