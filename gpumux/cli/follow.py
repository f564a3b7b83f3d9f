"""Following a sweep until it ends: a live view on a terminal, plain lines anywhere else."""

from __future__ import annotations

import time
from collections.abc import Sequence
from datetime import UTC, datetime
from statistics import fmean

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from gpumux.cli import glance, render
from gpumux.client import TRIALS_PAGE, Client
from gpumux.schemas.sweeps import SweepDetail
from gpumux.schemas.trials import TrialPublic
from gpumux.status import ACTIVE_TRIAL_STATUSES, FINAL_TRIAL_STATUSES, SweepStatus, TrialStatus

POLL_S = 0.5
RECENT_FINISHED = 5
FINAL_SWEEP_STATUSES = (SweepStatus.finished, SweepStatus.cancelled)
# What the live view shows for a figure it cannot estimate yet.
UNKNOWN = "—"


def sweep_ended(sweep: SweepDetail) -> bool:
    """The sweep finished or was cancelled: no trial of it will run again."""
    return sweep.status in FINAL_SWEEP_STATUSES


def poll(client: Client, sweep_id: int) -> tuple[SweepDetail, list[TrialPublic]]:
    """The sweep and the trials worth showing: all of them, or the active ones of a big sweep."""
    sweep = client.get_sweep(sweep_id)
    if render.asked_count(sweep) <= TRIALS_PAGE:
        return sweep, client.list_trials(sweep_id, limit=TRIALS_PAGE).data
    active = client.list_trials(sweep_id, status=TrialStatus.running, limit=TRIALS_PAGE).data
    return sweep, active


def eta_seconds(sweep: SweepDetail, trials: Sequence[TrialPublic], now: datetime) -> float | None:
    """Seconds until the sweep ends, from what its trials took so far; None until one has ended.

    The sweep ends after render.total_count(sweep) trials: an adaptive search's budget counts
    the trials it has not asked yet as not started.

    With every trial that exists at hand and some running: per-trial durations. D is the mean
    run time of the trials that ended and C the trials running now (the slots in use). The
    work left is D for each trial not started plus what D leaves of each running one; the
    sweep needs that work / C, and no less than the largest remainder of one running trial
    (one trial's work cannot be shared between slots). Unlike a rate of finished trials, this
    counts the trials that are part done, so it does not swing by a whole trial's length
    between batches of long trials, and C follows the split as --split auto raises it.

    Otherwise (a sweep too big to list, or none of its trials running now): the sweep's
    throughput so far, finished trials per second since it was submitted; remaining / rate.
    """
    # The trials are fetched after the sweep: one may have ended after its counts were taken.
    listed = sum(trial.status in FINAL_TRIAL_STATUSES for trial in trials)
    done = max(render.finished_count(sweep.counts), listed)
    if done == 0:
        return None
    remaining = render.total_count(sweep) - done
    if remaining <= 0:
        return 0.0
    durations = [
        render.since(trial.started_at, trial.ended_at)
        for trial in trials
        if trial.status in FINAL_TRIAL_STATUSES and trial.started_at and trial.ended_at
    ]
    running = [trial for trial in trials if trial.status in ACTIVE_TRIAL_STATUSES]
    if len(trials) >= render.asked_count(sweep) and durations and running:
        mean = fmean(durations)
        ages = [render.since(t.started_at, now) if t.started_at else 0.0 for t in running]
        left = [max(0.0, mean - age) for age in ages]
        not_started = max(0, remaining - len(running))
        return max((mean * not_started + sum(left)) / len(running), max(left))
    return render.since(sweep.created_at, now) * remaining / done


def eta_text(eta: float | None) -> str:
    """The ETA as the views show it: a duration, or a dash until it can be estimated."""
    return UNKNOWN if eta is None else render.duration(eta)


def progress_view(sweep: SweepDetail, trials: Sequence[TrialPublic], now: datetime) -> Table:
    """The progress bar with finished/total, running count, elapsed time and ETA."""
    done = render.finished_count(sweep.counts)
    total = render.total_count(sweep)
    running = sum(sweep.counts.get(status, 0) for status in ACTIVE_TRIAL_STATUSES)
    failed = sweep.counts.get(TrialStatus.failed, 0) + sweep.counts.get(TrialStatus.lost, 0)
    pruned = sweep.counts.get(TrialStatus.pruned, 0)
    elapsed = render.since(sweep.created_at, sweep.finished_at or now)
    cells: list[RenderableType] = [
        Text(f"sweep {sweep.id}", style="bold"),
        ProgressBar(total=max(total, 1), completed=done, width=30),
        Text(f"{done}/{total} finished"),
        Text(f"{running} running", style="cyan"),
        Text(f"{failed} failed", style="red" if failed else "dim"),
    ]
    if pruned:
        cells.append(Text(f"{pruned} pruned", style=render.STATUS_STYLES["pruned"]))
    cells += [
        Text(f"elapsed {render.duration(elapsed)}", style="dim"),
        Text(f"ETA {eta_text(eta_seconds(sweep, trials, now))}", style="bold"),
    ]
    line = Table.grid(padding=(0, 1))
    line.add_row(*cells)
    return line


def live_view(sweep: SweepDetail, trials: Sequence[TrialPublic], now: datetime) -> Group:
    """Progress and the best trial so far, then the running trials and the last to finish."""
    active = [trial for trial in trials if trial.status in ACTIVE_TRIAL_STATUSES]
    ended = [trial for trial in trials if trial.status in FINAL_TRIAL_STATUSES and trial.ended_at]
    ended.sort(key=lambda trial: trial.ended_at or now, reverse=True)
    shown = active + ended[:RECENT_FINISHED]
    parts: list[RenderableType] = [progress_view(sweep, trials, now)]
    best = render.best_text(sweep, glance.ShortValues.of(trials), so_far=True)
    if best is not None:
        parts.append(best)
    parts.extend(render.search_text(profile) for profile in sweep.profiles)
    if shown:
        parts.append(render.trials_table(shown, objective=sweep.objective, now=now))
    return Group(*parts)


def event_line(
    sweep: SweepDetail,
    trial: TrialPublic,
    done: int,
    eta: float | None = None,
    *,
    shown: glance.ShortValues | None = None,
    steps: int | None = None,
) -> Text:
    """One plain line for a trial that changed status, `done` trials having ended so far; its
    floats as short as among the trials `shown` with it, its steps counted from 1 (of `steps`,
    the steps of a whole trial, when known)."""
    total = render.total_count(sweep)
    text = Text(f"[{done}/{total}] trial {trial.id} ")
    text.append(render.params_text(trial.params, shown))
    text.append(": ")
    text.append_text(render.status_text(trial.status))
    if trial.status in ACTIVE_TRIAL_STATUSES:
        text.append(f" in slot {glance.slot_text(trial)}")
    elif trial.status in FINAL_TRIAL_STATUSES:
        took = render.duration(render.trial_seconds(trial))
        pruned = glance.ended_text(trial, steps, took)
        if pruned:
            text.append(f" {pruned}")
        else:
            text.append(f" ({', '.join(_details(sweep, trial, steps, took))})")
        if eta is not None and done < total:
            text.append(f"; ETA {render.duration(eta)}")
    return text


def _details(sweep: SweepDetail, trial: TrialPublic, steps: int | None, took: str) -> list[str]:
    """What an ended trial's line says in parentheses: its time, step, rate, objective, error."""
    details = [f"after {took}"]
    if trial.step is not None:
        of = f" of {steps}" if steps is not None and trial.step < steps else ""
        details.append(f"step {glance.step_text(trial.step)}{of}")
    if trial.samples_per_s is not None:
        details.append(f"{render.rate(trial.samples_per_s)} samples/s")
    if sweep.objective is not None and trial.objective is not None:
        metric = sweep.objective.metric
        details.append(render.visible(f"{metric}={render.number(trial.objective)}"))
    if trial.status != TrialStatus.succeeded and trial.error:
        details.append(render.error_summary(trial.error))
    return details


def follow(client: Client, sweep_id: int, console: Console) -> SweepDetail:
    """Show the sweep's progress until it ends and return its final state."""
    if console.is_terminal:
        return _follow_live(client, sweep_id, console)
    return _follow_lines(client, sweep_id, console)


def no_gpu_warnings(sweep: SweepDetail, warned: set[str]) -> list[str]:
    """A line for each framework that saw no GPU in the sweep's trials on a GPU, the first time
    it is seen (added to `warned`): they train on the CPU, and what to install."""
    lines = []
    for seen in sweep.no_gpu:
        if seen.framework in warned:
            continue
        warned.add(seen.framework)
        lines.append(
            f"WARNING: {seen.framework} sees no GPU in trial(s) gpumux placed on a GPU: they "
            f"train on the CPU, and the split search leaves them out. To use the GPU, install "
            f"{seen.fix}"
        )
    return lines


def _follow_live(client: Client, sweep_id: int, console: Console) -> SweepDetail:
    sweep, trials = poll(client, sweep_id)
    now = datetime.now(UTC)
    warned: set[str] = set()
    with Live(live_view(sweep, trials, now), console=console, transient=True) as live:
        while True:
            for warning in no_gpu_warnings(sweep, warned):
                live.console.print(warning, soft_wrap=True)
            if sweep_ended(sweep):
                break
            time.sleep(POLL_S)
            sweep, trials = poll(client, sweep_id)
            live.update(live_view(sweep, trials, datetime.now(UTC)))
    return sweep


def _follow_lines(client: Client, sweep_id: int, console: Console) -> SweepDetail:
    seen: dict[int, TrialStatus] = {}
    searches: dict[int, str | None] = {}
    best_shown: tuple[int, float | None] | None = None
    warned: set[str] = set()
    done = 0
    while True:
        sweep, trials = poll(client, sweep_id)
        eta = eta_seconds(sweep, trials, datetime.now(UTC))
        for warning in no_gpu_warnings(sweep, warned):
            console.print(warning, soft_wrap=True)
        for profile in sweep.profiles:
            # Each decision of the split search, once: N measured, next N, or settled.
            if searches.get(profile.id, "") != profile.reason:
                console.print(render.search_text(profile), soft_wrap=True)
                searches[profile.id] = profile.reason
        # A queued trial is no news; a requeued one (running -> queued) is.
        changed = [
            trial for trial in trials if seen.get(trial.id, TrialStatus.queued) != trial.status
        ]
        changed.sort(key=lambda t: (t.ended_at is None, t.ended_at, t.number))
        ends = [n for n, trial in enumerate(changed) if trial.status in FINAL_TRIAL_STATUSES]
        shown = glance.ShortValues.of(trials)
        steps = glance.steps_per_trial(trials)
        for n, trial in enumerate(changed):
            done += trial.status in FINAL_TRIAL_STATUSES
            # The estimate is as of this poll: it belongs on its last end, not on earlier ones.
            estimate = eta if ends and n == ends[-1] else None
            line = event_line(sweep, trial, done, estimate, shown=shown, steps=steps)
            console.print(line, soft_wrap=True)
            seen[trial.id] = trial.status
        # A new best is news once its trial has ended, not at each epoch a running one reports.
        best, news = sweep.best, render.best_text(sweep, shown, so_far=True)
        if best is not None and best.status in FINAL_TRIAL_STATUSES and news is not None:
            if best.objective is not None and (best.id, best.objective) != best_shown:
                console.print(news, soft_wrap=True)
                best_shown = (best.id, best.objective)
        if sweep_ended(sweep):
            return sweep
        time.sleep(POLL_S)
