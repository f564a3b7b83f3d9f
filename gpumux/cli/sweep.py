"""`gpumux sweep`: check the sweep locally, submit it, follow it to its final table."""

from __future__ import annotations

import os
from typing import Annotated

import typer
from pydantic import ValidationError
from rich.console import Console

from gpumux import sweepspec
from gpumux.cli import follow, render
from gpumux.cli.connect import Connection, daemon_for_sweep, find_daemon, wait_until_idle
from gpumux.cli.state import (
    EXIT_INTERRUPTED,
    EXIT_USAGE,
    CliError,
    CliState,
    get_state,
    validation_message,
)
from gpumux.client import Client, DaemonUnreachable
from gpumux.schemas import SweepCreate, SweepDetail, TrialPublic
from gpumux.status import SweepStatus, TrialStatus

NO_COMMAND = (
    "no command: write gpumux sweep PARAMS -- COMMAND, "
    "e.g. gpumux sweep lr=1e-3..1e-1 -- python train.py"
)
FINAL_TABLE_ROWS = 50
# SweepCreate's fields as the options that set them, for error messages.
OPTION_NAMES = {
    "name": "--name",
    "trials": "--trials",
    "seed": "--seed",
    "split": "--split",
    "objective": "--objective",
    "time_limit_s": "--time-limit",
    "retries": "--retries",
    "priority": "--priority",
}

SWEEP_HELP = """Run COMMAND once per point of the parameter space, packed onto every device.

PARAM forms: name=lo..hi (float range, log-uniform across orders of magnitude;
:log, :lin, :N grid points), name=2..6 (integers), name=a,b,c (a choice),
name=value (a constant). Each trial gets --name=value appended to COMMAND,
or its value in place of {name}, and all of them as JSON in GPUMUX_PARAMS.

The command runs in this directory with this environment (PATH, virtualenv).
When no daemon answers at --url, an embedded one runs for the length of this
command, on the default database.

Exit status: 0 when the sweep finished and at least one trial succeeded;
1 when every trial failed, the sweep was cancelled, or the daemon refused it;
2 for a malformed parameter, option or command (nothing is submitted);
130 on Ctrl-C (an external daemon keeps running the sweep).
"""


def command_env() -> dict[str, str]:
    """The submitter's environment minus gpumux's own variables (the daemon sets those)."""
    return {name: value for name, value in os.environ.items() if not name.startswith("GPUMUX_")}


def build_sweep(
    state: CliState,
    tokens: list[str],
    *,
    trials: int | None,
    seed: int | None,
    split: str,
    objective: str | None,
    name: str | None,
    time_limit: float | None,
    retries: int = 0,
    priority: int = 0,
) -> SweepCreate:
    """The sweep to submit, checked as the daemon would check it; CliError(exit 2) if not."""
    try:
        params = sweepspec.parse_params(tokens)
        if trials is None:
            size = sweepspec.grid_size(params)
            if size > state.settings.max_grid:
                raise sweepspec.GridTooLarge(size, state.settings.max_grid)
    except sweepspec.SpecError as error:
        raise CliError(str(error), EXIT_USAGE) from error
    command = state.command or []
    if not command:
        raise CliError(NO_COMMAND, EXIT_USAGE)
    if not command[0].strip():
        raise CliError(f"the command's first word is empty; {NO_COMMAND}", EXIT_USAGE)
    split_value: int | str = split
    if split != "auto":
        try:
            split_value = int(split)
        except ValueError:
            raise CliError(
                f"--split {split}: expected a number of trials per device or 'auto'", EXIT_USAGE
            ) from None
    try:
        return SweepCreate.model_validate(
            dict(
                name=name,
                params=tokens,
                command=command,
                workdir=os.getcwd(),
                env=command_env(),
                trials=trials,
                seed=seed,
                split=split_value,
                objective=objective,
                time_limit_s=time_limit,
                retries=retries,
                priority=priority,
            )
        )
    except ValidationError as error:
        message = validation_message(error, lambda field: OPTION_NAMES.get(field, field))
        raise CliError(message, EXIT_USAGE) from error


def final_report(console: Console, sweep: SweepDetail, trials: list[TrialPublic]) -> int:
    """Print the final table and the best trial; the exit status the sweep deserves."""
    took = render.duration(render.since(sweep.created_at, sweep.finished_at))
    console.print(
        f"sweep {sweep.id} {sweep.status} after {took}: {render.counts_text(sweep.counts)}"
    )
    ranked = render.rank_by_objective(trials, sweep.objective)
    console.print(render.trials_table(ranked[:FINAL_TABLE_ROWS], objective=sweep.objective))
    if len(ranked) > FINAL_TABLE_ROWS:
        rest = len(ranked) - FINAL_TABLE_ROWS
        console.print(f"... {rest} more trials: gpumux show {sweep.id} --all")
    best = render.best_text(sweep.best, sweep.objective)
    if best is not None:
        console.print(best)
    if sweep.status == SweepStatus.cancelled:
        return 1
    return 0 if sweep.counts.get(TrialStatus.succeeded, 0) else 1


def _follow_to_end(state: CliState, connection: Connection, sweep_id: int) -> int:
    client = connection.client
    try:
        sweep = follow.follow(client, sweep_id, state.out)
        code = final_report(state.out, sweep, client.all_trials(sweep_id))
        if connection.embedded is not None:
            wait_until_idle(state, client)
        return code
    except KeyboardInterrupt:
        if connection.embedded is None:
            state.note(
                f"stopped following; sweep {sweep_id} continues on {client.url}. "
                f"Follow it: gpumux show {sweep_id} --follow; cancel it: gpumux cancel {sweep_id}"
            )
        else:
            state.note(
                "interrupted: the embedded daemon stops its running trials and requeues them; "
                "they resume with the next gpumux sweep or gpumux serve"
            )
        return EXIT_INTERRUPTED


def sweep(
    ctx: typer.Context,
    params: Annotated[
        list[str] | None,
        typer.Argument(
            metavar="PARAM... -- COMMAND...",
            help="name=value, name=lo..hi, name=a,b,c",
            show_default=False,
        ),
    ] = None,
    trials: Annotated[
        int | None, typer.Option("--trials", min=1, help="random search with K trials")
    ] = None,
    seed: Annotated[int | None, typer.Option(min=0, help="seed of the random search")] = None,
    split: Annotated[str, typer.Option(help="trials per device: N or auto")] = "auto",
    objective: Annotated[
        str | None, typer.Option(help="METRIC:min or METRIC:max, ranks trials")
    ] = None,
    name: Annotated[str | None, typer.Option(help="a name to find the sweep by")] = None,
    time_limit: Annotated[
        float | None, typer.Option("--time-limit", help="seconds each trial may run")
    ] = None,
    retries: Annotated[
        int,
        typer.Option(
            help="reruns of a trial whose command fails (lost and out-of-memory trials are "
            "rerun anyway)"
        ),
    ] = 0,
    priority: Annotated[int, typer.Option(help="among your sweeps, higher runs first")] = 0,
    detach: Annotated[
        bool, typer.Option("--detach", help="submit and return at once (needs a daemon)")
    ] = False,
    url: Annotated[str | None, typer.Option(help="the daemon (default GPUMUX_URL)")] = None,
) -> None:
    """Run COMMAND once per point of the parameter space; its --help is SWEEP_HELP."""
    state = get_state(ctx)
    sweep_in = build_sweep(
        state,
        params or [],
        trials=trials,
        seed=seed,
        split=split,
        objective=objective,
        name=name,
        time_limit=time_limit,
        retries=retries,
        priority=priority,
    )
    target = state.resolve_url(url)
    if detach:
        with _detached_client(state, target) as client:
            created = _submit(state, client, sweep_in)
            state.note(
                f"follow: gpumux show {created.id} --follow; cancel: gpumux cancel {created.id}"
            )
        return
    with daemon_for_sweep(state, target) as connection:
        created = _submit(state, connection.client, sweep_in)
        code = _follow_to_end(state, connection, created.id)
    if code:
        raise typer.Exit(code)


def _detached_client(state: CliState, url: str) -> Client:
    try:
        return find_daemon(url, state.settings)
    except DaemonUnreachable as error:
        raise CliError(
            f"{error}; --detach needs a running daemon (gpumux serve), since an embedded "
            "one stops when this command ends"
        ) from error


def _submit(state: CliState, client: Client, sweep_in: SweepCreate) -> SweepDetail:
    created = client.create_sweep(sweep_in)
    label = f" ({created.name})" if created.name else ""
    queued = render.plural(created.trial_count, "trial")
    state.out.print(f"sweep {created.id}{label}: {queued} queued")
    return created
