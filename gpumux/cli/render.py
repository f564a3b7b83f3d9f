"""How sweeps, trials and devices look on a terminal: rich tables and one-line summaries."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from gpumux.cli.glance import NONE, ShortValues, reason_text, slot_text, step_text, visible
from gpumux.cli.glance import error_summary as error_summary
from gpumux.grammar.searchspec import spec_text
from gpumux.grammar.sweepplan import Objective
from gpumux.schemas.devices import DevicePublic
from gpumux.schemas.profiles import ProfilePublic
from gpumux.schemas.sweeps import SweepDetail, SweepPublic
from gpumux.schemas.trials import TrialPublic
from gpumux.status import (
    FINAL_TRIAL_STATUSES,
    ObjectiveMode,
    SearchMethod,
    SweepStatus,
    TrialStatus,
)

STATUS_STYLES = {
    "queued": "dim",
    "starting": "cyan",
    "running": "bold cyan",
    "succeeded": "green",
    "finished": "green",
    "failed": "bold red",
    "cancelled": "yellow",
    "lost": "magenta",
    # Stopped by the pruner: a decision, not a failure, so not red.
    "pruned": "dark_orange",
}
# Order in which counts by status are listed: the interesting ones first.
STATUS_ORDER = (
    TrialStatus.running,
    TrialStatus.starting,
    TrialStatus.queued,
    TrialStatus.succeeded,
    TrialStatus.pruned,
    TrialStatus.failed,
    TrialStatus.lost,
    TrialStatus.cancelled,
)


def plural(count: int, noun: str) -> str:
    """ "1 trial", "3 trials"."""
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


def params_text(params: Mapping[str, Any], shown: ShortValues | None = None) -> str:
    """A trial's parameters, each float in its short form among those `shown` with it:
    "lr=0.0798 width=128"."""
    return (shown or ShortValues([params])).params(params)


def number(value: float | None, *, digits: int = 6) -> str:
    """A metric value in `digits` significant digits."""
    return NONE if value is None else f"{value:.{digits}g}"


def rate(value: float | None) -> str:
    """Samples per second, with thousands separators."""
    return NONE if value is None else f"{value:,.1f}"


def duration(seconds: float | None) -> str:
    """Seconds as 4.2s under a minute, H:MM:SS above."""
    if seconds is None:
        return NONE
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}"


def since(moment: datetime, now: datetime | None = None) -> float:
    """Seconds from `moment` to now (never negative)."""
    return max(0.0, ((now or datetime.now(UTC)) - moment).total_seconds())


def local_time(moment: datetime | None, *, year: bool = True) -> str:
    """A timestamp in the local time zone, to the minute."""
    if moment is None:
        return NONE
    return moment.astimezone().strftime("%Y-%m-%d %H:%M" if year else "%m-%d %H:%M")


def status_text(status: str) -> Text:
    """A status word in its colour."""
    return Text(str(status), style=STATUS_STYLES.get(str(status), ""))


def counts_text(counts: Mapping[TrialStatus, int]) -> str:
    """ "2 running, 3 succeeded, 1 failed" (statuses with no trial left out)."""
    parts = [f"{counts[status]} {status}" for status in STATUS_ORDER if counts.get(status)]
    return ", ".join(parts) or "no trials"


def finished_count(counts: Mapping[TrialStatus, int]) -> int:
    """How many trials have ended, whichever way."""
    return sum(count for status, count in counts.items() if status in FINAL_TRIAL_STATUSES)


def asked_count(sweep: SweepPublic) -> int:
    """How many trials of the sweep exist: all of them, or those an adaptive search asked."""
    return sum(sweep.counts.values())


def total_count(sweep: SweepPublic) -> int:
    """How many trials the sweep will have run: its budget, or, once it ended, those it asked.

    An adaptive sweep cancelled short of its budget ends with fewer trials than trial_count.
    """
    if sweep.status in (SweepStatus.finished, SweepStatus.cancelled):
        return asked_count(sweep)
    return sweep.trial_count


def method_text(sweep: SweepPublic) -> str:
    """How the sweep chooses its trials: "grid", "random, 20 trials", "tpe, 12 of 50 asked"."""
    if sweep.search.adaptive:
        method = spec_text(str(sweep.search), sweep.search_options)
        return f"{method}, {asked_count(sweep)} of {sweep.trial_count} asked"
    if sweep.search == SearchMethod.random:
        return f"random, {plural(sweep.trial_count, 'trial')}"
    return "grid"


def trial_seconds(trial: TrialPublic, now: datetime | None = None) -> float | None:
    """How long the trial has run (until `now`, default the present, if it is still running)."""
    if trial.started_at is None:
        return None
    return since(trial.started_at, trial.ended_at or now)


def objective_header(objective: Objective | None) -> str | None:
    """The objective column's header: "val_loss (min)"."""
    if objective is None:
        return None
    return f"{objective.metric} ({objective.mode})"


def rank_by_objective(
    trials: Iterable[TrialPublic], objective: Objective | None
) -> list[TrialPublic]:
    """Trials best first by the objective (those without a value last); by number without one."""
    ordered = sorted(trials, key=lambda trial: trial.number)
    if objective is None:
        return ordered
    sign = 1.0 if objective.mode == ObjectiveMode.min else -1.0
    return sorted(
        ordered,
        key=lambda t: (t.objective is None, sign * t.objective if t.objective is not None else 0),
    )


def swept_names(trials: Sequence[TrialPublic]) -> list[str]:
    """The parameters whose values differ between trials (all of them when none differ)."""
    names = list(dict.fromkeys(name for trial in trials for name in trial.params))
    varying = [n for n in names if len({repr(t.params.get(n)) for t in trials}) > 1]
    return varying or names


def trials_table(
    trials: Sequence[TrialPublic],
    *,
    objective: Objective | None,
    title: str | None = None,
    errors: bool = True,
    now: datetime | None = None,
) -> Table:
    """A row per trial, one line each: a column per swept parameter (floats short enough to
    tell apart), status, step, slot, time, samples/s (when reported), objective, and why it
    ended.

    The time of a running trial is counted up to `now` (default the present); a step column
    (the last step each trial reported, from 1) appears when a trial has reported one. The
    reason is cut to the width left (whole in `gpumux show --trial`).
    """
    header = objective_header(objective)
    steps = any(trial.step is not None for trial in trials)
    show_reasons = errors and any(trial.error for trial in trials if trial.status != "succeeded")
    shown = ShortValues.of(trials)
    table = Table(title=title, title_justify="left", header_style="bold")
    table.add_column("trial", justify="right", no_wrap=True)
    names = swept_names(trials)
    for name in names:
        table.add_column(visible(name), justify="right", no_wrap=True)
    table.add_column("status", no_wrap=True)
    if steps:
        table.add_column("step", justify="right", no_wrap=True)
    table.add_column("slot", no_wrap=True)
    table.add_column("time", justify="right", no_wrap=True)
    # Left out when no trial reports samples: a column of dashes only narrows the reasons.
    rates = any(trial.samples_per_s is not None for trial in trials)
    if rates:
        table.add_column("samples/s", justify="right", no_wrap=True)
    if header is not None:
        table.add_column(header, justify="right", no_wrap=True)
    if show_reasons:
        # Wrappable, so that the table gives it the width the others leave; each cell keeps to
        # one line and ends in "…" where cut.
        table.add_column("reason", style="red")
    for trial in trials:
        row: list[RenderableType] = [
            str(trial.id),
            *(shown.value(n, trial.params[n]) if n in trial.params else NONE for n in names),
            status_text(trial.status),
        ]
        if steps:
            row.append(step_text(trial.step))
        row += [slot_text(trial), duration(trial_seconds(trial, now))]
        if rates:
            row.append(rate(trial.samples_per_s))
        if header is not None:
            row.append(number(trial.objective))
        if show_reasons:
            row.append(Text(reason_text(trial), no_wrap=True, overflow="ellipsis"))
        table.add_row(*row)
    return table


def sweeps_table(sweeps: Sequence[SweepPublic]) -> Table:
    """One row per sweep: progress, counts by status, objective, owner, when."""
    table = Table(header_style="bold")
    table.add_column("id", justify="right", no_wrap=True)
    table.add_column("name", overflow="fold")
    table.add_column("status", no_wrap=True)
    table.add_column("done", justify="right", no_wrap=True)
    table.add_column("trials", overflow="fold")
    table.add_column("objective", overflow="fold")
    table.add_column("owner")
    table.add_column("created", no_wrap=True)
    for sweep in sweeps:
        table.add_row(
            str(sweep.id),
            visible(sweep.name or NONE),
            status_text(sweep.status),
            f"{finished_count(sweep.counts)}/{total_count(sweep)}",
            counts_text(sweep.counts),
            visible(str(sweep.objective or NONE)),
            visible(sweep.owner),
            local_time(sweep.created_at, year=False),
        )
    return table


def sweep_summary(sweep: SweepPublic) -> Table:
    """A sweep's settings and state as label: value lines."""
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column(overflow="fold")
    rows: list[tuple[str, RenderableType]] = [
        ("sweep", f"{sweep.id}" + (f" ({visible(sweep.name)})" if sweep.name else "")),
        ("status", Text.assemble(status_text(sweep.status), f"  {counts_text(sweep.counts)}")),
        ("command", visible(" ".join(sweep.command))),
        ("params", visible(" ".join(sweep.params)) or NONE),
        ("search", visible(f"{method_text(sweep)}, seed {sweep.seed}, split {sweep.split}")),
        *([("prune", visible(str(sweep.prune)))] if sweep.prune not in (None, "none") else []),
        *([("preload", "yes")] if sweep.preload else []),
        ("objective", visible(str(sweep.objective or NONE))),
        ("workdir", visible(sweep.workdir)),
        ("owner", visible(sweep.owner)),
        ("created", local_time(sweep.created_at)),
    ]
    if sweep.time_limit_s is not None:
        rows.append(("time limit", f"{sweep.time_limit_s:g}s per trial"))
    if sweep.finished_at is not None:
        took = duration(since(sweep.created_at, sweep.finished_at))
        rows.append(("ended", f"{local_time(sweep.finished_at)} (after {took})"))
    if sweep.cancel_requested and sweep.status != "cancelled":
        rows.append(("cancel", "requested; trials are being stopped"))
    for label, value in rows:
        grid.add_row(label, value)
    return grid


def best_text(
    sweep: SweepDetail, shown: ShortValues | None = None, *, so_far: bool = False
) -> Text | None:
    """ "best: trial 7  lr=0.01  val_loss=0.123" (its floats as short as among those `shown`
    with it), or why there is none; "best so far: ..." while the sweep is followed. None for a
    sweep without an objective."""
    if sweep.objective is None:
        return None
    metric = sweep.objective.metric
    label = "best so far" if so_far else "best"
    best = sweep.best
    if best is None or best.objective is None:
        # Followed, a wait for the first report; shown, a warning that none has said the metric.
        if so_far:
            return Text(f"{label}: no trial has reported {metric} yet", style="dim")
        return Text(f"{label}: no trial has reported {metric}", style="yellow")
    return Text.assemble(
        (f"{label}: ", "bold"),
        f"trial {best.id}  {params_text(best.params, shown)}  ",
        (f"{metric}={number(best.objective)}", "bold green"),
    )


def failures(
    failed: Sequence[TrialPublic], *, total: int, log_lines: int = 5
) -> RenderableType | None:
    """Failed trials' errors: exit status and last `log_lines` log lines, of `total` failed."""
    if not failed:
        return None
    parts: list[RenderableType] = []
    for trial in failed:
        head, _, tail = visible(trial.error or "no error recorded").partition("\n")
        lines = [head.removesuffix(" last lines of its log:").rstrip(";")]
        lines += ["  " + line for line in tail.splitlines()[-log_lines:]]
        title = f"trial {trial.id} ({params_text(trial.params)}) failed: "
        parts.append(Text.assemble((title, "bold red"), "\n  ".join(lines)))
    more = f"; {total - len(failed)} more failed trials" if total > len(failed) else ""
    parts.append(Text(f"whole logs: gpumux logs TRIAL{more}", style="dim"))
    return Group(*parts)


def dropped_reports(trials: Sequence[TrialPublic]) -> RenderableType | None:
    """Trials whose reports went over their budget: how many were dropped."""
    lines = [
        f"trial {t.id}: {t.reports_dropped:,} reports dropped over its report budget "
        "(GPUMUX_REPORT_RATE, _BURST, _ROWS); their samples still count"
        for t in trials
        if t.reports_dropped
    ]
    return Text("\n".join(lines), style="yellow") if lines else None


def memory(used: int | None, total: int | None) -> str:
    """ "3.2/80.0 GiB" from MiB figures."""
    if total is None:
        return NONE
    shown = NONE if used is None else f"{used / 1024:.1f}"
    return f"{shown}/{total / 1024:.1f} GiB"


def slots_text(device: DevicePublic) -> str:
    """The device's slots in use and the trial in each: "cpu/0: 5, cpu/1: 8" (N trials share a
    device, each in a slot; a 2-core CPU at N=4 has slots cpu/0 to cpu/3)."""
    ordered = sorted(device.trials, key=lambda trial: (trial.slot is None, trial.slot or 0))
    return ", ".join(
        f"{device.key}{'' if trial.slot is None else f'/{trial.slot}'}: {trial.trial_id}"
        for trial in ordered
    )


def devices_table(devices: Sequence[DevicePublic], title: str | None = None) -> Table:
    """One row per device: memory, utilisation and the trials packed on it, by slot."""
    table = Table(title=title, title_justify="left", header_style="bold")
    table.add_column("device")
    table.add_column("name")
    table.add_column("memory used", justify="right")
    table.add_column("util", justify="right")
    table.add_column("trials", justify="right")
    table.add_column("slots: trial in each", overflow="fold")
    for device in devices:
        util = NONE if device.utilization_pct is None else f"{device.utilization_pct}%"
        name = device.name if device.error is None else f"{device.name} ({device.error})"
        table.add_row(
            device.key,
            name,
            memory(device.memory_used_mb, device.memory_total_mb),
            util,
            str(len(device.trials)),
            slots_text(device) or NONE,
        )
    return table


def search_text(profile: ProfilePublic) -> Text:
    """One line on the split search of a sweep's workload on one device model."""
    text = Text(f"split search on {profile.device_name}: ", style="bold")
    if profile.curve:
        measured = ", ".join(f"N={point.split} {rate(point.throughput)}" for point in profile.curve)
        text.append(f"{measured} {profile.unit}; ")
    text.append(profile.reason or "measuring N=1", style="green" if profile.settled else "cyan")
    return text
