"""`gpumux sweep`: check the sweep locally, submit it, follow it to its final table."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer
from pydantic import ValidationError
from rich.console import Console

from gpumux.cli import follow, glance, render
from gpumux.cli.connect import Connection, daemon_for_sweep, find_daemon, wait_until_idle
from gpumux.cli.state import (
    EXIT_INTERRUPTED,
    EXIT_USAGE,
    CliError,
    CliState,
    finite,
    get_state,
    not_utf8,
    validation_message,
)
from gpumux.client import Client, DaemonUnreachable
from gpumux.grammar import sweepfile
from gpumux.grammar.sweepplan import Objective, parse_objective
from gpumux.schemas.sweeps import SweepCreate, SweepDetail
from gpumux.schemas.trials import TrialPublic
from gpumux.search import planning
from gpumux.status import SweepStatus, TrialStatus

NO_COMMAND = (
    "no command: write gpumux sweep PARAMS -- COMMAND, "
    "e.g. gpumux sweep lr=1e-3..1e-1 -- python train.py (or --config sweep.yaml)"
)
FINAL_TABLE_ROWS = 50
# SweepCreate's fields as the options that set them, for error messages.
OPTION_NAMES = {
    "name": "--name",
    "trials": "--trials",
    "search": "--search",
    "prune": "--prune",
    "seed": "--seed",
    "split": "--split",
    "metric": "--objective",
    "mode": "--objective",
    "time_limit_s": "--time-limit",
    "retries": "--retries",
    "priority": "--priority",
    "preload": "--preload",
}

SWEEP_HELP = """Run COMMAND once per point of the parameter space, packed onto every device.

PARAM forms: name=lo..hi (float range, log-uniform across orders of magnitude;
:log, :lin, :N grid points), name=2..6 (integers), name=a,b,c (a choice),
name=value (a constant). Each trial gets --name=value appended to COMMAND,
or its value in place of {name}, and all of them as JSON in GPUMUX_PARAMS.

--config FILE reads a W&B sweep file (method, metric, parameters,
early_terminate, run_cap, program, command; a key gpumux cannot honour is
refused). The command line overrides the file: --search over method, --trials
over run_cap, --objective over metric, --prune over early_terminate, --name
over name; a PARAM replaces the file's parameter of that name or adds one; a
COMMAND after -- replaces the file's program and command.

The command runs in this directory with this environment (PATH, virtualenv).
When no daemon answers at --url, an embedded one runs for the length of this
command, on the default database.

Exit status: 0 when the sweep finished and at least one trial succeeded;
1 when every trial failed, the sweep was cancelled, or the daemon refused it;
2 for a malformed parameter, option, command or sweep file (nothing is
submitted);
130 on Ctrl-C (an external daemon keeps running the sweep).
"""


def command_env() -> dict[str, str]:
    """The submitter's environment minus gpumux's own variables (the daemon sets those)."""
    return {name: value for name, value in os.environ.items() if not name.startswith("GPUMUX_")}


def require_utf8(env: dict[str, str], workdir: str) -> None:
    """CliError (exit 2) when the trials' environment or directory is not valid UTF-8: the
    daemon takes them as JSON text, and bytes changed on the way would run another command."""
    for name, value in env.items():
        shown = not_utf8(name) or (not_utf8(value) and name)
        if shown:
            raise CliError(
                f"the environment variable {shown} is not valid UTF-8; gpumux hands the "
                "environment to trials as UTF-8 text: unset it or give it a UTF-8 value",
                EXIT_USAGE,
            )
    shown = not_utf8(workdir)
    if shown is not None:
        raise CliError(
            f"this directory's path {shown} is not valid UTF-8; run gpumux from a "
            "directory whose path is",
            EXIT_USAGE,
        )


def objective_option(text: str | None) -> Objective | None:
    """--objective METRIC:MODE read once; CliError (exit 2) saying the form."""
    try:
        return parse_objective(text) if text is not None else None
    except ValueError as error:
        raise CliError(f"--objective: {error}", EXIT_USAGE) from error


def from_sweep_file(state: CliState, path: Path, given: sweepfile.Resolved) -> sweepfile.Resolved:
    """The sweep file at `path` with the command line over it; its notes printed on stderr."""
    try:
        sweep_file = sweepfile.read(path, env=command_env())
        resolved = sweepfile.resolve(
            sweep_file,
            tokens=given.params,
            command=given.command,
            search=given.search,
            trials=given.trials,
            objective=given.objective,
            prune=given.prune,
            name=given.name,
        )
    except sweepfile.SweepFileError as error:
        raise CliError(str(error), EXIT_USAGE) from error
    for note in sweep_file.notes:
        state.note(note)
    return resolved


def build_sweep(
    state: CliState,
    what: sweepfile.Resolved,
    *,
    seed: int | None,
    split: str,
    time_limit: float | None,
    retries: int = 0,
    priority: int = 0,
    preload: bool = False,
) -> SweepCreate:
    """The sweep to submit, planned as the daemon plans it; CliError(exit 2) if it cannot be."""
    command = what.command
    if not command:
        raise CliError(NO_COMMAND, EXIT_USAGE)
    split_value: int | str = split
    if split != "auto":
        try:
            split_value = int(split)
        except ValueError:
            raise CliError(
                f"--split {split}: expected a number of trials per device or 'auto'", EXIT_USAGE
            ) from None
    env, workdir = command_env(), os.getcwd()
    require_utf8(env, workdir)
    try:
        sweep_in = SweepCreate.model_validate(
            dict(
                name=what.name,
                params=what.params,
                command=command,
                workdir=workdir,
                env=env,
                trials=what.trials,
                search=what.search,
                prune=what.prune,
                seed=seed,
                split=split_value,
                metric=what.objective.metric if what.objective else None,
                mode=what.objective.mode if what.objective else None,
                time_limit_s=time_limit,
                retries=retries,
                priority=priority,
                preload=preload,
            )
        )
    except ValidationError as error:
        message = validation_message(error, lambda field: OPTION_NAMES.get(field, field))
        raise CliError(message, EXIT_USAGE) from error
    try:
        planning.check_sweep(sweep_in)
    except planning.PlanError as error:
        raise CliError(str(error), EXIT_USAGE) from error
    return sweep_in


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
    best = render.best_text(sweep, glance.ShortValues.of(trials))
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


ConfigOption = Annotated[
    Path | None,
    typer.Option(
        metavar="FILE",
        help="a W&B sweep file (YAML or JSON); the command line overrides it (see above)",
        show_default=False,
    ),
]
TrialsOption = Annotated[
    int | None,
    typer.Option(
        "--trials", metavar="N", min=1, help="random draws, or the budget of an adaptive search"
    ),
]
SearchOption = Annotated[
    str | None,
    typer.Option(
        metavar="METHOD",
        help="grid or random (chosen at submission), or tpe, gp, cmaes, qmc (Optuna picks each "
        "next trial as a slot frees; needs --trials and --objective), Optuna's options after a "
        "colon (tpe:n_startup_trials=4); default grid, or random with --trials",
        show_default=False,
    ),
]
PruneOption = Annotated[
    str | None,
    typer.Option(
        metavar="SPEC",
        help="stop losing trials at a report: none, median, asha or hyperband, Optuna's options "
        "after a colon (asha:min_resource=2,reduction_factor=3); needs --objective",
        show_default=False,
    ),
]


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
    config: ConfigOption = None,
    trials: TrialsOption = None,
    search: SearchOption = None,
    prune: PruneOption = None,
    seed: Annotated[
        int | None, typer.Option(metavar="N", min=0, help="seed of the random search")
    ] = None,
    split: Annotated[
        str, typer.Option(metavar="N|auto", help="trials per device: N or auto")
    ] = "auto",
    objective: Annotated[
        str | None,
        typer.Option(metavar="METRIC:MODE", help="METRIC:min or METRIC:max, ranks trials"),
    ] = None,
    name: Annotated[
        str | None, typer.Option(metavar="NAME", help="a name to find the sweep by")
    ] = None,
    time_limit: Annotated[
        float | None,
        typer.Option(
            "--time-limit", metavar="SECONDS", callback=finite, help="seconds each trial may run"
        ),
    ] = None,
    retries: Annotated[
        int,
        typer.Option(
            metavar="N",
            help="reruns of a trial whose command fails (lost and out-of-memory trials are "
            "rerun anyway)",
        ),
    ] = 0,
    priority: Annotated[
        int, typer.Option(metavar="N", help="among your sweeps, higher runs first")
    ] = 0,
    preload: Annotated[
        bool,
        typer.Option(
            "--preload",
            help="start each `python script.py` trial from a helper that has already imported "
            "the framework (the daemon's GPUMUX_PRELOAD, tensorflow,keras by default): "
            "seconds less per trial; other commands start as usual",
        ),
    ] = False,
    detach: Annotated[
        bool, typer.Option("--detach", help="submit and return at once (needs a daemon)")
    ] = False,
    url: Annotated[
        str | None, typer.Option(metavar="URL", help="the daemon (default GPUMUX_URL)")
    ] = None,
) -> None:
    """Run COMMAND once per point of the parameter space; its --help is SWEEP_HELP."""
    state = get_state(ctx)
    what = sweepfile.Resolved(
        params=params or [],
        command=state.command or [],
        search=search,
        trials=trials,
        objective=objective_option(objective),
        prune=prune,
        name=name,
    )
    if config is not None:
        what = from_sweep_file(state, config, what)
    sweep_in = build_sweep(
        state,
        what,
        seed=seed,
        split=split,
        time_limit=time_limit,
        retries=retries,
        priority=priority,
        preload=preload,
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
    trials = render.plural(created.trial_count, "trial")
    if created.search.adaptive:
        state.out.print(f"sweep {created.id}{label}: a {created.search} search of {trials}")
    else:
        state.out.print(f"sweep {created.id}{label}: {trials} queued")
    return created
