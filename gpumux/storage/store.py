"""Every read and write of gpumux's state, and the one gate that changes a trial's status."""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Collection, Mapping, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import CursorResult, Select, func, select, update
from sqlalchemy.orm import Session

from gpumux.schemas import ReportIn, SweepCreate, parse_objective
from gpumux.status import (
    ACTIVE_TRIAL_STATUSES,
    FINAL_TRIAL_STATUSES,
    TRIAL_TRANSITIONS,
    ObjectiveMode,
    SweepStatus,
    TrialStatus,
)
from gpumux.storage.models import Owner, Profile, Sweep, Trial, TrialReport, utcnow
from gpumux.throughput import CurvePoint, throughput_unit

log = logging.getLogger(__name__)


class IllegalTransition(RuntimeError):
    """A trial status change that the lifecycle does not allow."""


class ReportRefused(RuntimeError):
    """A report that must not be recorded: wrong token, stale attempt, or a trial not running."""


class TokenMismatch(ReportRefused):
    """A report whose token is not its trial's."""


def token_hash(token: str) -> str:
    """The stored form of a trial's report token."""
    return hashlib.sha256(token.encode()).hexdigest()


def get_or_create_owner(*, session: Session, name: str, uid: int | None = None) -> Owner:
    """The owner row for a user name, created on first use."""
    owner = session.scalar(select(Owner).where(Owner.name == name))
    if owner is None:
        owner = Owner(name=name, uid=uid)
        session.add(owner)
        session.flush()
    elif owner.uid is None and uid is not None:
        owner.uid = uid
    return owner


def queued_count(*, session: Session, owner: str) -> int:
    """How many trials of this user's sweeps wait in the queue."""
    return (
        session.scalar(
            select(func.count())
            .select_from(Trial)
            .join(Sweep)
            .join(Owner)
            .where(Owner.name == owner, Trial.status == TrialStatus.queued)
        )
        or 0
    )


def create_sweep(
    *,
    session: Session,
    sweep_in: SweepCreate,
    owner: Owner,
    seed: int,
    trial_params: Sequence[dict[str, Any]],
) -> Sweep:
    """A sweep and its queued trials, in the caller's transaction."""
    metric, mode = parse_objective(sweep_in.objective) if sweep_in.objective else (None, None)
    sweep = Sweep(
        name=sweep_in.name,
        owner=owner,
        owner_id=owner.id,
        command=sweep_in.command,
        param_tokens=sweep_in.params,
        workdir=sweep_in.workdir,
        env=sweep_in.env,
        random_trials=sweep_in.trials,
        seed=seed,
        split=None if sweep_in.split == "auto" else sweep_in.split,
        objective_metric=metric,
        objective_mode=ObjectiveMode(mode) if mode else None,
        time_limit_s=sweep_in.time_limit_s,
        retries=sweep_in.retries,
        priority=sweep_in.priority,
        trial_count=len(trial_params),
    )
    session.add(sweep)
    session.flush()
    now = utcnow()
    session.add_all(
        Trial(sweep_id=sweep.id, number=number, params=params, queued_at=now)
        for number, params in enumerate(trial_params)
    )
    session.flush()
    return sweep


def _sweeps_query(*, status: SweepStatus | None, owner: str | None) -> Select[Sweep]:
    query = select(Sweep)
    if status is not None:
        query = query.where(Sweep.status == status)
    if owner is not None:
        query = query.join(Owner).where(Owner.name == owner)
    return query


def list_sweeps(
    *,
    session: Session,
    status: SweepStatus | None = None,
    owner: str | None = None,
    offset: int = 0,
    limit: int = 50,
) -> tuple[list[Sweep], int]:
    """A page of sweeps, newest first, and how many match in all."""
    query = _sweeps_query(status=status, owner=owner)
    count = session.scalar(select(func.count()).select_from(query.subquery())) or 0
    page = session.scalars(query.order_by(Sweep.id.desc()).offset(offset).limit(limit))
    return list(page), count


def get_sweep(*, session: Session, sweep_id: int) -> Sweep | None:
    """One sweep by id."""
    return session.get(Sweep, sweep_id)


def trial_counts(
    *, session: Session, sweep_ids: Collection[int]
) -> dict[int, dict[TrialStatus, int]]:
    """For each sweep, the number of its trials in each status."""
    counts: dict[int, dict[TrialStatus, int]] = {sweep_id: {} for sweep_id in sweep_ids}
    rows = session.execute(
        select(Trial.sweep_id, Trial.status, func.count())
        .where(Trial.sweep_id.in_(sweep_ids))
        .group_by(Trial.sweep_id, Trial.status)
    )
    for sweep_id, status, count in rows:
        counts[sweep_id][TrialStatus(status)] = count
    return counts


def best_trial(*, session: Session, sweep: Sweep) -> Trial | None:
    """The trial whose objective ranks first, or None without an objective or a value."""
    if sweep.objective_mode is None:
        return None
    order = (
        Trial.objective.asc()
        if sweep.objective_mode == ObjectiveMode.min
        else Trial.objective.desc()
    )
    return session.scalar(
        select(Trial)
        .where(Trial.sweep_id == sweep.id, Trial.objective.is_not(None))
        .order_by(order, Trial.id)
        .limit(1)
    )


def request_cancel(*, session: Session, sweep: Sweep) -> Sweep:
    """Record the intent to cancel; the scheduler stops the trials."""
    if sweep.status not in (SweepStatus.finished, SweepStatus.cancelled):
        sweep.cancel_requested = True
    return sweep


def list_trials(
    *,
    session: Session,
    sweep_id: int,
    status: TrialStatus | None = None,
    offset: int = 0,
    limit: int = 100,
) -> tuple[list[Trial], int]:
    """A page of a sweep's trials in their order, and how many match in all."""
    where = [Trial.sweep_id == sweep_id]
    if status is not None:
        where.append(Trial.status == status)
    count = session.scalar(select(func.count()).select_from(Trial).where(*where)) or 0
    page = session.scalars(
        select(Trial).where(*where).order_by(Trial.number).offset(offset).limit(limit)
    )
    return list(page), count


def get_trial(*, session: Session, trial_id: int) -> Trial | None:
    """One trial by id."""
    return session.get(Trial, trial_id)


def add_report(*, session: Session, trial: Trial, token: str, report_in: ReportIn) -> TrialReport:
    """Record a report from the trial's current attempt; refuse anything else."""
    if trial.token_hash is None or token_hash(token) != trial.token_hash:
        raise TokenMismatch(f"trial {trial.id}: the report token does not match")
    if report_in.attempt != trial.attempt:
        raise ReportRefused(
            f"trial {trial.id}: report from attempt {report_in.attempt}, "
            f"the current attempt is {trial.attempt}"
        )
    if trial.status not in ACTIVE_TRIAL_STATUSES:
        raise ReportRefused(f"trial {trial.id} is {trial.status}, not running")
    rate = None
    if report_in.samples is not None and report_in.seconds:
        rate = report_in.samples / report_in.seconds
    report = TrialReport(
        trial_id=trial.id,
        attempt=report_in.attempt,
        kind=report_in.kind,
        epoch=report_in.epoch,
        samples=report_in.samples,
        seconds=report_in.seconds,
        samples_per_s=rate,
        metrics=report_in.metrics,
    )
    session.add(report)
    trial.last_report_at = report.at = utcnow()
    if rate is not None:
        trial.samples_per_s = rate
    metric = trial.sweep.objective_metric
    if metric is not None and metric in report_in.metrics:
        trial.objective = report_in.metrics[metric]
    return report


def list_reports(
    *, session: Session, trial_id: int, offset: int = 0, limit: int = 1000
) -> tuple[list[TrialReport], int]:
    """A trial's reports in the order they came."""
    where = TrialReport.trial_id == trial_id
    count = session.scalar(select(func.count()).select_from(TrialReport).where(where)) or 0
    page = session.scalars(
        select(TrialReport).where(where).order_by(TrialReport.id).offset(offset).limit(limit)
    )
    return list(page), count


def open_sweeps(*, session: Session) -> list[Sweep]:
    """Sweeps that may still start trials, in the order they get slots: higher priority first,
    then first come first served; sweeps being cancelled are left out."""
    return list(
        session.scalars(
            select(Sweep)
            .where(
                Sweep.status.in_((SweepStatus.queued, SweepStatus.running)),
                Sweep.cancel_requested.is_(False),
            )
            .order_by(Sweep.priority.desc(), Sweep.id)
        )
    )


def queued_trials_of(*, session: Session, sweep: Sweep, limit: int) -> list[Trial]:
    """A sweep's queued trials in their order, at most `limit`."""
    return list(
        session.scalars(
            select(Trial)
            .where(Trial.sweep_id == sweep.id, Trial.status == TrialStatus.queued)
            .order_by(Trial.number)
            .limit(limit)
        )
    )


def active_trials(*, session: Session) -> list[Trial]:
    """Trials that hold a device slot: starting or running."""
    return list(
        session.scalars(
            select(Trial).where(Trial.status.in_(ACTIVE_TRIAL_STATUSES)).order_by(Trial.id)
        )
    )


def sweeps_to_cancel(*, session: Session) -> list[Sweep]:
    """Sweeps whose cancel was asked for and that still have trials to stop."""
    return list(
        session.scalars(
            select(Sweep).where(
                Sweep.cancel_requested.is_(True),
                Sweep.status.in_((SweepStatus.queued, SweepStatus.running)),
            )
        )
    )


def pending_work(*, session: Session) -> int:
    """How many trials are queued or hold a slot."""
    unfinished = (TrialStatus.queued, *ACTIVE_TRIAL_STATUSES)
    return session.scalar(select(func.count()).where(Trial.status.in_(unfinished))) or 0


def cancel_queued_trials(*, session: Session, sweep: Sweep) -> int:
    """Cancel all of a sweep's queued trials in one statement; returns how many."""
    if TrialStatus.cancelled not in TRIAL_TRANSITIONS[TrialStatus.queued]:
        raise IllegalTransition("queued -> cancelled is not allowed")
    result: CursorResult[Any] = session.execute(  # type: ignore[assignment]
        update(Trial)
        .where(Trial.sweep_id == sweep.id, Trial.status == TrialStatus.queued)
        .values(status=TrialStatus.cancelled, ended_at=utcnow())
        .execution_options(synchronize_session=False)
    )
    session.expire_all()
    refresh_sweep_status(session=session, sweep=sweep)
    return result.rowcount


def set_trial_status(
    *, session: Session, trial: Trial, status: TrialStatus, **fields: Any
) -> Trial:
    """Move a trial to `status` (setting `fields` with it) if the lifecycle allows the move."""
    if status not in TRIAL_TRANSITIONS[trial.status]:
        raise IllegalTransition(f"trial {trial.id}: {trial.status} -> {status} is not allowed")
    for name, value in fields.items():
        if not hasattr(Trial, name):
            raise AttributeError(f"Trial has no field {name!r}")
        setattr(trial, name, value)
    log.debug("trial %s: %s -> %s", trial.id, trial.status, status)
    trial.status = status
    session.flush()
    refresh_sweep_status(session=session, sweep=trial.sweep)
    return trial


def refresh_sweep_status(*, session: Session, sweep: Sweep, now: datetime | None = None) -> None:
    """Derive a sweep's status from its trials' (called after every trial transition)."""
    counts = trial_counts(session=session, sweep_ids=[sweep.id])[sweep.id]
    final = sum(count for status, count in counts.items() if status in FINAL_TRIAL_STATUSES)
    if final == sweep.trial_count:
        status = SweepStatus.cancelled if sweep.cancel_requested else SweepStatus.finished
        if sweep.finished_at is None:
            sweep.finished_at = now or utcnow()
    elif final or any(counts.get(status) for status in ACTIVE_TRIAL_STATUSES):
        status = SweepStatus.running
    else:
        status = SweepStatus.queued
    if status != sweep.status:
        log.info("sweep %s: %s -> %s", sweep.id, sweep.status, status)
        sweep.status = status


def get_profile(*, session: Session, device_name: str, fingerprint: str) -> Profile | None:
    """The stored profile of a workload on a device model, if it was measured."""
    return session.scalar(
        select(Profile).where(
            Profile.device_name == device_name, Profile.fingerprint == fingerprint
        )
    )


def get_profile_by_id(*, session: Session, profile_id: int) -> Profile | None:
    """One profile by id."""
    return session.get(Profile, profile_id)


def save_profile(
    *,
    session: Session,
    device_name: str,
    fingerprint: str,
    command: Sequence[str],
    param_tokens: Sequence[str],
    unit: str,
    curve: Sequence[Mapping[str, Any]],
    best_split: int | None,
    settled: bool,
    reason: str | None,
    sweep_id: int | None,
) -> Profile:
    """Store the profile of (device model, workload), replacing the one measured before."""
    unit = throughput_unit(unit)
    points = [CurvePoint.from_json(point).to_json() for point in curve]
    now = utcnow()
    profile = get_profile(session=session, device_name=device_name, fingerprint=fingerprint)
    if profile is None:
        profile = Profile(device_name=device_name, fingerprint=fingerprint, created_at=now)
        session.add(profile)
    profile.updated_at = now
    profile.command = list(command)
    profile.param_tokens = list(param_tokens)
    profile.unit = unit
    profile.curve = points
    profile.best_split = best_split
    profile.settled = settled
    profile.reason = reason
    profile.sweep_id = sweep_id
    session.flush()
    return profile


def workload_profiles(*, session: Session, fingerprint: str) -> list[Profile]:
    """A workload's profiles, one per device model it was measured on."""
    return list(
        session.scalars(
            select(Profile).where(Profile.fingerprint == fingerprint).order_by(Profile.device_name)
        )
    )


def list_profiles(
    *, session: Session, offset: int = 0, limit: int = 50
) -> tuple[list[Profile], int]:
    """A page of profiles, the most recently updated first, and how many there are."""
    count = session.scalar(select(func.count()).select_from(Profile)) or 0
    page = session.scalars(
        select(Profile)
        .order_by(Profile.updated_at.desc(), Profile.id.desc())
        .offset(offset)
        .limit(limit)
    )
    return list(page), count


def samples_reported(*, session: Session, device: str, start: datetime, end: datetime) -> float:
    """Samples that the trials on `device` reported processing in the window (start, end]."""
    # Each report counts the samples since the trial's previous one, so the reports in a window
    # add up to the work done in it, without double counting across windows.
    total = session.scalar(
        select(func.sum(TrialReport.samples))
        .join(Trial, Trial.id == TrialReport.trial_id)
        .where(Trial.device == device, TrialReport.at > start, TrialReport.at <= end)
    )
    return float(total or 0.0)


def trials_reporting(*, session: Session, device: str, since: datetime) -> int:
    """How many distinct trials on `device` have reported since `since` (past their start-up)."""
    count = session.scalar(
        select(func.count(func.distinct(TrialReport.trial_id)))
        .join(Trial, Trial.id == TrialReport.trial_id)
        .where(Trial.device == device, TrialReport.at > since)
    )
    return int(count or 0)


def trials_ended(*, session: Session, device: str, start: datetime, end: datetime) -> list[Trial]:
    """Trials on `device` that ended, whichever way, in the window (start, end]."""
    ended = session.scalars(
        select(Trial)
        .where(Trial.ended_at > start, Trial.ended_at <= end, Trial.device == device)
        .order_by(Trial.ended_at, Trial.id)
    )
    # Status is checked here, not in SQL: SQLite would pick the status index over the time
    # window's and walk every trial that ever finished.
    return [trial for trial in ended if trial.status in FINAL_TRIAL_STATUSES]
