"""`gpumux export SWEEP --optuna URL`: a sweep written as an Optuna study, for Optuna's tools.

It runs in the CLI's process, as the user who asks: the daemon (root, maybe) never writes to a
place a user names. Optuna is imported inside the command and the conversion, not at the top,
so that other commands start without paying for it.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Annotated, Any, Literal

import typer

from gpumux.cli.commands import SweepRef, Url, sweep_id_of
from gpumux.cli.connect import connect
from gpumux.cli.state import EXIT_USAGE, CliError, get_state
from gpumux.client import Client
from gpumux.grammar import sweepspec
from gpumux.schemas.reports import ReportPublic
from gpumux.schemas.sweeps import SweepPublic
from gpumux.schemas.trials import TrialPublic
from gpumux.search.space import load_optuna
from gpumux.status import ObjectiveMode, SearchMethod, TrialStatus

if TYPE_CHECKING:
    from optuna.distributions import BaseDistribution
    from optuna.storages import RDBStorage
    from optuna.trial import FrozenTrial

STUDY_PREFIX = "gpumux-sweep-"
# Each gpumux status as the Optuna state of the same meaning. A succeeded trial without an
# objective value is a FAIL, as Optuna records an objective function that returned nothing.
STATES = {
    TrialStatus.succeeded: "COMPLETE",
    TrialStatus.pruned: "PRUNED",
    TrialStatus.failed: "FAIL",
    TrialStatus.lost: "FAIL",
    TrialStatus.cancelled: "FAIL",
    TrialStatus.starting: "RUNNING",
    TrialStatus.running: "RUNNING",
}


def study_name_of(sweep_id: int) -> str:
    """The study's default name: gpumux-sweep-ID."""
    return f"{STUDY_PREFIX}{sweep_id}"


def objective_of(sweep: SweepPublic) -> tuple[str, Literal["minimize", "maximize"]]:
    """The objective's metric and Optuna's direction; CliError for a sweep without one."""
    if sweep.objective is None:
        raise CliError(
            f"sweep {sweep.id} has no objective, and an Optuna study needs a value to optimise; "
            "only a sweep submitted with --objective METRIC:min or METRIC:max can be exported",
            EXIT_USAGE,
        )
    metric, mode = sweep.objective
    return metric, "minimize" if mode == ObjectiveMode.min else "maximize"


def distributions_for(sweep: SweepPublic) -> dict[str, BaseDistribution]:
    """The distribution each searched parameter of the sweep was drawn from."""
    from gpumux.search.space import distributions_of

    params = sweepspec.parse_params(sweep.params)
    if sweep.search == SearchMethod.random:
        # A random search draws a range's values over the whole range, its :N points aside.
        params = [dataclasses.replace(param, points=None) for param in params]
    return distributions_of(params)


def intermediate_values(
    trial: TrialPublic, reports: Sequence[ReportPublic], metric: str
) -> dict[int, float]:
    """The objective metric at each step the trial's current attempt reported (the last wins)."""
    values: dict[int, float] = {}
    for report in reports:
        if report.attempt == trial.attempt and report.step is not None:
            if metric in report.metrics:
                values[report.step] = report.metrics[metric]
    return values


def started(trial: TrialPublic) -> bool:
    """The trial was ever launched: queued ones, and ones cancelled in the queue, never were."""
    return trial.status in STATES and not (
        trial.status == TrialStatus.cancelled and trial.started_at is None
    )


def frozen_trial(
    trial: TrialPublic,
    reports: Sequence[ReportPublic],
    distributions: Mapping[str, BaseDistribution],
    metric: str,
) -> FrozenTrial:
    """One started trial as Optuna records it: state, value, steps, parameters, gpumux's facts."""
    from optuna.trial import TrialState, create_trial

    steps = intermediate_values(trial, reports, metric)
    state = TrialState[STATES[trial.status]]
    value: float | None = None
    attrs = gpumux_attrs(trial)
    if state == TrialState.COMPLETE:
        value = trial.objective
        if value is None:
            state = TrialState.FAIL
            attrs["gpumux_error"] = f"it ended without reporting {metric}"
    elif state == TrialState.PRUNED and steps:
        # As Optuna's own tell does: a pruned trial's value is its last intermediate value.
        value = steps[max(steps)]
    searched = {name: dist for name, dist in distributions.items() if name in trial.params}
    constants = {name: v for name, v in trial.params.items() if name not in searched}
    try:
        frozen = create_trial(
            state=state,
            value=value,
            params={name: trial.params[name] for name in searched},
            distributions=searched,
            user_attrs={**constants, **attrs},
            intermediate_values=steps,
        )
    except ValueError as error:
        raise CliError(f"trial {trial.id} cannot be written as an Optuna trial: {error}") from error
    start = trial.started_at or trial.queued_at
    frozen.datetime_start = optuna_time(start)
    if state.is_finished():
        frozen.datetime_complete = optuna_time(trial.ended_at or start)
    return frozen


def gpumux_attrs(trial: TrialPublic) -> dict[str, Any]:
    """What gpumux knows of a trial that Optuna has no field for."""
    attrs: dict[str, Any] = {
        "gpumux_trial_id": trial.id,
        "gpumux_status": str(trial.status),
        "gpumux_attempt": trial.attempt,
        "gpumux_exit_code": trial.exit_code,
        "gpumux_signal": trial.signal,
        "gpumux_error": trial.error,
        "gpumux_step": trial.step,
        "gpumux_samples_per_s": trial.samples_per_s,
    }
    return {name: value for name, value in attrs.items() if value is not None}


def optuna_time(moment: datetime) -> datetime:
    """A timestamp as Optuna keeps them: local time, without a zone."""
    return moment.astimezone().replace(tzinfo=None)


def study_trials(
    sweep: SweepPublic,
    trials: Sequence[TrialPublic],
    reports: Mapping[int, Sequence[ReportPublic]],
) -> list[FrozenTrial]:
    """Every started trial of the sweep, in its order, as Optuna trials (pure: no I/O).

    `reports` holds each trial's reports by trial id (none for a trial left out).
    """
    metric, _ = objective_of(sweep)
    distributions = distributions_for(sweep)
    ordered = sorted((trial for trial in trials if started(trial)), key=lambda t: t.number)
    return [frozen_trial(t, reports.get(t.id, ()), distributions, metric) for t in ordered]


def fetch(
    client: Client, sweep_id: int
) -> tuple[SweepPublic, list[TrialPublic], dict[int, list[ReportPublic]]]:
    """The sweep, its trials, and the reports of the started trials that reported anything."""
    sweep = client.get_sweep(sweep_id)
    objective_of(sweep)
    trials = client.all_trials(sweep_id)
    reports = {
        trial.id: client.all_reports(trial.id)
        for trial in trials
        if started(trial) and trial.last_report_at is not None
    }
    return sweep, trials, reports


def open_storage(url: str) -> RDBStorage:
    """Optuna's storage at `url`; CliError saying what a URL looks like when it cannot open."""
    import optuna

    # Any error here is about the URL (no such scheme or driver, a file that is no database, a
    # directory not writable); they come as SQLAlchemy's, which the CLI may not import.
    try:
        return optuna.storages.RDBStorage(url)
    except Exception as error:
        reason = str(error).splitlines()[0]
        raise CliError(
            f"--optuna {url}: Optuna cannot open this storage ({reason}); give a database URL "
            "such as sqlite:///study.db",
            EXIT_USAGE,
        ) from error


def write_study(
    storage: RDBStorage,
    sweep: SweepPublic,
    frozen: Sequence[FrozenTrial],
    *,
    name: str,
    overwrite: bool,
) -> None:
    """Create the study `name` in `storage` holding `frozen`; CliError if it exists already."""
    import optuna

    if name in optuna.study.get_all_study_names(storage):
        if not overwrite:
            raise CliError(
                f"the study {name!r} already exists in {storage.url}; name another with "
                "--study-name NAME, or replace it with --overwrite",
                EXIT_USAGE,
            )
        optuna.delete_study(study_name=name, storage=storage)
    _, direction = objective_of(sweep)
    study = optuna.create_study(storage=storage, study_name=name, direction=direction)
    try:
        for key, value in study_attrs(sweep).items():
            study.set_user_attr(key, value)
        study.add_trials(frozen)
    except BaseException:
        # Half a study would pass for the whole sweep: leave none.
        optuna.delete_study(study_name=name, storage=storage)
        raise


def study_attrs(sweep: SweepPublic) -> dict[str, Any]:
    """The sweep's settings, kept on the study; its objective as its metric and mode, as the API
    carries it."""
    objective = sweep.objective
    return {
        "gpumux_sweep_id": sweep.id,
        "gpumux_command": sweep.command,
        "gpumux_params": sweep.params,
        "gpumux_search": str(sweep.search),
        "gpumux_prune": sweep.prune,
        "gpumux_seed": sweep.seed,
        "gpumux_objective_metric": objective.metric if objective else None,
        "gpumux_objective_mode": str(objective.mode) if objective else None,
        "gpumux_budget": sweep.trial_count,
    }


def summary(frozen: Sequence[FrozenTrial]) -> str:
    """ "10 COMPLETE, 2 PRUNED, 1 FAIL"."""
    counts = Counter(trial.state.name for trial in frozen)
    return ", ".join(f"{count} {state}" for state, count in counts.most_common())


def export(
    ctx: typer.Context,
    sweep_ref: SweepRef,
    optuna_url: Annotated[
        str,
        typer.Option(
            "--optuna",
            metavar="URL",
            help="the Optuna storage to write to, e.g. sqlite:///study.db",
            show_default=False,
        ),
    ],
    study_name: Annotated[
        str | None, typer.Option(help="the study's name (default gpumux-sweep-ID)")
    ] = None,
    overwrite: Annotated[
        bool, typer.Option("--overwrite", help="replace a study of that name if there is one")
    ] = False,
    url: Url = None,
) -> None:
    """Write a sweep as an Optuna study (optuna.load_study and optuna-dashboard open it).

    Each started trial: its searched parameters and their distributions, its value, the
    objective at each step it reported, its state (pruned, failed, running...); constants and
    gpumux's facts (trial id, attempt, exit code, error) as user attributes.
    """
    state = get_state(ctx)
    with connect(state, url) as client:
        sweep_id = sweep_id_of(client, sweep_ref)
        with state.err.status(f"reading sweep {sweep_id}"):
            sweep, trials, reports = fetch(client, sweep_id)
    frozen = study_trials(sweep, trials, reports)
    if not frozen:
        raise CliError(f"no trial of sweep {sweep_id} has started yet; nothing to export")
    # Its INFO lines (a study created) would repeat what this command prints.
    load_optuna()
    name = study_name or study_name_of(sweep_id)
    write_study(open_storage(optuna_url), sweep, frozen, name=name, overwrite=overwrite)
    state.out.print(
        f"sweep {sweep_id}: {len(frozen)} trials written to the study {name!r} in "
        f"{optuna_url} ({summary(frozen)})",
        soft_wrap=True,
    )
    left_out = len(trials) - len(frozen)
    if left_out:
        state.note(f"{left_out} trials that never started are left out")
    if any(trial.state.name == "RUNNING" for trial in frozen):
        state.note(
            "the sweep is still running: its running trials are RUNNING in the study; "
            "export again with --overwrite once it ends"
        )
