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
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import optuna
from optuna.distributions import BaseDistribution
from optuna.exceptions import ExperimentalWarning
from optuna.storages import InMemoryStorage
from optuna.trial import TrialState, create_trial
from sqlalchemy import select
from sqlalchemy.orm import Session

from gpumux import sweepspec
from gpumux.search import methods
from gpumux.search.space import constants_of, distributions_of
from gpumux.status import ACTIVE_TRIAL_STATUSES, ObjectiveMode, SearchMethod, TrialStatus
from gpumux.storage.models import Sweep, Trial, TrialReport, utcnow

log = logging.getLogger(__name__)

# A seed per rebuild, so that a sampler restarted after k asks does not replay its first ones.
_SEED_STRIDE = 1_000_003


def state_of(trial: Trial) -> TrialState:
    """The Optuna state of a stored trial: queued and running ones count as running (a
    sampler with a constant liar spreads its asks away from them)."""
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
    # The last step whose value the study has, per open trial.
    fed: dict[int, int] = field(default_factory=dict)

    def frozen(self, trial_id: int) -> optuna.trial.FrozenTrial:
        return self.storage.get_trial(self.optuna_ids[trial_id])


class Studies:
    """The studies of the sweeps that need one: adaptive searches, and sweeps with a pruner."""

    def __init__(self) -> None:
        self._studies: dict[int, SweepStudy] = {}

    def ask(self, *, session: Session, sweep: Sweep) -> Trial | None:
        """The sweep's next trial, chosen by its sampler now and stored queued in the caller's
        transaction; None once its budget is spent. A sampler that fails ends the budget."""
        existing = session.scalars(select(Trial.number).where(Trial.sweep_id == sweep.id)).all()
        if len(existing) >= sweep.trial_count:
            return None
        study = self._synced(session, sweep)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", ExperimentalWarning)
                asked = study.study.ask(fixed_distributions=study.distributions)
        except Exception as error:
            log.exception("sweep %s: the %s sampler failed", sweep.id, sweep.search)
            sweep.trial_count = len(existing)
            raise SamplerFailed(f"the {sweep.search} sampler failed: {error!r}") from error
        trial = Trial(
            sweep_id=sweep.id,
            number=max(existing, default=-1) + 1,
            params={**asked.params, **study.constants},
            queued_at=utcnow(),
        )
        session.add(trial)
        session.flush()
        optuna_id = study.storage.get_trial_id_from_study_id_trial_number(
            study.study_id, asked.number
        )
        trial.optuna_attrs = dict(study.storage.get_trial(optuna_id).system_attrs)
        sweep.study_attrs = dict(study.storage.get_study_system_attrs(study.study_id))
        study.optuna_ids[trial.id] = optuna_id
        study.open[trial.id] = trial.attempt
        log.info("sweep %s: %s asks trial %s: %s", sweep.id, sweep.search, trial.id, trial.params)
        return trial

    def to_prune(self, *, session: Session, sweeps: Iterable[Sweep]) -> list[tuple[int, int]]:
        """Running trials of these sweeps that their pruner stops at a step they reported:
        (trial id, step). Each new step is put to the pruner in turn, as if it were asked after
        every report. Call in a write transaction: pruners keep state in the trials."""
        stopping = []
        for sweep in sweeps:
            if sweep.prune is None:
                continue
            study = self._synced(session, sweep)
            for trial, values in self._new_steps(session, study):
                step = self._first_pruned_step(session, sweep, study, trial, values)
                if step is not None:
                    # Said now: the trial reports on until the signal reaches it.
                    trial.error = (
                        f"pruned at step {step} by the {sweep.prune} pruner "
                        f"({study.metric} {values[step]:.6g})"
                    )
                    log.info("sweep %s: trial %s %s", sweep.id, trial.id, trial.error)
                    stopping.append((trial.id, step))
        return stopping

    def forget(self, sweep_ids: Iterable[int]) -> None:
        """Drop the studies of sweeps that ended."""
        for sweep_id in sweep_ids:
            self._studies.pop(sweep_id, None)

    def __iter__(self) -> Iterator[int]:
        return iter(list(self._studies))

    def _synced(self, session: Session, sweep: Sweep) -> SweepStudy:
        study = self._studies.get(sweep.id)
        if study is not None:
            trials = session.scalars(select(Trial).where(Trial.id.in_(list(study.open)))).all()
            if all(study.open[trial.id] == trial.attempt for trial in trials):
                for trial in trials:
                    if trial.status.is_final:
                        _finish(session, study, trial)
                return study
            # A trial runs again (a requeue): its earlier attempt's steps must not count.
        study = self._studies[sweep.id] = build(session, sweep)
        return study

    def _new_steps(
        self, session: Session, study: SweepStudy
    ) -> list[tuple[Trial, dict[int, float]]]:
        """The running trials that reported steps since the last look, with the objective at
        each of those steps."""
        running = session.scalars(
            select(Trial).where(
                Trial.id.in_(list(study.open)), Trial.status.in_(ACTIVE_TRIAL_STATUSES)
            )
        ).all()
        found = []
        for trial in running:
            seen = study.fed.get(trial.id, -1)
            if trial.step is None or trial.step <= seen:
                continue
            study.fed[trial.id] = trial.step
            values = _step_values(session, trial, study.metric, after=seen)
            if values:
                found.append((trial, values))
        return found

    def _first_pruned_step(
        self,
        session: Session,
        sweep: Sweep,
        study: SweepStudy,
        trial: Trial,
        values: dict[int, float],
    ) -> int | None:
        """Give the study each new step's value in order and ask the pruner after each; the
        first step it prunes at, or None."""
        optuna_id = study.optuna_ids[trial.id]
        pruned_at = None
        try:
            for step in sorted(values):
                study.storage.set_trial_intermediate_value(optuna_id, step, values[step])
                if study.study.pruner.prune(study.study, study.frozen(trial.id)):
                    pruned_at = step
                    break
        except Exception:
            log.exception("sweep %s: the pruner %s failed; no more pruning", sweep.id, sweep.prune)
            sweep.prune = None
            return None
        finally:
            trial.optuna_attrs = dict(study.frozen(trial.id).system_attrs)
        return pruned_at


class SamplerFailed(RuntimeError):
    """An adaptive sweep's sampler raised: the sweep ends with the trials it has."""


def build(session: Session, sweep: Sweep) -> SweepStudy:
    """A sweep's study rebuilt from its stored trials, their steps and Optuna's state."""
    params = sweepspec.parse_params(sweep.param_tokens)
    adaptive = sweep.search.adaptive
    # A pruner compares steps, not parameters: a grid's or a random sweep's study holds none.
    distributions = distributions_of(params) if adaptive else {}
    trials = session.scalars(
        select(Trial).where(Trial.sweep_id == sweep.id).order_by(Trial.number)
    ).all()
    if adaptive and sweep.search is not SearchMethod.qmc:
        seed = sweep.seed + _SEED_STRIDE * len(trials)
    else:
        seed = sweep.seed
    sampler = (
        methods.make_sampler(sweep.search, seed=seed)
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
    steps = _all_step_values(session, trials, built.metric)
    study.add_trials([_frozen(built, trial, steps.get(trial.id, {})) for trial in trials])
    for trial, frozen in zip(trials, study.get_trials(deepcopy=False), strict=True):
        built.optuna_ids[trial.id] = storage.get_trial_id_from_study_id_trial_number(
            study_id, frozen.number
        )
        if frozen.state is TrialState.RUNNING:
            # Its steps so far are in the study, but no pruner of this daemon has seen them.
            built.open[trial.id] = trial.attempt
    log.info("sweep %s: study rebuilt from %d trials", sweep.id, len(trials))
    return built


def _frozen(study: SweepStudy, trial: Trial, steps: dict[int, float]) -> optuna.trial.FrozenTrial:
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
    """Tell the study how a trial it holds as running ended, with the steps it reported since
    the last look (a short trial may report every step and end between two)."""
    after = study.fed.get(trial.id, -1)
    for step, value in _step_values(session, trial, study.metric, after=after).items():
        study.storage.set_trial_intermediate_value(study.optuna_ids[trial.id], step, value)
    state = state_of(trial)
    number = study.frozen(trial.id).number
    if state is TrialState.COMPLETE:
        study.study.tell(number, trial.objective)
    else:
        study.study.tell(number, state=state)
    del study.open[trial.id]
    study.fed.pop(trial.id, None)


def _step_values(session: Session, trial: Trial, metric: str, *, after: int) -> dict[int, float]:
    """The objective at each step after `after` that the trial's current attempt reported."""
    reports = session.scalars(
        select(TrialReport)
        .where(
            TrialReport.trial_id == trial.id,
            TrialReport.attempt == trial.attempt,
            TrialReport.step > after,
        )
        .order_by(TrialReport.id)
    )
    return _by_step(reports, metric)


def _all_step_values(
    session: Session, trials: Sequence[Trial], metric: str
) -> dict[int, dict[int, float]]:
    attempts = {trial.id: trial.attempt for trial in trials}
    reports = session.scalars(
        select(TrialReport)
        .where(TrialReport.trial_id.in_(list(attempts)), TrialReport.step.is_not(None))
        .order_by(TrialReport.id)
    )
    by_trial: dict[int, list[TrialReport]] = {}
    for report in reports:
        if report.attempt == attempts[report.trial_id]:
            by_trial.setdefault(report.trial_id, []).append(report)
    return {trial_id: _by_step(rows, metric) for trial_id, rows in by_trial.items()}


def _by_step(reports: Iterable[TrialReport], metric: str) -> dict[int, float]:
    values: dict[int, float] = {}
    for report in reports:
        value: Any = report.metrics.get(metric)
        if report.step is not None and isinstance(value, int | float):
            values[report.step] = float(value)
    return values
