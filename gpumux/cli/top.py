"""`gpumux top`: the devices, the mix of sweeps and the trials packed on each, until Ctrl-C."""

from __future__ import annotations

import shlex
import time
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Annotated, Any, Protocol

import typer
from rich.console import Group, RenderableType
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from gpumux.cli import glance, render
from gpumux.cli.connect import connect
from gpumux.cli.state import finite, get_state
from gpumux.client import Client
from gpumux.schemas.devices import DevicePublic, DeviceShare, DeviceTrial
from gpumux.schemas.health import Health
from gpumux.schemas.sweeps import SweepPublic
from gpumux.schemas.trials import TrialPublic

MEMORY_BAR_WIDTH = 24
# time.sleep() overflows past time_t: an hour between frames is more than anyone waits.
MAX_INTERVAL_S = 3600.0


class DetailSource(Protocol):
    """The part of Client that Details uses (tests count its requests)."""

    def get_trial(self, trial_id: int) -> TrialPublic: ...

    def get_sweep(self, sweep_id: int) -> SweepPublic: ...


class Details:
    """What `top` shows of the sweeps and trials on the devices, fetched once per id.

    A sweep's command and a trial's parameters never change, so each costs one request when
    it first appears; entries of trials and sweeps that left the devices are dropped. Only
    the caller's own sweeps (an admin's: all) are asked about: the daemon refuses the rest,
    which the devices' mix shows without an owner.
    """

    def __init__(self, client: DetailSource) -> None:
        self._client = client
        self.sweeps: dict[int, SweepPublic] = {}
        self.params: dict[int, dict[str, Any]] = {}

    def update(self, devices: Sequence[DevicePublic]) -> None:
        """Fetch the details of new trials and sweeps on `devices`; forget the ones gone."""
        sweep_ids = {
            share.sweep_id for device in devices for share in device.mix if share.owner is not None
        }
        trial_ids = {
            trial.trial_id
            for device in devices
            for trial in device.trials
            if trial.sweep_id in sweep_ids
        }
        for trial_id in trial_ids - self.params.keys():
            self.params[trial_id] = self._client.get_trial(trial_id).params
        for sweep_id in sweep_ids - self.sweeps.keys():
            self.sweeps[sweep_id] = self._client.get_sweep(sweep_id)
        for trial_id in self.params.keys() - trial_ids:
            del self.params[trial_id]
        for sweep_id in self.sweeps.keys() - sweep_ids:
            del self.sweeps[sweep_id]


def memory_view(device: DevicePublic) -> RenderableType:
    """A bar of the device's used memory and "used/total GiB", or a dash when unknown."""
    figures = render.memory(device.memory_used_mb, device.memory_total_mb)
    if device.memory_used_mb is None or not device.memory_total_mb:
        return Text(f"memory {figures}")
    bar = ProgressBar(
        total=device.memory_total_mb, completed=device.memory_used_mb, width=MEMORY_BAR_WIDTH
    )
    line = Table.grid(padding=(0, 1))
    line.add_row(Text("memory"), bar, Text(figures))
    return line


def device_header(device: DevicePublic) -> Table:
    """One line per device: key, name, memory bar, utilisation, cores or error."""
    util = render.NONE if device.utilization_pct is None else f"{device.utilization_pct}%"
    line = Table.grid(padding=(0, 2))
    cells: list[RenderableType] = [
        Text(device.key, style="bold"),
        Text(device.name),
        memory_view(device),
        Text(f"util {util}"),
    ]
    if device.cpu_count is not None:
        cells.append(Text(render.plural(device.cpu_count, "core")))
    cells.append(Text(render.plural(len(device.trials), "trial"), style="cyan"))
    if device.mix:
        full = device.load >= 1
        cells.append(Text(f"load {device.load_fraction}", style="bold" if full else "cyan"))
    if device.error is not None:
        cells.append(Text(f"error: {device.error}", style="bold red"))
    line.add_row(*cells)
    return line


def share_text(share: DeviceShare) -> Text:
    """ "#12 alice name 2/3": a sweep, whose, and its trials over the split they hold 1/N of."""
    text = Text(f"#{share.sweep_id}", style="bold")
    if share.owner is None:
        text.append(" another user", style="dim")
    else:
        text.append(f" {render.visible(share.owner)}")
    if share.name:
        text.append(f" {render.visible(share.name)}", style="italic")
    text.append(f" {share.trials}/{share.split}", style="cyan")
    return text


def mix_view(mix: Sequence[DeviceShare]) -> Text:
    """One line of the sweeps sharing a device, each with its share: "  mix  #12 alice 2/3 ..."."""
    line = Text("  mix  ", style="dim")
    line.append_text(Text("  ").join(share_text(share) for share in mix))
    return line


def trials_view(
    trials: Sequence[DeviceTrial],
    *,
    sweeps: Mapping[int, SweepPublic],
    params: Mapping[int, Mapping[str, Any]],
) -> Table:
    """The gpumux trials packed on one device, with their sweep's command and their parameters."""
    table = Table(header_style="bold", box=None, padding=(0, 1, 0, 2))
    table.add_column("trial", justify="right", no_wrap=True)
    table.add_column("sweep", justify="right", no_wrap=True)
    table.add_column("slot", justify="right", no_wrap=True)
    table.add_column("mem limit", justify="right", no_wrap=True)
    table.add_column("samples/s", justify="right", no_wrap=True)
    table.add_column("params", overflow="fold")
    table.add_column("command", overflow="ellipsis", no_wrap=True)
    shown = glance.ShortValues(params.get(trial.trial_id, {}) for trial in trials)
    for trial in sorted(trials, key=lambda trial: (trial.slot is None, trial.slot, trial.trial_id)):
        sweep = sweeps.get(trial.sweep_id)
        limit = trial.memory_limit_mb
        table.add_row(
            str(trial.trial_id),
            str(trial.sweep_id),
            render.NONE if trial.slot is None else str(trial.slot),
            render.NONE if limit is None else f"{limit:,} MiB",
            render.rate(trial.samples_per_s),
            render.params_text(params.get(trial.trial_id, {}), shown),
            render.NONE if sweep is None else render.visible(shlex.join(sweep.command)),
        )
    return table


def footer(health: Health, url: str, now: datetime) -> Text:
    """Queued and active trials over all sweeps, the daemon and the time of the frame."""
    return Text.assemble(
        (f"{health.queued_trials} queued", "bold" if health.queued_trials else "dim"),
        "  ",
        (f"{health.active_trials} active", "bold cyan" if health.active_trials else "dim"),
        (
            f"  gpumux {health.version} at {url}, {now.astimezone().strftime('%H:%M:%S')}",
            "dim",
        ),
    )


def top_view(
    devices: Sequence[DevicePublic],
    health: Health,
    *,
    sweeps: Mapping[int, SweepPublic],
    params: Mapping[int, Mapping[str, Any]],
    url: str,
    now: datetime,
) -> Group:
    """One frame: each device with its mix of sweeps and the trials packed on it, then the queue."""
    parts: list[RenderableType] = []
    for device in devices:
        parts.append(device_header(device))
        if device.mix:
            parts.append(mix_view(device.mix))
        if device.trials:
            parts.append(trials_view(device.trials, sweeps=sweeps, params=params))
        else:
            parts.append(Text("  no gpumux trial", style="dim"))
    if not devices:
        parts.append(Text("the daemon sees no device", style="yellow"))
    parts.append(footer(health, url, now))
    return Group(*parts)


def frame(client: Client, details: Details) -> Group:
    """Fetch the devices and the queue and render them."""
    devices = client.devices()
    health = client.health()
    details.update(devices)
    return top_view(
        devices,
        health,
        sweeps=details.sweeps,
        params=details.params,
        url=client.url,
        now=datetime.now(UTC),
    )


def top(
    ctx: typer.Context,
    interval: Annotated[
        float,
        typer.Option(
            min=0.1, max=MAX_INTERVAL_S, callback=finite, help="seconds between refreshes"
        ),
    ] = 2.0,
    once: Annotated[
        bool, typer.Option("--once", help="print one frame and exit (so does a pipe)")
    ] = False,
    url: Annotated[str | None, typer.Option(help="the daemon (default GPUMUX_URL)")] = None,
) -> None:
    """The devices, their mix of sweeps and their trials, every --interval (Ctrl-C quits)."""
    state = get_state(ctx)
    with connect(state, url) as client:
        details = Details(client)
        if once or not state.out.is_terminal:
            state.out.print(frame(client, details))
            return
        try:
            with Live(frame(client, details), console=state.out, auto_refresh=False) as live:
                while True:
                    time.sleep(interval)
                    live.update(frame(client, details), refresh=True)
        except KeyboardInterrupt:
            # Ctrl-C is how one leaves top: not an error, so exit 0 with the last frame shown.
            return
