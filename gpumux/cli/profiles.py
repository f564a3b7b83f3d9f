"""`gpumux profiles`: the throughput curves the split search stored, as a list, table and chart."""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console, ConsoleOptions, RenderableType, RenderResult
from rich.table import Table
from rich.text import Text

from gpumux.cli import plot
from gpumux.cli.commands import sweep_id_of
from gpumux.cli.connect import connect
from gpumux.cli.render import NONE, local_time, visible
from gpumux.cli.state import EXIT_USAGE, CliError, CliState, get_state
from gpumux.client import Client
from gpumux.fields import MAX_ID
from gpumux.schemas.profiles import ProfilePublic
from gpumux.throughput import SWEEP_ENDED

PAGE = 500


# Under this many columns the list leaves out when each profile was updated (`gpumux profiles ID`
# shows it) and wraps the device's name, so that the workload keeps room to be read.
NARROW = 110
NARROW_DEVICE = 16


@dataclass(frozen=True)
class ProfilesTable:
    """One row per profile: device model, best N or how far the search got, and the workload:
    its command, the directory it runs in and its cost parameters, each on a line of its own;
    fitted to the width."""

    profiles: Sequence[ProfilePublic]

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        narrow = options.max_width < NARROW
        table = Table(header_style="bold")
        table.add_column("id", justify="right", no_wrap=True)
        table.add_column("device", max_width=NARROW_DEVICE if narrow else None)
        table.add_column("best N", no_wrap=True)
        table.add_column("unit")
        if not narrow:
            table.add_column("updated", no_wrap=True)
        # No minimum width: rich widens a column back to its minimum after fitting the table,
        # past the terminal's edge.
        table.add_column("workload", overflow="fold")
        for profile in self.profiles:
            workload = Text(visible(shlex.join(profile.command)))
            if profile.workdir is not None:
                workload.append(f"\nin {visible(profile.workdir)}", style="dim")
            if profile.param_tokens:
                workload.append(f"\ncost: {visible(' '.join(profile.param_tokens))}", style="dim")
            updated = [] if narrow else [local_time(profile.updated_at, year=False)]
            table.add_row(
                str(profile.id),
                visible(profile.device_name),
                _best(profile, short=True),
                profile.unit,
                *updated,
                workload,
            )
        yield table


def _best(profile: ProfilePublic, *, short: bool = False) -> str:
    """The best N, or where the search stands: settled, unsettled since its sweep ended, or
    searching while its sweep runs."""
    if profile.settled:
        best = NONE if profile.best_split is None else str(profile.best_split)
        return best if short else f"{best} (settled)"
    if (profile.reason or "").startswith(SWEEP_ENDED):
        if short:
            return "unsettled"
        measured = ", ".join(str(point.split) for point in plot.by_split(profile.curve))
        return f"{f'measured N={measured}' if measured else 'nothing measured'}; {SWEEP_ENDED}"
    return "searching" if short else f"{NONE} (still searching)"


def profile_summary(profile: ProfilePublic) -> Table:
    """A profile's workload, device and split search state as label: value lines."""
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold", no_wrap=True)
    grid.add_column(overflow="fold")
    rows = [
        ("profile", str(profile.id)),
        ("device", visible(profile.device_name)),
        ("command", visible(shlex.join(profile.command))),
        ("directory", visible(profile.workdir or NONE)),
        ("cost params", visible(" ".join(profile.param_tokens)) or NONE),
        ("fingerprint", profile.fingerprint),
        ("best N", _best(profile)),
        ("limits", _limits(profile)),
        ("CUDA context", NONE if profile.context_mb is None else f"{profile.context_mb} MiB"),
        ("search", visible(profile.reason or NONE)),
        ("last sweep", NONE if profile.sweep_id is None else str(profile.sweep_id)),
        ("updated", local_time(profile.updated_at)),
    ]
    for label, value in rows:
        grid.add_row(label, value)
    return grid


def _limits(profile: ProfilePublic) -> str:
    """What the next search of the workload will not climb into."""
    limits = []
    if profile.oom_at is not None:
        limits.append(f"out of memory at N={profile.oom_at}")
    if profile.ceiling is not None:
        limits.append(f"at most N={profile.ceiling} fit")
    return "; ".join(limits) or NONE


def profile_views(profile: ProfilePublic) -> list[RenderableType]:
    """What `gpumux profiles ID` prints: the summary, the curve's table and its chart."""
    views: list[RenderableType] = [profile_summary(profile)]
    if profile.curve:
        views.append(
            plot.curve_table(profile.curve, unit=profile.unit, best_split=profile.best_split)
        )
    views.append(
        plot.terminal_chart(profile.curve, unit=profile.unit, best_split=profile.best_split)
    )
    return views


def write_profile_png(profile: ProfilePublic, path: Path) -> Path:
    """The profile's curve as a PNG at `path`; CliError when it cannot be drawn or written."""
    if not profile.curve:
        raise CliError(f"profile {profile.id} has no measured point to plot yet")
    lines = [profile.device_name, shlex.join(profile.command)]
    if profile.workdir is not None:
        lines.append(f"in {profile.workdir}")
    if profile.param_tokens:
        lines.append(f"cost: {' '.join(profile.param_tokens)}")
    title = "\n".join(lines)
    try:
        return plot.write_png(
            profile.curve,
            unit=profile.unit,
            best_split=profile.best_split,
            title=title,
            path=path,
        )
    except plot.PlotUnavailable as error:
        raise CliError(str(error)) from error
    except OSError as error:
        raise CliError(f"cannot write {path}: {error.strerror or error}") from error


def profiles(
    ctx: typer.Context,
    profile_id: Annotated[
        int | None,
        typer.Argument(
            help="show this profile's curve (ids from `gpumux profiles`)", min=1, max=MAX_ID
        ),
    ] = None,
    png: Annotated[
        Path | None,
        typer.Option(help="also draw the curve into this PNG file (needs matplotlib)"),
    ] = None,
    sweep: Annotated[
        str | None,
        typer.Option(
            metavar="SWEEP",
            help="show the curve this sweep's workload measured (its id or --name)",
            show_default=False,
        ),
    ] = None,
    all_: Annotated[bool, typer.Option("--all", help="every profile, not the newest few")] = False,
    limit: Annotated[int, typer.Option(min=1, max=PAGE, help="how many profiles")] = 20,
    url: Annotated[str | None, typer.Option(help="the daemon (default GPUMUX_URL)")] = None,
) -> None:
    """Measured throughput against trials per device (N): list them, or show one's curve."""
    state = get_state(ctx)
    if profile_id is not None and sweep is not None:
        raise CliError("a profile's ID or --sweep SWEEP, not both", EXIT_USAGE)
    if profile_id is None and sweep is None and png is not None:
        raise CliError(
            "--png draws one profile: gpumux profiles ID --png FILE, or --sweep SWEEP", EXIT_USAGE
        )
    with connect(state, url) as client:
        if sweep is not None:
            profile = _profile_of_sweep(client, sweep)
        elif profile_id is None:
            _list_profiles(state, client, all_=all_, limit=limit)
            return
        else:
            profile = client.get_profile(profile_id)
    for view in profile_views(profile):
        state.out.print(view)
    if png is not None:
        written = write_profile_png(profile, png)
        state.note(f"wrote {written}")


def _profile_of_sweep(client: Client, sweep: str) -> ProfilePublic:
    """The profile a sweep's split search measured its workload in (the newest, where it ran
    on several device models)."""
    sweep_id = sweep_id_of(client, sweep)
    found = client.get_sweep(sweep_id).profiles
    if not found:
        raise CliError(
            f"sweep {sweep_id} has no profile: its split was fixed (--split N), or the search "
            "is off (GPUMUX_SPLIT_SEARCH=0) or measured nothing yet"
        )
    return max(found, key=lambda profile: profile.updated_at)


def _list_profiles(state: CliState, client: Client, *, all_: bool, limit: int) -> None:
    page = client.list_profiles(limit=PAGE if all_ else limit)
    found, count = page.data, page.count
    while all_ and page.data and len(found) < count:
        page = client.list_profiles(offset=len(found), limit=PAGE)
        found.extend(page.data)
    if not found:
        state.note("no profiles yet; a sweep with --split auto measures one")
        return
    state.out.print(ProfilesTable(found))
    if len(found) < count:
        state.note(f"{len(found)} of {count} profiles shown; --all or --limit N for more")
