"""`gpumux profiles`: the throughput curves the tuner stored, as a list, a table and a chart."""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated

import typer
from rich.console import RenderableType
from rich.table import Table

from gpumux.cli import plot
from gpumux.cli.connect import connect
from gpumux.cli.render import NONE, local_time
from gpumux.cli.state import EXIT_USAGE, CliError, CliState, get_state
from gpumux.client import Client
from gpumux.fields import MAX_ID
from gpumux.schemas import ProfilePublic

PAGE = 500


def profiles_table(profiles: Sequence[ProfilePublic]) -> Table:
    """One row per profile: device model, workload, best N and how far the search got."""
    table = Table(header_style="bold")
    table.add_column("id", justify="right", no_wrap=True)
    table.add_column("device")
    table.add_column("command", overflow="fold")
    table.add_column("cost params", overflow="fold")
    table.add_column("unit", no_wrap=True)
    table.add_column("best N", justify="right", no_wrap=True)
    table.add_column("settled", no_wrap=True)
    table.add_column("points", justify="right", no_wrap=True)
    table.add_column("updated", no_wrap=True)
    for profile in profiles:
        table.add_row(
            str(profile.id),
            profile.device_name,
            shlex.join(profile.command),
            " ".join(profile.param_tokens) or NONE,
            profile.unit,
            NONE if profile.best_split is None else str(profile.best_split),
            "yes" if profile.settled else "no",
            str(len(profile.curve)),
            local_time(profile.updated_at, year=False),
        )
    return table


def profile_summary(profile: ProfilePublic) -> Table:
    """A profile's workload, device and tuner state as label: value lines."""
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold", no_wrap=True)
    grid.add_column(overflow="fold")
    best = NONE if profile.best_split is None else str(profile.best_split)
    state = "settled" if profile.settled else "still searching"
    rows = [
        ("profile", str(profile.id)),
        ("device", profile.device_name),
        ("command", shlex.join(profile.command)),
        ("cost params", " ".join(profile.param_tokens) or NONE),
        ("fingerprint", profile.fingerprint),
        ("best N", f"{best} ({state})"),
        ("limits", _limits(profile)),
        ("tuner", profile.reason or NONE),
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
    title = f"{profile.device_name}: {shlex.join(profile.command)}"
    if profile.param_tokens:
        title += f" ({' '.join(profile.param_tokens)})"
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
    all_: Annotated[bool, typer.Option("--all", help="every profile, not the newest few")] = False,
    limit: Annotated[int, typer.Option(min=1, max=PAGE, help="how many profiles")] = 20,
    url: Annotated[str | None, typer.Option(help="the daemon (default GPUMUX_URL)")] = None,
) -> None:
    """Measured throughput against trials per device (N): list them, or show one's curve."""
    state = get_state(ctx)
    if profile_id is None and png is not None:
        raise CliError("--png draws one profile: gpumux profiles ID --png FILE", EXIT_USAGE)
    with connect(state, url) as client:
        if profile_id is None:
            _list_profiles(state, client, all_=all_, limit=limit)
            return
        profile = client.get_profile(profile_id)
    for view in profile_views(profile):
        state.out.print(view)
    if png is not None:
        written = write_profile_png(profile, png)
        state.note(f"wrote {written}")


def _list_profiles(state: CliState, client: Client, *, all_: bool, limit: int) -> None:
    page = client.list_profiles(limit=PAGE if all_ else limit)
    found, count = page.data, page.count
    while all_ and page.data and len(found) < count:
        page = client.list_profiles(offset=len(found), limit=PAGE)
        found.extend(page.data)
    if not found:
        state.note("no profiles yet; a sweep with --split auto measures one")
        return
    state.out.print(profiles_table(found))
    if len(found) < count:
        state.note(f"{len(found)} of {count} profiles shown; --all or --limit N for more")
