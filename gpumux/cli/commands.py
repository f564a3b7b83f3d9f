"""The commands besides `sweep`: serve, ls, show, cancel, logs, best."""

from __future__ import annotations

import json
import logging
import shlex
import sys
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from gpumux.cli import curves, follow, glance, render, trialview
from gpumux.cli.connect import connect
from gpumux.cli.state import (
    EXIT_INTERRUPTED,
    EXIT_USAGE,
    CliError,
    CliState,
    build_settings,
    finite,
    get_state,
)
from gpumux.client import Client
from gpumux.config import URL_SCHEME
from gpumux.fields import MAX_ID
from gpumux.grammar import sweepspec
from gpumux.grammar.command import render_command
from gpumux.home.lockfile import DaemonError
from gpumux.status import SweepStatus, TrialStatus

SHOW_ROWS = 100
FAILURES_SHOWN = 3
LS_PAGE = 500
POLL_S = 0.5
# The largest TCP port: bind() overflows past it.
MAX_PORT = 65535

SweepRef = Annotated[
    str,
    typer.Argument(
        metavar="SWEEP",
        help="the sweep's id, or its --name (your newest sweep of that name); gpumux ls",
        show_default=False,
    ),
]
TrialId = Annotated[
    int,
    typer.Argument(
        metavar="TRIAL",
        help="the trial's id (gpumux show SWEEP)",
        min=1,
        max=MAX_ID,
        show_default=False,
    ),
]
Url = Annotated[str | None, typer.Option(metavar="URL", help="the daemon (default GPUMUX_URL)")]


def sweep_id_of(client: Client, sweep: str) -> int:
    """The id SWEEP names: a number is an id, other text the newest sweep of that name."""
    if sweep.isdecimal() and sweep.isascii():
        sweep_id = int(sweep)
        if not 1 <= sweep_id <= MAX_ID:
            raise CliError(f"sweep id {sweep} is out of range (1 to {MAX_ID})", EXIT_USAGE)
        return sweep_id
    found = client.list_sweeps(name=sweep, limit=1).data
    if not found:
        raise CliError(f"no sweep named {render.visible(sweep)!r}; gpumux ls lists your sweeps")
    return found[0].id


def serve(
    ctx: typer.Context,
    host: Annotated[
        str | None, typer.Option(metavar="ADDRESS", help="address to listen on (TCP)")
    ] = None,
    port: Annotated[
        int | None,
        typer.Option(metavar="PORT", min=0, max=MAX_PORT, help="port to listen on (TCP; 0: any)"),
    ] = None,
    uds: Annotated[
        Path | None,
        typer.Option(metavar="PATH", help="listen on this Unix socket instead", resolve_path=True),
    ] = None,
    db: Annotated[
        str | None,
        typer.Option(
            metavar="FILE|URL",
            help="the database: an SQLite file, or a URL postgresql+psycopg://USER@HOST/DB "
            "(GPUMUX_DB; default: GPUMUX_DATABASE_URL, else HOME/gpumux.db)",
        ),
    ] = None,
    home: Annotated[
        Path | None,
        typer.Option(metavar="DIR", help="data directory (GPUMUX_HOME)", resolve_path=True),
    ] = None,
    log_level: Annotated[
        str, typer.Option(metavar="LEVEL", help="debug, info, warning or error")
    ] = "info",
    stop_trials: Annotated[
        bool | None,
        typer.Option(
            "--stop-trials",
            help="on Ctrl-C or SIGTERM, also stop the running trials and requeue them "
            "(default: they run on, and the next daemon adopts them)",
            show_default=False,
        ),
    ] = None,
    leave_when_idle: Annotated[
        float | None,
        typer.Option(
            "--leave-when-idle",
            metavar="SECONDS",
            min=0,
            callback=finite,
            help="leave (a graceful stop, exit 0) once no trial has been queued or running on the "
            "whole database for this long: a batch job's node gives its GPUs back "
            "(GPUMUX_LEAVE_WHEN_IDLE; default: serve until stopped)",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Run the daemon in the foreground: the API and the scheduler (Ctrl-C or SIGTERM stops it).

    Running trials outlive it under their supervisors unless --stop-trials; a second Ctrl-C
    or SIGTERM kills them at once.
    """
    flags: dict[str, Any] = dict(
        host=host,
        port=port,
        uds=uds,
        # A URL is taken as given; a file is resolved here, against the current directory.
        db=db if db is None or URL_SCHEME.match(db) else Path(db).resolve(),
        home=home,
        stop_trials=stop_trials,
        leave_when_idle=leave_when_idle,
    )
    settings = build_settings(**{name: value for name, value in flags.items() if value is not None})
    level = logging.getLevelName(log_level.upper())
    if not isinstance(level, int):
        raise CliError(f"--log-level {log_level}: expected debug, info, warning or error", 2)
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if level > logging.DEBUG:
        # Alembic's INFO lines (plugins set up, DDL mode) tell an operator nothing.
        logging.getLogger("alembic").setLevel(logging.WARNING)
    try:
        get_state(ctx).runner.serve_forever(settings)
    except DaemonError as error:
        raise CliError(str(error)) from error


def ls(
    ctx: typer.Context,
    status: Annotated[
        SweepStatus | None,
        typer.Option(
            metavar="STATUS",
            help="only sweeps in this status: " + ", ".join(SweepStatus),
            show_default=False,
        ),
    ] = None,
    owner: Annotated[
        str | None, typer.Option(metavar="USER", help="only this user's sweeps")
    ] = None,
    all_: Annotated[bool, typer.Option("--all", help="every sweep, not the newest few")] = False,
    limit: Annotated[
        int,
        typer.Option(metavar="N", min=1, max=LS_PAGE, help=f"how many sweeps (at most {LS_PAGE})"),
    ] = 20,
    url: Url = None,
) -> None:
    """List sweeps, newest first, with their progress."""
    state = get_state(ctx)
    with connect(state, url) as client:
        page = client.list_sweeps(status=status, owner=owner, limit=LS_PAGE if all_ else limit)
        sweeps, count = page.data, page.count
        while all_ and page.data and len(sweeps) < count:
            page = client.list_sweeps(status=status, owner=owner, offset=len(sweeps), limit=LS_PAGE)
            sweeps.extend(page.data)
    if not sweeps:
        state.note("no sweeps" + (" match" if status or owner else " yet"))
        return
    state.out.print(render.sweeps_table(sweeps))
    if len(sweeps) < count:
        state.note(f"{len(sweeps)} of {count} sweeps shown; --all or --limit N for more")


def show(
    ctx: typer.Context,
    sweep_ref: Annotated[
        str | None,
        typer.Argument(
            metavar="SWEEP",
            help="the sweep's id, or its --name (your newest sweep of that name); gpumux ls",
            show_default=False,
        ),
    ] = None,
    trial_id: Annotated[
        int | None,
        typer.Option(
            "--trial",
            metavar="TRIAL",
            min=1,
            max=MAX_ID,
            help="show this trial instead, whole: its parameters exact, its reason in full",
            show_default=False,
        ),
    ] = None,
    follow_: Annotated[
        bool, typer.Option("--follow", "-f", help="follow its progress until it ends first")
    ] = False,
    all_: Annotated[
        bool, typer.Option("--all", help=f"every trial, not the first {SHOW_ROWS}")
    ] = False,
    url: Url = None,
) -> None:
    """A sweep's settings, counts by status, best trial, learning curves, trials, and why trials
    failed; or one trial whole (--trial)."""
    state = get_state(ctx)
    if (sweep_ref is None) == (trial_id is None):
        raise CliError("show SWEEP or show --trial TRIAL: give one of them", EXIT_USAGE)
    with connect(state, url) as client:
        if trial_id is not None:
            trial = client.get_trial(trial_id)
            sweep = client.get_sweep(trial.sweep_id)
            state.out.print(trialview.trial_summary(trial, sweep.objective))
            return
        assert sweep_ref is not None
        sweep_id = sweep_id_of(client, sweep_ref)
        if follow_:
            _follow_or_interrupt(state, client, sweep_id)
        sweep = client.get_sweep(sweep_id)
        if all_:
            trials = client.all_trials(sweep_id)
            count = len(trials)
        else:
            page = client.list_trials(sweep_id, limit=SHOW_ROWS)
            trials, count = page.data, page.count
        failed = client.list_trials(sweep_id, status=TrialStatus.failed, limit=FAILURES_SHOWN)
        chart = curves.learning_chart(sweep, trials, curves.fetch_curves(client, sweep, trials))
    out = state.out
    out.print(render.sweep_summary(sweep))
    for profile in sweep.profiles:
        out.print(render.search_text(profile))
    shown = glance.ShortValues.of(trials)
    best = render.best_text(sweep, shown)
    if best is not None:
        out.print(best)
    if chart is not None:
        out.print(chart)
    out.print(render.trials_table(trials, objective=sweep.objective))
    # An adaptive sweep's trial_count is its budget: only the trials it asked exist to list.
    if len(trials) < count:
        out.print(f"... {count - len(trials)} more trials: --all")
    dropped = render.dropped_reports(trials)
    if dropped is not None:
        out.print(dropped)
    errors = render.failures(failed.data, total=failed.count)
    if errors is not None:
        out.print(errors)


def _follow_or_interrupt(state: CliState, client: Client, sweep_id: int) -> None:
    try:
        follow.follow(client, sweep_id, state.out)
    except KeyboardInterrupt:
        state.note(f"stopped following; sweep {sweep_id} goes on")
        raise typer.Exit(EXIT_INTERRUPTED) from None


def cancel(
    ctx: typer.Context,
    sweep_ref: SweepRef,
    no_wait: Annotated[
        bool, typer.Option("--no-wait", help="ask for the cancel and return at once")
    ] = False,
    url: Url = None,
) -> None:
    """Cancel a sweep: drop its queued trials, stop its running ones, and wait for that."""
    state = get_state(ctx)
    with connect(state, url) as client:
        sweep_id = sweep_id_of(client, sweep_ref)
        sweep = client.cancel_sweep(sweep_id)
        if follow.sweep_ended(sweep) and sweep.status != SweepStatus.cancelled:
            state.note(f"sweep {sweep_id} already {sweep.status}; nothing to cancel")
            return
        if no_wait and not follow.sweep_ended(sweep):
            state.out.print(f"sweep {sweep_id}: cancel requested")
            return
        try:
            with state.err.status(f"cancelling sweep {sweep_id}: stopping its trials"):
                while not follow.sweep_ended(sweep):
                    time.sleep(POLL_S)
                    sweep = client.get_sweep(sweep_id)
        except KeyboardInterrupt:
            state.note(f"stopped waiting; the daemon goes on cancelling sweep {sweep_id}")
            raise typer.Exit(EXIT_INTERRUPTED) from None
    state.out.print(f"sweep {sweep_id} {sweep.status}: {render.counts_text(sweep.counts)}")


def logs(
    ctx: typer.Context,
    trial_id: TrialId,
    follow_: Annotated[
        bool, typer.Option("--follow", "-f", help="keep printing until the trial ends")
    ] = False,
    url: Url = None,
) -> None:
    """Print a trial's output (stdout and stderr); -f follows it until the trial ends."""
    state = get_state(ctx)
    with connect(state, url) as client:
        try:
            size = _print_log(client, trial_id, follow=follow_)
        except KeyboardInterrupt:
            raise typer.Exit(EXIT_INTERRUPTED) from None
        if size == 0 and not follow_:
            trial = client.get_trial(trial_id)
            state.note(f"trial {trial_id} is {trial.status}; its log is empty")


def _print_log(client: Client, trial_id: int, *, follow: bool) -> int:
    """Write the trial's log to stdout (until the trial ends, if `follow`); its size."""
    offset, attempt = 0, None
    while True:
        chunk = client.get_log(trial_id, offset)
        if attempt is not None and chunk.attempt != attempt:
            # Requeued: the new attempt writes a new log file, so start from its beginning.
            sys.stdout.write(f"--- gpumux: attempt {chunk.attempt} ---\n")
            offset, attempt = 0, chunk.attempt
            continue
        attempt = chunk.attempt
        if chunk.skipped:
            sys.stdout.write(f"--- gpumux: {chunk.skipped} bytes rotated away unread ---\n")
        sys.stdout.write(chunk.data)
        sys.stdout.flush()
        offset = chunk.next_offset
        if offset < chunk.size:
            continue
        if chunk.complete or not follow:
            return chunk.size
        time.sleep(POLL_S)


def best(
    ctx: typer.Context,
    sweep_ref: SweepRef,
    as_json: Annotated[bool, typer.Option("--json", help="print JSON, for scripts")] = False,
    quiet: Annotated[
        bool,
        typer.Option("--quiet", "-q", help="print the trial's id alone: gpumux logs $(...)"),
    ] = False,
    url: Url = None,
) -> None:
    """The best trial of a sweep by its objective: parameters, value, command line."""
    state = get_state(ctx)
    with connect(state, url) as client:
        sweep_id = sweep_id_of(client, sweep_ref)
        sweep = client.get_sweep(sweep_id)
    if sweep.objective is None:
        raise CliError(
            f"sweep {sweep_id} has no objective; submit it with --objective METRIC:min "
            "or METRIC:max to rank its trials"
        )
    metric, mode = sweep.objective
    trial = sweep.best
    if trial is None or trial.objective is None:
        raise CliError(
            f"no trial of sweep {sweep_id} has reported {metric} yet "
            f"({render.counts_text(sweep.counts)}); a trial reports it with "
            f"gpumux.runtime.report({metric}=...) or as a Keras metric"
        )
    if quiet:
        sys.stdout.write(f"{trial.id}\n")
        return
    argv = render_command(sweep.command, trial.params)
    if as_json:
        document = dict(
            sweep=sweep_id,
            trial=trial.id,
            objective={metric: trial.objective, "mode": mode},
            params=trial.params,
            command=argv,
        )
        sys.stdout.write(json.dumps(document, indent=2) + "\n")
        return
    out = state.out
    out.print(
        f"trial {trial.id} of sweep {sweep_id}: {metric}={render.number(trial.objective)} "
        f"({mode} of {render.finished_count(sweep.counts)} finished trials)",
    )
    for name, value in trial.params.items():
        out.print(render.visible(f"  {name}={sweepspec.format_value(value)}"))
    out.print(f"command: {render.visible(shlex.join(argv))}")
