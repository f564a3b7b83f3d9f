"""`gpumux tune`: the SHARCNET experiment as one command: throughput of a workload at each N."""

from __future__ import annotations

import importlib.util
import os
import shlex
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import ValidationError

from gpumux.cli import plot
from gpumux.cli.state import (
    EXIT_INTERRUPTED,
    EXIT_USAGE,
    CliError,
    CliState,
    build_settings,
    finite,
    get_state,
    validation_message,
)
from gpumux.cli.sweep import OPTION_NAMES, command_env, require_utf8
from gpumux.cli.tune_result import HostLoad, report
from gpumux.cli.tune_run import run_rounds
from gpumux.client import Client
from gpumux.devices.probes import NvmlProbe, NvmlUnavailable
from gpumux.devices.snapshot import DeviceSnapshot, is_visible, visible_gpus
from gpumux.fields import MAX_SPLIT
from gpumux.home.layout import Layout
from gpumux.home.lockfile import DaemonError
from gpumux.schemas.devices import DevicePublic
from gpumux.schemas.sweeps import SweepCreate
from gpumux.search import planning
from gpumux.splits.curve import SEQUENCE

DEFAULT_SPLITS = tuple(n for n in SEQUENCE if n <= 8)
NO_COMMAND = (
    "no command: write gpumux tune [OPTIONS] -- COMMAND, e.g. gpumux tune -- python train.py"
)


def parse_splits(text: str | None) -> list[int]:
    """The N values of --splits, ascending and without repeats; CliError (exit 2) if malformed."""
    if text is None:
        return list(DEFAULT_SPLITS)
    splits = set()
    for word in text.split(","):
        try:
            split = int(word.strip())
        except ValueError:
            raise CliError(
                f"--splits {text}: expected numbers separated by commas, e.g. 1,2,3,5,8",
                EXIT_USAGE,
            ) from None
        if not 1 <= split <= MAX_SPLIT:
            raise CliError(f"--splits: N={split} is not between 1 and {MAX_SPLIT}", EXIT_USAGE)
        splits.add(split)
    return sorted(splits)


def choose_gpu(
    requested: str | None, *, visible: str | None, nvml: Any | None = None
) -> str | None:
    """--gpu's GPU, else the first `visible` one, by UUID; None without a GPU (the CPU is used)."""
    probe = NvmlProbe(nvml)
    try:
        gpus = probe.snapshot()
    except NvmlUnavailable:
        gpus = []
    finally:
        probe.close()
    if requested is None:
        shown = [gpu for gpu in gpus if is_visible(gpu, visible)]
        return _gpu_id(shown[0]) if shown else None
    if not gpus:
        return None
    matches = [gpu for gpu in gpus if "," not in requested and is_visible(gpu, requested)]
    if len(matches) != 1:
        present = "; ".join(f"{gpu.index} ({gpu.uuid or 'no UUID'}, {gpu.name})" for gpu in gpus)
        raise CliError(
            f"--gpu {requested}: expected the index or UUID of one GPU of this host: {present}",
            EXIT_USAGE,
        )
    return _gpu_id(matches[0])


def _gpu_id(gpu: DeviceSnapshot) -> str:
    return gpu.uuid if gpu.uuid is not None else str(gpu.index)


def build_rounds(
    command: list[str], splits: Sequence[int], *, rounds: int, time_limit: float | None
) -> list[SweepCreate]:
    """One sweep per N: R x N copies of the bare command, checked as the daemon would."""
    if not command:
        raise CliError(NO_COMMAND, EXIT_USAGE)
    env, workdir = command_env(), os.getcwd()
    require_utf8(env, workdir)
    sweeps = []
    for split in splits:
        try:
            sweeps.append(
                SweepCreate(
                    name=f"tune N={split}",
                    params=[],
                    command=command,
                    workdir=workdir,
                    env=env,
                    trials=rounds * split,
                    split=split,
                    time_limit_s=time_limit,
                )
            )
        except ValidationError as error:
            message = validation_message(error, lambda field: OPTION_NAMES.get(field, field))
            raise CliError(message, EXIT_USAGE) from error
    try:
        # Before a daemon of tune's own starts: a `{name}` no parameter fills, say.
        planning.check_sweep(sweeps[0])
    except planning.PlanError as error:
        raise CliError(str(error), EXIT_USAGE) from error
    return sweeps


def _check_png(png: Path) -> None:
    """Refuse a PNG that cannot be written before spending minutes measuring."""
    if importlib.util.find_spec("matplotlib") is None:
        raise CliError(f"--png needs matplotlib: {plot.plot_install()}", EXIT_USAGE)
    if not png.parent.is_dir():
        raise CliError(f"--png {png}: no directory {png.parent}", EXIT_USAGE)


def _device(client: Client) -> DevicePublic:
    """The one device the daemon of its own measures on."""
    devices = client.devices()
    if not devices:
        raise CliError("the daemon of gpumux tune sees no device to measure on")
    return devices[0]


def tune(
    ctx: typer.Context,
    words: Annotated[
        list[str] | None,
        typer.Argument(
            metavar="-- COMMAND...",
            help="the workload, after --; it runs as a gpumux trial in this directory and "
            "environment. Exit status 0 when some N succeeded, 1 when every N failed",
            show_default=False,
        ),
    ] = None,
    splits: Annotated[
        str | None,
        typer.Option(
            help=f"the N to measure (default {','.join(map(str, DEFAULT_SPLITS))})",
            show_default=False,
        ),
    ] = None,
    rounds: Annotated[
        int, typer.Option(min=1, help="each N runs ROUNDS x N copies of the command")
    ] = 1,
    gpu: Annotated[
        str | None,
        typer.Option(help="index or UUID of the GPU (default the first; without GPUs the CPU)"),
    ] = None,
    time_limit: Annotated[
        float | None,
        typer.Option("--time-limit", callback=finite, help="seconds each trial may run"),
    ] = None,
    png: Annotated[
        Path | None, typer.Option(help="also draw the curve into this PNG file (needs matplotlib)")
    ] = None,
    keep: Annotated[
        bool, typer.Option("--keep", help="keep the temporary database and trial logs")
    ] = False,
) -> None:
    """Throughput of N copies of COMMAND at once on one device, per N, on a temporary database."""
    state = get_state(ctx)
    if words:
        raise CliError(f"put -- before the command: gpumux tune -- {shlex.join(words)}", EXIT_USAGE)
    sweeps = build_rounds(
        state.command or [], parse_splits(splits), rounds=rounds, time_limit=time_limit
    )
    if png is not None:
        _check_png(png)
    # Starting a daemon, probing the devices and migrating a database take seconds on a loaded
    # host: say so before any of it.
    state.note("starting a daemon of its own on a temporary database")
    if state.settings.simulated_gpu is not None:
        # Its daemon serves the simulated GPU alone, whatever GPUs the host has.
        chosen = None
        if gpu is not None:
            state.note(f"GPUMUX_SIMULATED_GPU is set: --gpu {gpu} ignored")
    else:
        chosen = choose_gpu(gpu, visible=visible_gpus(state.settings.gpus, os.environ))
    if gpu is not None and chosen is None and state.settings.simulated_gpu is None:
        state.note(f"no GPU on this host: --gpu {gpu} ignored; measuring on the CPU")
    home = Path(tempfile.mkdtemp(prefix="gpumux-tune-"))
    try:
        code = _measure(state, sweeps, home=home, gpu=chosen, rounds=rounds, png=png)
    finally:
        if keep:
            state.note(f"kept {home}: the database and the trials' logs")
        else:
            shutil.rmtree(home, ignore_errors=True)
    if code:
        raise typer.Exit(code)


def _measure(
    state: CliState,
    sweeps: Sequence[SweepCreate],
    *,
    home: Path,
    gpu: str | None,
    rounds: int,
    png: Path | None,
) -> int:
    # A daemon of its own on a fresh database: the user's queue, daemon and profiles are untouched.
    settings = build_settings(
        home=home,
        db=None,
        database_url="",
        url=f"unix:{Layout(home).socket}",
        uds=None,
        gpus=gpu,
        split_search=False,
    )
    load = HostLoad()
    try:
        with state.runner.embedded(settings) as running, Client(running.url) as client:
            device = _device(client)
            each = "N copies" if rounds == 1 else f"{rounds} x N copies"
            state.note(
                f"measuring N={','.join(str(s.split) for s in sweeps)} on {device.name} "
                f"({device.key}), {each} of the command at each N"
            )
            try:
                measured = run_rounds(
                    state, client, sweeps, load, work_cores=device.work_cores, rounds=rounds,
                    gates=home / "gates",
                )  # fmt: skip
            except KeyboardInterrupt:
                state.note("interrupted: stopping the trials")
                raise
            # The result before the daemon of its own stops: every trial has ended, and the
            # user need not wait for its shutdown to read it.
            return report(state, measured, device=device, load=load, png=png)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except DaemonError as error:
        raise CliError(str(error)) from error
