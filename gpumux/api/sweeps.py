"""Routes for sweeps: submit, list, inspect, cancel."""

from __future__ import annotations

import secrets
from typing import Annotated

from fastapi import APIRouter, HTTPException, Query, status
from sqlalchemy.orm import Session

from gpumux import store, sweepspec
from gpumux.api.deps import ReadSessionDep, StateDep, UserDep
from gpumux.models import Sweep
from gpumux.schemas import (
    ProfilePublic,
    SweepCreate,
    SweepDetail,
    SweepPublic,
    SweepsPublic,
    TrialPublic,
    TrialsPublic,
)
from gpumux.splitsearch import sweep_fingerprint
from gpumux.status import SweepStatus, TrialStatus

router = APIRouter(tags=["sweeps"])


def sweep_public(sweep: Sweep, counts: dict[TrialStatus, int]) -> SweepPublic:
    objective = None
    if sweep.objective_metric is not None and sweep.objective_mode is not None:
        objective = f"{sweep.objective_metric}:{sweep.objective_mode}"
    return SweepPublic(
        id=sweep.id,
        name=sweep.name,
        owner=sweep.owner.name,
        status=sweep.status,
        command=sweep.command,
        params=sweep.param_tokens,
        workdir=sweep.workdir,
        trials=sweep.random_trials,
        seed=sweep.seed,
        split=sweep.split if sweep.split is not None else "auto",
        objective=objective,
        time_limit_s=sweep.time_limit_s,
        retries=sweep.retries,
        priority=sweep.priority,
        trial_count=sweep.trial_count,
        cancel_requested=sweep.cancel_requested,
        created_at=sweep.created_at,
        finished_at=sweep.finished_at,
        counts=counts,
    )


def sweep_detail(session: Session, sweep: Sweep) -> SweepDetail:
    counts = store.trial_counts(session=session, sweep_ids=[sweep.id])[sweep.id]
    best = store.best_trial(session=session, sweep=sweep)
    profiles = []
    if sweep.split is None:
        profiles = store.workload_profiles(session=session, fingerprint=sweep_fingerprint(sweep))
    return SweepDetail(
        **sweep_public(sweep, counts).model_dump(),
        best=TrialPublic.model_validate(best) if best else None,
        profiles=[ProfilePublic.model_validate(profile) for profile in profiles],
    )


def sweep_or_404(session: Session, sweep_id: int) -> Sweep:
    sweep = store.get_sweep(session=session, sweep_id=sweep_id)
    if sweep is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"sweep {sweep_id} not found")
    return sweep


@router.post("/sweeps", status_code=status.HTTP_201_CREATED)
def create_sweep(sweep_in: SweepCreate, state: StateDep, user: UserDep) -> SweepDetail:
    """Submit a sweep; its trials are queued and committed before this answers."""
    seed = sweep_in.seed if sweep_in.seed is not None else secrets.randbits(31)
    limit = state.settings.max_grid
    if sweep_in.trials is not None and sweep_in.trials > limit:
        raise HTTPException(
            status.HTTP_422_UNPROCESSABLE_CONTENT,
            f"--trials {sweep_in.trials:,} is over the limit of {limit:,} trials per sweep",
        )
    try:
        params = sweepspec.parse_params(sweep_in.params)
        trial_params = sweepspec.expand(params, trials=sweep_in.trials, seed=seed, max_grid=limit)
    except sweepspec.SpecError as error:
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, str(error)) from error
    with state.sessions.write.begin() as session:
        owner = store.get_or_create_owner(session=session, name=user)
        sweep = store.create_sweep(
            session=session, sweep_in=sweep_in, owner=owner, seed=seed, trial_params=trial_params
        )
        detail = sweep_detail(session, sweep)
    state.notify()
    return detail


@router.get("/sweeps")
def list_sweeps(
    session: ReadSessionDep,
    status_: Annotated[SweepStatus | None, Query(alias="status")] = None,
    owner: str | None = None,
    offset: Annotated[int, Query(ge=0)] = 0,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
) -> SweepsPublic:
    """Sweeps, newest first, with the count of their trials in each status."""
    sweeps, count = store.list_sweeps(
        session=session, status=status_, owner=owner, offset=offset, limit=limit
    )
    counts = store.trial_counts(session=session, sweep_ids=[sweep.id for sweep in sweeps])
    return SweepsPublic(
        data=[sweep_public(sweep, counts[sweep.id]) for sweep in sweeps], count=count
    )


@router.get("/sweeps/{sweep_id}")
def get_sweep(sweep_id: int, session: ReadSessionDep) -> SweepDetail:
    """One sweep with its counts by status and its best trial by the objective."""
    return sweep_detail(session, sweep_or_404(session, sweep_id))


@router.post("/sweeps/{sweep_id}/cancel", status_code=status.HTTP_202_ACCEPTED)
def cancel_sweep(sweep_id: int, state: StateDep) -> SweepDetail:
    """Ask for a sweep to stop: queued trials are dropped, running ones terminated."""
    with state.sessions.write.begin() as session:
        sweep = store.request_cancel(session=session, sweep=sweep_or_404(session, sweep_id))
        detail = sweep_detail(session, sweep)
    state.notify()
    return detail


@router.get("/sweeps/{sweep_id}/trials")
def list_sweep_trials(
    sweep_id: int,
    session: ReadSessionDep,
    status_: Annotated[TrialStatus | None, Query(alias="status")] = None,
    offset: Annotated[int, Query(ge=0)] = 0,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> TrialsPublic:
    """A sweep's trials in order, paginated."""
    sweep_or_404(session, sweep_id)
    trials, count = store.list_trials(
        session=session, sweep_id=sweep_id, status=status_, offset=offset, limit=limit
    )
    return TrialsPublic(data=[TrialPublic.model_validate(t) for t in trials], count=count)
