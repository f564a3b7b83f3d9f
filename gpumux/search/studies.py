"""One Optuna study per adaptive or pruned sweep, kept in the daemon and rebuilt from the database.

The database stays the truth: a study is built from a sweep's stored trials and reports
(`create_trial` + `add_trials`) the first time the scheduler needs it (after every start), then
kept in step with what the database records: trials asked, their reports' steps, their ends.
What a sampler or pruner keeps in Optuna's system attributes (a CMA-ES generation, an ASHA rung, a
QMC position) is stored beside the trial and the sweep, so that a rebuilt study goes on where the
last one stopped. Only the scheduler's thread touches these studies.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from gpumux.grammar import sweepspec
from gpumux.search import methods
from gpumux.search.space import constants_of, distributions_of, load_optuna
from gpumux.status import (
    ObjectiveMode,
    PruneNote,
    SearchMethod,
    TrialStatus,
)
from gpumux.storage import backlog
from gpumux.storage import studies as study_store
from gpumux.storage.models import Sweep, Trial

if TYPE_CHECKING:
    import optuna
    from optuna.distributions import BaseDistribution
    from optuna.storages import InMemoryStorage
    from optuna.trial import TrialState

    # The transaction the caller hands in: search/ builds no query (pyproject.toml).
    from sqlalchemy.orm import Session

log = logging.getLogger(__name__)

# A seed per rebuild, so that a sampler restarted after k asks does not replay its first ones.
_SEED_STRIDE = 1_000_003


def state_of(trial: Trial) -> TrialState:
    """The Optuna state of a stored trial: queued and running ones count as running (a
    sampler with a constant liar spreads its asks away from them)."""
    # Optuna is imported where a study is built or used, never at the top (space.load_optuna).
    from optuna.trial import TrialState

    if trial.status is TrialStatus.succeeded:
        return TrialState.COMPLETE if trial.objective is not None else TrialState.FAIL
    if trial.status is TrialStatus.pruned:
        return TrialState.PRUNED
    if trial.status.is_final:
        return TrialState.FAIL
    return TrialState.RUNNING


@dataclass
class SweepStudy:
    """A sweep's study, and which Optuna trial stands for which stored one."""

    sweep_id: int
    metric: str
    study: optuna.Study
    storage: InMemoryStorage
    study_id: int
    distributions: dict[str, BaseDistribution]
    constants: dict[str, sweepspec.Value]
    # Stored trial id -> Optuna trial id, for every trial of the sweep.
    optuna_ids: dict[int, int] = field(default_factory=dict)
    # Stored trials whose Optuna trial is still running, with the attempt it stands for.
    open: dict[int, int] = field(default_factory=dict)
    # The sweep's starting and running trials at the last look.
    active: dict[int, study_store.Running] = field(default_factory=dict)
    # Per running trial, when it last reported as the pruner last read it: its rows are read
    # again only once that changes (compared, not ordered: no clock is trusted).
    reported: dict[int, datetime] = field(default_factory=dict)
    # Per running trial, the id of its latest report row the pruner read: read again at the
    # next look, as later reports of its step may have merged into it.
    report_marks: dict[int, int] = field(default_factory=dict)
    # Trials the pruner has stopped: never judged again.
    decided: set[int] = field(default_factory=set)

    def frozen(self, trial_id: int) -> optuna.trial.FrozenTrial:
        return self.storage.get_trial(self.optuna_ids[trial_id])


@dataclass(frozen=True)
class Pruned:
    """A pruner's decision: stop this trial; it lost at this step."""

    trial_id: int
    step: int
    note: str


class Studies:
    """The studies of the sweeps that need one: adaptive searches, and sweeps with a pruner."""

    def __init__(self) -> None:
        self._studies: dict[int, SweepStudy] = {}

    def ask(self, *, session: Session, sweep: Sweep) -> Trial | None:
        """The sweep's next trial, chosen by its sampler now and stored queued in the caller's
        transaction; None once its budget is spent. A sampler that fails ends the budget."""
        if backlog.asked_count(session=session, sweep=sweep) >= sweep.trial_count:
            return None
        try:
            study = self._synced(session, sweep)
            from optuna.exceptions import ExperimentalWarning

            with warnings.catch_warnings():
                warnings.simplefilter("ignore", ExperimentalWarning)
                asked = study.study.ask(fixed_distributions=study.distributions)
        except Exception as error:
            log.exception("sweep %s: the %s sampler failed", sweep.id, sweep.search)
            self.forget([sweep.id])
            study_store.end_budget(session=session, sweep=sweep)
            raise SamplerFailed(f"the {sweep.search} sampler failed: {error!r}") from error
        optuna_id = study.storage.get_trial_id_from_study_id_trial_number(
            study.study_id, asked.number
        )
        trial = study_store.add_asked(
            session=session,
            sweep=sweep,
            params={**asked.params, **study.constants},
            optuna_attrs=dict(study.storage.get_trial(optuna_id).system_attrs),
            study_attrs=dict(study.storage.get_study_system_attrs(study.study_id)),
        )
        study.optuna_ids[trial.id] = optuna_id
        study.open[trial.id] = trial.attempt
        log.info("sweep %s: %s asks trial %s: %s", sweep.id, sweep.search, trial.id, trial.params)
        return trial

    def to_prune(self, *, session: Session, sweeps: Iterable[Sweep]) -> list[Pruned]:
        """Running trials of these sweeps that their pruner stops at a step they reported. Each
        new step is put to the pruner in turn, as if it were asked after every report. Call in
        a write transaction: pruners keep state in the trials. A sweep whose study or pruner
        fails loses its pruner, not the tick."""
        stopping = []
        for sweep in sweeps:
            if sweep.prune is None:
                continue
            try:
                stopping += self._prune(session, sweep)
            except Exception:
                log.exception(
                    "sweep %s: the pruner %s failed; no more pruning", sweep.id, sweep.prune
                )
                self.forget([sweep.id])
                study_store.drop_pruner(sweep=sweep)
        return stopping

    def forget(self, sweep_ids: Iterable[int]) -> None:
        """Drop these studies: ended sweeps', or all of them after a failed write, to be
        rebuilt from what the database kept."""
        for sweep_id in list(sweep_ids):
            self._studies.pop(sweep_id, None)

    def __iter__(self) -> Iterator[int]:
        return iter(list(self._studies))

    def _prune(self, session: Session, sweep: Sweep) -> list[Pruned]:
        study = self._synced(session, sweep)
        stopping = []
        for trial, values in self._new_steps(session, study):
            step = self._first_pruned_step(study, trial, values)
            if step is not None:
                study.decided.add(trial.id)
                note = str(
                    PruneNote(
                        step=step, pruner=str(sweep.prune), metric=study.metric, value=values[step]
                    )
                )
                log.info("sweep %s: trial %s %s", sweep.id, trial.id, note)
                stopping.append(Pruned(trial.id, step, note))
        return stopping

    def _synced(self, session: Session, sweep: Sweep) -> SweepStudy:
        """The sweep's study, told of the trials that ended since the last look; rebuilt when
        there is none, when it lacks a trial (another node asked it), or when a trial runs again
        (its earlier attempt's steps must not count). Nothing here trusts another node's clock
        or the order in which ids commit: the study's running trials are looked up by id."""
        active = study_store.running_trials(session=session, sweep_id=sweep.id)
        study = self._studies.get(sweep.id)
        if (
            study is not None
            and backlog.asked_count(session=session, sweep=sweep) == len(study.optuna_ids)
            and all(study.open.get(trial_id) == run.attempt for trial_id, run in active.items())
        ):
            for trial in study_store.ended_among(session=session, trial_ids=list(study.open)):
                _finish(session, study, trial)
        else:
            study = self._studies[sweep.id] = build(session, sweep)
        study.active = active
        return study

    def _new_steps(
        self, session: Session, study: SweepStudy
    ) -> list[tuple[Trial, dict[int, float]]]:
        """The running trials with steps the study does not hold yet, or holds with another
        value (a report merged into the row of its step), with the objective at each."""
        marks = {}
        for trial_id, running in study.active.items():
            at = running.last_report_at
            if trial_id in study.open and trial_id not in study.decided and at is not None:
                if study.reported.get(trial_id) != at:
                    marks[trial_id] = study.report_marks.get(trial_id, 0)
                    study.reported[trial_id] = at
        reports: dict[int, list[tuple[int | None, dict[str, Any]]]] = {}
        for report in study_store.reports_from(session=session, marks=marks):
            study.report_marks[report.trial_id] = report.id
            reports.setdefault(report.trial_id, []).append((report.step, report.metrics))
        changed = {}
        for trial_id, batch in reports.items():
            held = study.frozen(trial_id).intermediate_values
            values = {
                step: value
                for step, value in _by_step(batch, study.metric).items()
                if held.get(step) != value
            }
            if values:
                changed[trial_id] = values
        trials = study_store.trials_by_id(session=session, trial_ids=list(changed))
        return [(trials[trial_id], values) for trial_id, values in changed.items()]

    def _first_pruned_step(
        self, study: SweepStudy, trial: Trial, values: dict[int, float]
    ) -> int | None:
        """Give the study each new step's value in order and ask the pruner after each; the
        first step it prunes at, or None."""
        optuna_id = study.optuna_ids[trial.id]
        try:
            for step in sorted(values):
                study.storage.set_trial_intermediate_value(optuna_id, step, values[step])
                if study.study.pruner.prune(study.study, study.frozen(trial.id)):
                    return step
            return None
        finally:
            study_store.keep_pruner_state(
                trial=trial, optuna_attrs=dict(study.frozen(trial.id).system_attrs)
            )


class SamplerFailed(RuntimeError):
    """An adaptive sweep's sampler raised: the sweep ends with the trials it has."""


def build(session: Session, sweep: Sweep) -> SweepStudy:
    """A sweep's study rebuilt from its stored trials, their steps and Optuna's state."""
    load_optuna()
    import optuna
    from optuna.storages import InMemoryStorage
    from optuna.trial import TrialState

    params = sweepspec.parse_params(sweep.param_tokens)
    adaptive = sweep.search.adaptive
    # A pruner compares steps, not parameters: a grid's or a random sweep's study holds none.
    distributions = distributions_of(params) if adaptive else {}
    trials = study_store.trials_of(session=session, sweep_id=sweep.id)
    if adaptive and sweep.search is not SearchMethod.qmc:
        seed = sweep.seed + _SEED_STRIDE * len(trials)
    else:
        seed = sweep.seed
    sampler = (
        methods.make_sampler(
            sweep.search, seed=seed, budget=sweep.trial_count, options=sweep.search_options or {}
        )
        if adaptive
        else optuna.samplers.RandomSampler(seed=seed % methods.SEED_MODULUS)
    )
    storage = InMemoryStorage()
    name = f"gpumux-sweep-{sweep.id}"
    study = optuna.create_study(
        storage=storage,
        study_name=name,
        sampler=sampler,
        pruner=methods.make_pruner(methods.parse_prune(sweep.prune) if sweep.prune else None),
        direction="maximize" if sweep.objective_mode is ObjectiveMode.max else "minimize",
    )
    study_id = storage.get_study_id_from_name(name)
    for key, value in (sweep.study_attrs or {}).items():
        storage.set_study_system_attr(study_id, key, value)
    built = SweepStudy(
        sweep_id=sweep.id,
        metric=sweep.objective_metric or "",
        study=study,
        storage=storage,
        study_id=study_id,
        distributions=distributions,
        constants=constants_of(params) if adaptive else {},
    )
    steps = {
        trial_id: _by_step(reports, built.metric)
        for trial_id, reports in study_store.step_reports(session=session, trials=trials).items()
    }
    # A running trial's steps reach the study through the pruner, one by one (no mark yet).
    study.add_trials(
        [
            _frozen(built, trial, {} if not trial.status.is_final else steps.get(trial.id, {}))
            for trial in trials
        ]
    )
    for trial, frozen in zip(trials, study.get_trials(deepcopy=False), strict=True):
        built.optuna_ids[trial.id] = storage.get_trial_id_from_study_id_trial_number(
            study_id, frozen.number
        )
        if frozen.state is TrialState.RUNNING:
            built.open[trial.id] = trial.attempt
    log.info("sweep %s: study rebuilt from %d trials", sweep.id, len(trials))
    return built


def _frozen(study: SweepStudy, trial: Trial, steps: dict[int, float]) -> optuna.trial.FrozenTrial:
    from optuna.trial import TrialState, create_trial

    state = state_of(trial)
    params = {name: trial.params[name] for name in study.distributions if name in trial.params}
    return create_trial(
        state=state,
        value=trial.objective if state is TrialState.COMPLETE else None,
        params=params,
        distributions={name: study.distributions[name] for name in params},
        intermediate_values=steps,
        system_attrs=dict(trial.optuna_attrs or {}),
    )


def _finish(session: Session, study: SweepStudy, trial: Trial) -> None:
    """Tell the study how a trial it holds as running ended, with every step its attempt
    reported (a short trial may report them all and end between two looks)."""
    from optuna.trial import TrialState

    reports = study_store.step_reports(session=session, trials=[trial]).get(trial.id, [])
    for step, value in _by_step(reports, study.metric).items():
        study.storage.set_trial_intermediate_value(study.optuna_ids[trial.id], step, value)
    state = state_of(trial)
    number = study.frozen(trial.id).number
    if state is TrialState.COMPLETE:
        study.study.tell(number, trial.objective)
    else:
        study.study.tell(number, state=state)
    del study.open[trial.id]
    study.decided.discard(trial.id)
    study.report_marks.pop(trial.id, None)
    study.reported.pop(trial.id, None)


def _by_step(reports: Iterable[tuple[int | None, dict[str, Any]]], metric: str) -> dict[int, float]:
    """The objective at each step of these (step, metrics) reports: its last value."""
    values: dict[int, float] = {}
    for step, metrics in reports:
        value: Any = metrics.get(metric)
        if step is not None and isinstance(value, int | float):
            values[step] = float(value)
    return values
