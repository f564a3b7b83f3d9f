"""What `gpumux tune` ends with: the table, the best N and what it means, the chart, and the
curve kept as the workload's profile for the next `--split auto` sweep of the command."""

from __future__ import annotations

import os
import shlex
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from rich.text import Text

from gpumux.cli import plot
from gpumux.cli.connect import find_daemon
from gpumux.cli.rounds import Round, best_split, chart_points, choose_unit, results_table
from gpumux.cli.state import CliError, CliState
from gpumux.client import ApiError, DaemonUnreachable
from gpumux.schemas.devices import DevicePublic
from gpumux.schemas.profiles import ProfileMeasured
from gpumux.schemas.reports import ReportPublic
from gpumux.schemas.trials import TrialPublic
from gpumux.throughput import TRIALS_PER_S

# A trial whose start-up (imports, device set-up) took more of it than this ran mostly to start:
# its round's rate says how start-ups overlap, not what the device computes.
STARTUP_DOMINATES = 0.5


@dataclass
class HostLoad:
    """The load other work put on the host while the rounds ran (its load average less tune's
    own running trials, sampled), against the host's cores."""

    cores: int = field(default_factory=lambda: len(os.sched_getaffinity(0)))
    samples: list[float] = field(default_factory=list)

    def sample(self, running: int) -> None:
        self.samples.append(max(0.0, os.getloadavg()[0] - running))

    @property
    def median(self) -> float | None:
        return statistics.median(self.samples) if self.samples else None


def startup_s(trial: TrialPublic, reports: Sequence[ReportPublic]) -> float | None:
    """Seconds the trial ran before its work began: its first report less the time that report's
    samples took at the pace of its later ones; None without two reports of samples."""
    ours = sorted(
        (r for r in reports if r.attempt == trial.attempt and r.samples), key=lambda r: r.at
    )
    if trial.started_at is None or len(ours) < 2:
        return None
    later = sum(r.samples or 0.0 for r in ours[1:])
    pace = (ours[-1].at - ours[0].at).total_seconds() / later
    first = (ours[0].at - trial.started_at).total_seconds()
    return max(0.0, first - (ours[0].samples or 0.0) * pace)


def explain(best: Round, *, cpu_cores: int | None, load: HostLoad) -> list[str]:
    """What the best N means, where it would surprise: start-up that dominates the trials, more
    trials than the cores of the CPU device (`cpu_cores`; None on a GPU), a host busy with other
    work while it measured."""
    lines = []
    share = best.startup_share
    if share is not None and share > STARTUP_DOMINATES:
        lines.append(
            f"start-up took {share:.0%} of each trial at N={best.split}: the gain of running "
            "more at once is mostly start-ups overlapping; longer trials may find a smaller "
            "best N"
        )
    if cpu_cores is not None and best.split > cpu_cores:
        lines.append(
            f"N={best.split} is more trials than this host's {cpu_cores} cores: each trial "
            "waits for the cores part of the time, and what it gains is overlapped waiting "
            "(start-up, input, sleeps), not more computing"
        )
    others = load.median
    if others is not None and (lines or others > load.cores):
        lines.append(
            f"measured while other work kept the host's load average at about {others:.1f} on "
            f"{load.cores} cores"
            + (": an idle host may find another N" if others > load.cores / 2 else "")
        )
    return lines


def report(
    state: CliState,
    rounds: Sequence[Round],
    *,
    device: DevicePublic,
    load: HostLoad,
    png: Path | None,
) -> int:
    """Print the table, the best N and what it means, the chart; write the PNG; keep the curve
    as the workload's profile. The exit status earned."""
    unit = choose_unit(rounds)
    best = best_split(rounds, unit)
    out = state.out
    out.print(results_table(rounds, unit=unit, best=best))
    if best is None:
        state.note("no N succeeded: nothing to plot")
        return 1
    if unit == TRIALS_PER_S:
        state.note(
            "throughput in trials/s: the command reported no samples at some N "
            "(gpumux.runtime.report(samples=...) and Keras Model.fit report them)"
        )
    where = f"{device.name} ({device.key})"
    out.print(Text(f"best: N={best} on {where}", style="bold green"))
    chosen = next(r for r in rounds if r.split == best)
    cpu_cores = device.work_cores
    for line in explain(chosen, cpu_cores=cpu_cores, load=load):
        out.print(Text(f"  {line}"))
    points = chart_points(rounds, unit)
    out.print(plot.terminal_chart(points, unit=unit, best_split=best))
    if png is not None:
        title = f"{where}: {shlex.join(state.command or [])}"
        try:
            written = plot.write_png(points, unit=unit, best_split=best, title=title, path=png)
        except plot.PlotUnavailable as error:
            raise CliError(str(error)) from error
        except OSError as error:
            raise CliError(f"cannot write {png}: {error.strerror or error}") from error
        state.note(f"wrote {written}")
    measured = ProfileMeasured(
        device=device.key,
        device_name=device.name,
        workdir=os.getcwd(),
        command=state.command or [],
        unit=unit,
        curve=points,
        best_split=best,
        reason=f"gpumux tune: N={best} of {', '.join(str(p.split) for p in points)}",
    )
    keep_profile(state, measured)
    return 0


def keep_profile(state: CliState, measured: ProfileMeasured) -> None:
    """Store the curve through the user's daemon, where `gpumux sweep --split auto` reads it."""
    url = state.resolve_url(None)
    try:
        with find_daemon(url, state.settings) as client:
            profile = client.store_profile(measured)
    except DaemonUnreachable:
        state.note(
            f"no daemon at {url}: the curve is not kept as a profile (start `gpumux serve` "
            "before tuning, and the next `gpumux sweep --split auto` of this command starts "
            "at its best N)"
        )
        return
    except ApiError as error:
        state.note(f"the curve is not kept as a profile: {error}")
        return
    state.note(
        f"kept as profile {profile.id}: the next `gpumux sweep --split auto` of this command "
        f"in this directory starts at N={measured.best_split}"
    )
