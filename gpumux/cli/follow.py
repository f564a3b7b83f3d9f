"""Following a sweep until it ends: a live view on a terminal, plain lines anywhere else."""

from __future__ import annotations

import time
from collections.abc import Sequence
from datetime import UTC, datetime

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from gpumux.cli import render
from gpumux.client import TRIALS_PAGE, Client
from gpumux.schemas import SweepDetail, TrialPublic
from gpumux.status import ACTIVE_TRIAL_STATUSES, FINAL_TRIAL_STATUSES, SweepStatus, TrialStatus

POLL_S = 0.5
RECENT_FINISHED = 5
FINAL_SWEEP_STATUSES = (SweepStatus.finished, SweepStatus.cancelled)


def sweep_ended(sweep: SweepDetail) -> bool:
    """The sweep finished or was cancelled: no trial of it will run again."""
    return sweep.status in FINAL_SWEEP_STATUSES


def poll(client: Client, sweep_id: int) -> tuple[SweepDetail, list[TrialPublic]]:
    """The sweep and the trials worth showing: all of them, or the active ones of a big sweep."""
    sweep = client.get_sweep(sweep_id)
    if sweep.trial_count <= TRIALS_PAGE:
        return sweep, client.list_trials(sweep_id, limit=TRIALS_PAGE).data
    active = client.list_trials(sweep_id, status=TrialStatus.running, limit=TRIALS_PAGE).data
    return sweep, active


def progress_view(sweep: SweepDetail, now: datetime) -> Table:
    """The progress bar with finished/total, running count and elapsed time."""
    done = render.finished_count(sweep.counts)
    running = sum(sweep.counts.get(status, 0) for status in ACTIVE_TRIAL_STATUSES)
    failed = sweep.counts.get(TrialStatus.failed, 0) + sweep.counts.get(TrialStatus.lost, 0)
    line = Table.grid(padding=(0, 1))
    line.add_row(
        Text(f"sweep {sweep.id}", style="bold"),
        ProgressBar(total=max(sweep.trial_count, 1), completed=done, width=30),
        Text(f"{done}/{sweep.trial_count} finished"),
        Text(f"{running} running", style="cyan"),
        Text(f"{failed} failed", style="red" if failed else "dim"),
        Text(render.duration(render.since(sweep.created_at, now)), style="dim"),
    )
    return line


def live_view(sweep: SweepDetail, trials: Sequence[TrialPublic], now: datetime) -> Group:
    """Progress, then the running trials and the last ones to finish."""
    active = [trial for trial in trials if trial.status in ACTIVE_TRIAL_STATUSES]
    ended = [trial for trial in trials if trial.status in FINAL_TRIAL_STATUSES and trial.ended_at]
    ended.sort(key=lambda trial: trial.ended_at or now, reverse=True)
    shown = active + ended[:RECENT_FINISHED]
    parts: list[RenderableType] = [progress_view(sweep, now)]
    parts.extend(render.search_text(profile) for profile in sweep.profiles)
    if shown:
        parts.append(render.trials_table(shown, objective=sweep.objective))
    return Group(*parts)


def event_line(sweep: SweepDetail, trial: TrialPublic, done: int) -> Text:
    """One plain line for a trial that changed status, `done` trials having ended so far."""
    text = Text(f"[{done}/{sweep.trial_count}] trial {trial.id} ")
    text.append(render.params_text(trial.params))
    text.append(": ")
    text.append_text(render.status_text(trial.status))
    if trial.status in ACTIVE_TRIAL_STATUSES:
        text.append(f" on {render.device_text(trial)}")
    elif trial.status in FINAL_TRIAL_STATUSES:
        details = [f"after {render.duration(render.trial_seconds(trial))}"]
        if trial.samples_per_s is not None:
            details.append(f"{render.rate(trial.samples_per_s)} samples/s")
        if sweep.objective is not None and trial.objective is not None:
            details.append(f"{sweep.objective.rpartition(':')[0]}={render.number(trial.objective)}")
        if trial.status != TrialStatus.succeeded and trial.error:
            details.append(render.error_summary(trial.error))
        text.append(f" ({', '.join(details)})")
    return text


def follow(client: Client, sweep_id: int, console: Console) -> SweepDetail:
    """Show the sweep's progress until it ends and return its final state."""
    if console.is_terminal:
        return _follow_live(client, sweep_id, console)
    return _follow_lines(client, sweep_id, console)


def _follow_live(client: Client, sweep_id: int, console: Console) -> SweepDetail:
    sweep, trials = poll(client, sweep_id)
    now = datetime.now(UTC)
    with Live(live_view(sweep, trials, now), console=console, transient=True) as live:
        while not sweep_ended(sweep):
            time.sleep(POLL_S)
            sweep, trials = poll(client, sweep_id)
            live.update(live_view(sweep, trials, datetime.now(UTC)))
    return sweep


def _follow_lines(client: Client, sweep_id: int, console: Console) -> SweepDetail:
    seen: dict[int, TrialStatus] = {}
    searches: dict[int, str | None] = {}
    done = 0
    while True:
        sweep, trials = poll(client, sweep_id)
        for profile in sweep.profiles:
            # Each decision of the split search, once: N measured, next N, or settled.
            if searches.get(profile.id, "") != profile.reason:
                console.print(render.search_text(profile), soft_wrap=True)
                searches[profile.id] = profile.reason
        for trial in sorted(trials, key=lambda t: (t.ended_at is None, t.ended_at, t.number)):
            # A queued trial is no news; a requeued one (running -> queued) is.
            if seen.get(trial.id, TrialStatus.queued) != trial.status:
                done += trial.status in FINAL_TRIAL_STATUSES
                console.print(event_line(sweep, trial, done), soft_wrap=True)
            seen[trial.id] = trial.status
        if sweep_ended(sweep):
            return sweep
        time.sleep(POLL_S)
