"""Throughput curves for people: a table and a bar chart for the terminal, a PNG for reports."""

from __future__ import annotations

import importlib.metadata
import json
import os
import shlex
import textwrap
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlparse
from urllib.request import url2pathname

from rich.console import Console, ConsoleOptions, RenderableType, RenderResult
from rich.table import Table
from rich.text import Text

from gpumux.cli.render import NONE, duration
from gpumux.throughput import CurvePoint

if TYPE_CHECKING:
    from matplotlib.figure import Figure

MATPLOTLIB = "matplotlib>=3.7"
# Eighths of a character cell, so that close values still draw bars of different lengths.
BLOCKS = " ▏▎▍▌▋▊▉"
FULL_BLOCK = "█"
MIN_BAR = 8
# Below this many columns for bars, the time-per-trial bar goes and its value stays.
TWO_BARS_MIN = 30
# The smallest a PNG's title gets before its lines are wrapped, and the margin it keeps on
# either side (a fraction of the figure's width).
MIN_TITLE_POINTS = 7
TITLE_MARGIN = 0.02


class PlotUnavailable(RuntimeError):
    """Drawing a PNG needs matplotlib, which is not installed."""


def install_hint(distribution: importlib.metadata.Distribution | None) -> str:
    """How to install matplotlib the way gpumux's `distribution` was installed: the `plot`
    extra by name where it came from an index, from the directory it was installed from (with
    -e where editable), and matplotlib alone where the extra cannot be named (a wheel file, a
    repository URL, a source tree on the path that no installer recorded)."""
    alone = f"pip install {shlex.quote(MATPLOTLIB)}"
    if distribution is None:
        return alone
    recorded = distribution.read_text("direct_url.json")
    if recorded is None:
        # Installers record a direct URL (PEP 610) for every install not resolved by name.
        return "pip install 'gpumux[plot]'"
    try:
        direct = json.loads(recorded)
    except ValueError:
        return alone
    if not isinstance(direct, dict) or not isinstance(direct.get("dir_info"), dict):
        return alone
    url = urlparse(str(direct.get("url", "")))
    if url.scheme != "file":
        return alone
    editable = "-e " if direct["dir_info"].get("editable") else ""
    return f"pip install {editable}{shlex.quote(url2pathname(url.path) + '[plot]')}"


def plot_install() -> str:
    """How to install matplotlib for the gpumux this process runs (install_hint)."""
    try:
        return install_hint(importlib.metadata.distribution("gpumux"))
    except importlib.metadata.PackageNotFoundError:
        return install_hint(None)


def by_split(points: Iterable[CurvePoint]) -> list[CurvePoint]:
    """The points in the order of N."""
    return sorted(points, key=lambda point: point.split)


def format_throughput(value: float | None) -> str:
    """At least three significant digits: 12,345 / 123.4 / 0.0123."""
    if value is None:
        return NONE
    if value >= 1000:
        return f"{value:,.0f}"
    if value >= 10:
        return f"{value:.1f}"
    return f"{value:.3g}"


def format_memory(mb: float | None) -> str:
    """Memory in MiB, or GiB from 10 GiB up."""
    if mb is None:
        return NONE
    return f"{mb / 1024:,.1f} GiB" if mb >= 10 * 1024 else f"{mb:,.0f} MiB"


def speedups(curve: list[CurvePoint]) -> list[float | None]:
    """Each point's throughput over the throughput at N = 1 (None without that baseline)."""
    base = next((p.throughput for p in curve if p.split == 1), None)
    if not base:
        return [None] * len(curve)
    return [point.throughput / base for point in curve]


def curve_table(points: Iterable[CurvePoint], *, unit: str, best_split: int | None) -> Table:
    """A row per N: aggregate throughput, speed-up over N = 1, time and memory per trial."""
    curve = by_split(points)
    table = Table(header_style="bold")
    table.add_column("N", justify="right", no_wrap=True, min_width=2)
    table.add_column(unit, justify="right", no_wrap=True)
    table.add_column("speed-up", justify="right", no_wrap=True)
    table.add_column("s/trial", justify="right", no_wrap=True)
    table.add_column("memory/trial", justify="right", no_wrap=True)
    # The best N's mark, in a column of its own only where a point is the best.
    marked = any(point.split == best_split for point in curve)
    if marked:
        table.add_column("", no_wrap=True)
    for point, speedup in zip(curve, speedups(curve), strict=True):
        best = point.split == best_split
        cells = [
            str(point.split),
            format_throughput(point.throughput),
            NONE if speedup is None else f"{speedup:.2f}x",
            duration(point.seconds_per_trial),
            format_memory(point.memory_per_trial_mb),
        ]
        if marked:
            cells.append("best" if best else "")
        table.add_row(*cells, style="bold green" if best else None)
    return table


def eighths(value: float, top: float, cells: int) -> int:
    """How many eighths of a character cell `value` fills when `top` fills `cells` cells (at
    least one): the resolution of the block characters both charts draw with."""
    return max(1, round(value / top * cells * 8))


def _bar(value: float | None, top: float, width: int, ascii_only: bool) -> str:
    """A left-aligned bar `width` cells wide at full scale (`top`), padded to `width`."""
    if value is None or top <= 0 or value <= 0:
        return " " * width
    if ascii_only:
        return ("#" * max(1, round(value / top * width))).ljust(width)
    full, part = divmod(eighths(value, top, width), 8)
    return (FULL_BLOCK * full + (BLOCKS[part] if part else "")).ljust(width)


@dataclass(frozen=True)
class ThroughputChart:
    """Bars of aggregate throughput and of seconds per trial for each N, fitted to the width."""

    curve: list[CurvePoint]
    unit: str
    best_split: int | None

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        if not self.curve:
            yield Text("no points measured yet", style="dim")
            return
        ascii_only = options.ascii_only
        marker = " <- best" if ascii_only else " ◀ best"
        n_labels = [str(point.split) for point in self.curve]
        rates = [format_throughput(point.throughput) for point in self.curve]
        times = [duration(point.seconds_per_trial) for point in self.curve]
        n_w = max(1, *map(len, n_labels))
        rate_w = max(map(len, rates))
        time_w = max(map(len, times))
        fixed = n_w + 1 + 1 + rate_w + 3 + time_w + len(marker)
        room = max(MIN_BAR, options.max_width - fixed)
        two_bars = room >= TWO_BARS_MIN
        rate_bar = room * 2 // 3 if two_bars else room
        time_bar = room - rate_bar - 1 if two_bars else 0
        top_rate = max(point.throughput for point in self.curve)
        top_time = max((p.seconds_per_trial or 0.0) for p in self.curve)
        header = Text(no_wrap=True, overflow="crop", style="bold")
        header.append(f"{'N':>{n_w}} ")
        header.append(
            f"aggregate {self.unit}"[: rate_bar + 1 + rate_w].ljust(rate_bar + rate_w + 1)
        )
        header.append("   " + ("seconds per trial" if two_bars else "s/trial"))
        yield header
        for point, label, rate, took in zip(self.curve, n_labels, rates, times, strict=True):
            best = point.split == self.best_split
            line = Text(no_wrap=True, overflow="crop", style="bold" if best else "")
            line.append(f"{label:>{n_w}} ")
            line.append(_bar(point.throughput, top_rate, rate_bar, ascii_only), style="cyan")
            line.append(f" {rate:>{rate_w}}   ")
            if two_bars:
                bar = _bar(point.seconds_per_trial, top_time, time_bar, ascii_only)
                line.append(bar + " ", style="magenta")
            line.append(f"{took:>{time_w}}")
            if best:
                line.append(marker, style="green")
            yield line


def terminal_chart(
    points: Iterable[CurvePoint], *, unit: str, best_split: int | None
) -> RenderableType:
    """A bar chart of aggregate throughput and seconds per trial against N, best N marked."""
    return ThroughputChart(curve=by_split(points), unit=unit, best_split=best_split)


def write_png(
    points: Iterable[CurvePoint],
    *,
    unit: str,
    best_split: int | None,
    title: str,
    path: str | os.PathLike[str],
) -> Path:
    """Draw aggregate throughput and seconds per trial against N (log2 axis) into a PNG."""
    curve = by_split(points)
    if not curve:
        raise ValueError("no measured point to plot")
    try:
        # Imported here: matplotlib is an optional extra and slow to import.
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
        from matplotlib.ticker import NullLocator
    except ImportError as error:
        raise PlotUnavailable(f"writing a PNG needs matplotlib: {plot_install()}") from error
    figure = Figure(figsize=(7, 6), layout="constrained")
    FigureCanvasAgg(figure)
    rate_axes, time_axes = figure.subplots(2, 1, sharex=True)
    splits = [point.split for point in curve]
    rate_axes.plot(splits, [point.throughput for point in curve], marker="o")
    rate_axes.set_ylabel(f"aggregate {unit}")
    timed = [point for point in curve if point.seconds_per_trial is not None]
    time_axes.plot(
        [point.split for point in timed],
        [point.seconds_per_trial for point in timed],
        marker="s",
        color="tab:orange",
    )
    if not timed:
        time_axes.text(
            0.5, 0.5, "no trial ended", transform=time_axes.transAxes, ha="center", va="center"
        )
    time_axes.set_ylabel("seconds per trial")
    time_axes.set_xlabel("trials at once on the device (N)")
    time_axes.set_xscale("log", base=2)
    time_axes.set_xticks(splits, labels=[str(split) for split in splits])
    time_axes.xaxis.set_minor_locator(NullLocator())
    for axes in (rate_axes, time_axes):
        axes.set_ylim(bottom=0)
        axes.grid(alpha=0.3)
        if best_split is not None:
            axes.axvline(
                best_split, color="tab:green", linestyle="--", label=f"best N = {best_split}"
            )
    best = next((point for point in curve if point.split == best_split), None)
    if best is not None:
        rate_axes.plot(
            [best.split], [best.throughput], marker="*", markersize=16, color="tab:green"
        )
    if best_split is not None:
        rate_axes.legend(loc="best")
    _fit_title(figure, title)
    figure.savefig(path, format="png", dpi=120)
    return Path(path)


def _fit_title(figure: Figure, title: str) -> None:
    """The title over the figure, smaller until it fits inside it with a margin (a command and
    its directory are often wider than the figure); lines still too wide then are wrapped."""
    text = figure.suptitle(title)
    renderer = figure.canvas.get_renderer()  # type: ignore[attr-defined]
    room = figure.bbox.width * (1 - 2 * TITLE_MARGIN)
    size = float(text.get_fontsize())
    while text.get_window_extent(renderer).width > room and size > MIN_TITLE_POINTS:
        size -= 1
        text.set_fontsize(size)
    width = text.get_window_extent(renderer).width
    if width > room:
        longest = max(len(line) for line in title.splitlines())
        chars = max(1, int(longest * room / width))
        lines = [
            "\n".join(textwrap.wrap(line, chars, break_on_hyphens=False)) or line
            for line in title.splitlines()
        ]
        text.set_text("\n".join(lines))
