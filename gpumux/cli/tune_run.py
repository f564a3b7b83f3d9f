"""The rounds of `gpumux tune`: one sweep per N on its daemon, waited for with progress and
measured, each next N started as the one before ends where the device allows (overlap.py)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.text import Text

from gpumux.cli import plot, render
from gpumux.cli.follow import sweep_ended
from gpumux.cli.overlap import Pace, launch_split, next_is_due, out_of_memory, pace_of
from gpumux.cli.rounds import Round, measure_round, seconds
from gpumux.cli.state import CliState
from gpumux.cli.tune_result import HostLoad, startup_s
from gpumux.client import Client
from gpumux.schemas import ReportPublic, SweepCreate, SweepDetail, TrialPublic
from gpumux.status import ACTIVE_TRIAL_STATUSES, TrialStatus

POLL_S = 0.25
# How often a round's trials are read to tell whether the next N is due.
AHEAD_POLL_S = 0.5
ERRORS_SHOWN = 3


def _wait(
    state: CliState,
    client: Client,
    created: SweepDetail,
    split: int,
    load: HostLoad,
    ahead: Callable[[], bool] | None = None,
) -> None:
    """Show one progress line on a terminal until the sweep of this N ends; elsewhere a line
    when its trials all run. Samples the host's load meanwhile, and asks `ahead` every second
    whether it started the next N (then no more)."""
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
    asked = time.monotonic()
    with Progress(*columns, console=state.out, transient=True, disable=quiet) as progress:
        task = progress.add_task("", total=created.trial_count, running=0, failed=0)
        while not sweep_ended(sweep):
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
            if ahead is not None and time.monotonic() - asked >= AHEAD_POLL_S:
                asked = time.monotonic()
                if ahead():
                    ahead = None


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
    """The next N, and its sweep once started: by the round before it, as that one ends."""

    sweep_in: SweepCreate
    launched: int
    created: SweepDetail | None = None


def _start(state: CliState, client: Client, sweep_in: SweepCreate, launched: int) -> SweepDetail:
    split = int(sweep_in.split)
    state.note(f"N={split}: starting {render.plural(sweep_in.trials or split, 'trial')}")
    return client.create_sweep(sweep_in.model_copy(update={"split": launched}))


def run_round(
    state: CliState,
    client: Client,
    sweep_in: SweepCreate,
    load: HostLoad,
    *,
    launched: int,
    created: SweepDetail | None = None,
    following: Next | None = None,
    pace: Pace | None = None,
    previous_end: datetime | None = None,
) -> tuple[Round, list[TrialPublic]]:
    """Submit the sweep of one N (unless the round before did), wait for it, and measure it;
    print its outcome in one line. With `following` and a `pace`, start the next N's sweep as
    this one's trials near their end."""
    split = int(sweep_in.split)
    if created is None:
        created = _start(state, client, sweep_in, launched)
    ahead = None
    if following is not None and pace is not None:
        next_in, known = following, pace
        sweep_id = created.id

        def ahead() -> bool:
            trials = client.all_trials(sweep_id)
            newcomers = next_in.sweep_in.trials or 1
            if not next_is_due(trials, known, datetime.now(UTC), newcomers=newcomers):
                return False
            next_in.created = _start(state, client, next_in.sweep_in, next_in.launched)
            return True

    _wait(state, client, created, split, load, ahead)
    trials = client.all_trials(created.id)
    samples, startups, steps = {}, {}, {}
    for trial in trials:
        if trial.started_at is None:
            continue
        reports = _reports(state, client, trial)
        ours = [r for r in reports if r.attempt == trial.attempt]
        samples[trial.id] = sum(r.samples or 0.0 for r in ours)
        if ours:
            steps[trial.id] = len(ours)
        start = startup_s(trial, reports)
        if start is not None:
            startups[trial.id] = start
    measured = measure_round(split, trials, samples, startups, steps)
    line = Text(f"N={split}: {measured.succeeded}/{measured.trials} succeeded", style="bold")
    line.append(f", round {seconds(measured.makespan_s)}")
    if measured.samples:
        line.append(f", {plot.format_throughput(measured.samples)} samples reported")
    computing = [
        t.started_at + timedelta(seconds=startups[t.id])
        for t in trials
        if t.started_at is not None and t.id in startups
    ]
    if previous_end is not None and computing and min(computing) < previous_end:
        shared = (previous_end - min(computing)).total_seconds()
        line.append(f"; computed {seconds(shared)} beside the N before")
    state.out.print(line, soft_wrap=True)
    for error in measured.errors[:ERRORS_SHOWN]:
        state.out.print(Text(f"  {error}", style="red"), soft_wrap=True)
    if len(measured.errors) > ERRORS_SHOWN:
        more = len(measured.errors) - ERRORS_SHOWN
        state.out.print(Text(f"  ... {render.plural(more, 'more failed trial')}", style="red"))
    return measured, trials


def run_rounds(
    state: CliState,
    client: Client,
    sweeps: Sequence[SweepCreate],
    load: HostLoad,
    *,
    kind: str,
    rounds: int,
) -> list[Round]:
    """Every N in turn; on a GPU each next N starts as the one before ends (see overlap.py)."""
    measured: list[Round] = []
    started: Next | None = None
    previous_end: datetime | None = None
    shared = True
    splits = [int(s.split) for s in sweeps]
    for index, sweep_in in enumerate(sweeps):
        split = splits[index]
        following = None
        if index + 1 < len(sweeps) and shared:
            launch = launch_split(splits, index + 1, kind=kind, rounds=rounds)
            following = Next(sweeps[index + 1], launch)
        if started is None:
            alone = not shared or len(splits) == 1
            launch = split if alone else launch_split(splits, index, kind=kind, rounds=rounds)
            started = Next(sweep_in, launch)
        launched = started.launched
        pace = pace_of(measured) if launched != split else None
        result, trials = run_round(
            state, client, sweep_in, load, launched=launched, created=started.created,
            following=following, pace=pace, previous_end=previous_end,
        )  # fmt: skip
        if launched != split and out_of_memory(result):
            state.note(
                f"N={split}: out of memory in a slice shared with the next N's start-up; "
                "measured again alone, and every N after it alone"
            )
            shared = False
            if following is not None and following.created is not None:
                # The next N started already: it ends before this one runs again alone.
                _wait(state, client, following.created, following.launched, load)
            result, trials = run_round(state, client, sweep_in, load, launched=split)
        measured.append(result)
        ends = [t.ended_at for t in trials if t.ended_at is not None]
        previous_end = max(ends) if ends else None
        started = following if following is not None and following.created else None
    return measured
