"""Routes for sweeps: submit, list, inspect, cancel."""

from __future__ import annotations

import logging
import secrets
from typing import Annotated

from fastapi import APIRouter, HTTPException, Query, status
from sqlalchemy.orm import Session

from gpumux.fields import MAX_NAME_CHARS, MAX_USER_CHARS
from gpumux.home import accounts
from gpumux.runtime.frameworks import NO_GPU_FIX
from gpumux.schemas.profiles import ProfilePublic
from gpumux.schemas.sweeps import NoGpuPublic, SweepCreate, SweepDetail, SweepPublic, SweepsPublic
from gpumux.schemas.trials import TrialPublic, TrialsPublic
from gpumux.search import methods, planning
from gpumux.server.api.deps import (
    AppState,
    Caller,
    CallerDep,
    Offset,
    ReadSessionDep,
    StateDep,
    SweepId,
    refuse_unless_owner,
)
from gpumux.server.api.responses import AUTHENTICATED, WRITES, problems
from gpumux.splits.window import sweep_fingerprint
from gpumux.status import SweepStatus, TrialStatus
from gpumux.storage import backlog
from gpumux.storage import owners as owner_store
from gpumux.storage import profiles as profile_store
from gpumux.storage import reports as report_store
from gpumux.storage import sweeps as sweep_store
from gpumux.storage import trials as trial_store
from gpumux.storage.models import Sweep

log = logging.getLogger(__name__)

router = APIRouter(tags=["sweeps"], responses=problems(*AUTHENTICATED, 422))


def sweep_public(sweep: Sweep, counts: dict[TrialStatus, int]) -> SweepPublic:
    return SweepPublic(
        id=sweep.id,
        name=sweep.name,
        owner=sweep.owner.name,
        status=sweep.status,
        command=sweep.command,
        params=sweep.param_tokens,
        workdir=sweep.workdir,
        trials=sweep.trial_budget,
        search=sweep.search,
        search_options=sweep.search_options or {},
        prune=sweep.prune,
        seed=sweep.seed,
        split=sweep.split if sweep.split is not None else "auto",
        metric=sweep.objective_metric,
        mode=sweep.objective_mode,
        time_limit_s=sweep.time_limit_s,
        retries=sweep.retries,
        priority=sweep.priority,
        preload=sweep.preload,
        trial_count=sweep.trial_count,
        cancel_requested=sweep.cancel_requested,
        created_at=sweep.created_at,
        finished_at=sweep.finished_at,
        counts=counts,
    )


def sweep_detail(session: Session, sweep: Sweep) -> SweepDetail:
    counts = sweep_store.trial_counts(session=session, sweep_ids=[sweep.id])[sweep.id]
    best = sweep_store.best_trial(session=session, sweep=sweep)
    profiles = []
    if sweep.split is None:
        profiles = profile_store.workload_profiles(
            session=session, fingerprint=sweep_fingerprint(sweep)
        )
    no_gpu = report_store.no_gpu_counts(session=session, sweep_id=sweep.id)
    return SweepDetail(
        **sweep_public(sweep, counts).model_dump(),
        best=TrialPublic.model_validate(best) if best else None,
        profiles=[ProfilePublic.model_validate(profile) for profile in profiles],
        no_gpu=[
            NoGpuPublic.model_validate(
                {"framework": framework, "trials": trials, "fix": NO_GPU_FIX[framework]}
            )
            for framework, trials in sorted(no_gpu.items())
            if framework in NO_GPU_FIX
        ],
    )


def sweep_or_404(session: Session, sweep_id: int, caller: Caller) -> Sweep:
    """The sweep, if it exists (404) and the caller may touch it (403)."""
    sweep = sweep_store.get_sweep(session=session, sweep_id=sweep_id)
    if sweep is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"sweep {sweep_id} not found")
    refuse_unless_owner(caller, sweep.owner.name, f"sweep {sweep_id}")
    return sweep


def check_workdir(sweep_in: SweepCreate, state: AppState, caller: Caller) -> None:
    """Refuse a working directory the user could not enter themselves."""
    if state.daemon_uid == 0 and caller.account.uid != 0:
        # Trials run as the submitter: a directory only root can enter must not become theirs.
        reason = accounts.readable_directory(sweep_in.workdir, caller.account)
        if reason is not None:
            raise HTTPException(
                status.HTTP_403_FORBIDDEN,
                f"{caller.name} cannot use the working directory: {reason}",
            )


def check_quota(session: Session, state: AppState, caller: Caller, trials: int) -> None:
    """Refuse a sweep that would put the user over their queue limit; called in the write
    transaction that stores it, so that concurrent submissions cannot all slip under it."""
    quota = state.settings.max_queued_per_user
    if quota is not None:
        waiting = backlog.queued_count(session=session, owner=caller.name)
        if waiting + trials > quota:
            raise HTTPException(
                status.HTTP_429_TOO_MANY_REQUESTS,
                f"{caller.name} has {waiting:,} trials waiting; {trials:,} more would pass the "
                f"limit of {quota:,} (GPUMUX_MAX_QUEUED_PER_USER): wait, or cancel some",
            )


@router.post("/sweeps", status_code=status.HTTP_201_CREATED, responses=problems(429, *WRITES))
def create_sweep(sweep_in: SweepCreate, state: StateDep, caller: CallerDep) -> SweepDetail:
    """Submit a sweep as the caller; its trials are queued and committed before this answers."""
    try:
        plan = planning.plan_sweep(
            sweep_in, max_grid=state.settings.max_grid, seed=secrets.randbits(31)
        )
        methods.check_installed(plan.search)
    except (planning.PlanError, methods.SearchError) as error:
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, str(error)) from error
    check_workdir(sweep_in, state, caller)
    with state.sessions.write.begin() as session:
        check_quota(session, state, caller, plan.trial_count)
        owner = owner_store.get_or_create_owner(
            session=session, name=caller.name, uid=caller.account.uid
        )
        sweep = sweep_store.create_sweep(session=session, plan=plan, owner=owner)
        detail = sweep_detail(session, sweep)
    state.notify()
    return detail


@router.get("/sweeps")
def list_sweeps(
    session: ReadSessionDep,
    caller: CallerDep,
    status_: Annotated[SweepStatus | None, Query(alias="status")] = None,
    owner: Annotated[
        str | None, Query(max_length=MAX_USER_CHARS, description="whose (admins: anyone's)")
    ] = None,
    name: Annotated[
        str | None,
        Query(
            max_length=MAX_NAME_CHARS,
            description="only sweeps of this name (the caller's own, unless owner is given)",
        ),
    ] = None,
    offset: Offset = 0,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
) -> SweepsPublic:
    """The caller's sweeps (an admin's: everyone's), newest first, with counts by status; by
    name, the caller's own (a name is a user's word for their sweep), unless owner is given."""
    if owner is not None:
        refuse_unless_owner(caller, owner, "the sweeps")
    elif not caller.admin or name is not None:
        owner = caller.name
    sweeps, count = sweep_store.list_sweeps(
        session=session, status=status_, owner=owner, name=name, offset=offset, limit=limit
    )
    counts = sweep_store.trial_counts(session=session, sweep_ids=[sweep.id for sweep in sweeps])
    return SweepsPublic(
        data=[sweep_public(sweep, counts[sweep.id]) for sweep in sweeps], count=count
    )


@router.get("/sweeps/{sweep_id}", responses=problems(404))
def get_sweep(sweep_id: SweepId, session: ReadSessionDep, caller: CallerDep) -> SweepDetail:
    """One sweep with its counts by status and its best trial by the objective."""
    return sweep_detail(session, sweep_or_404(session, sweep_id, caller))


@router.post(
    "/sweeps/{sweep_id}/cancel",
    status_code=status.HTTP_202_ACCEPTED,
    responses=problems(404, *WRITES),
)
def cancel_sweep(sweep_id: SweepId, state: StateDep, caller: CallerDep) -> SweepDetail:
    """Ask for a sweep to stop: queued trials are dropped, running ones terminated."""
    with state.sessions.write.begin() as session:
        sweep = sweep_or_404(session, sweep_id, caller)
        log.info("api: %s cancels sweep %d of %s", caller.name, sweep_id, sweep.owner.name)
        sweep = sweep_store.request_cancel(session=session, sweep=sweep)
        detail = sweep_detail(session, sweep)
    state.notify()
    return detail


@router.get("/sweeps/{sweep_id}/trials", responses=problems(404))
def list_sweep_trials(
    sweep_id: SweepId,
    session: ReadSessionDep,
    caller: CallerDep,
    status_: Annotated[TrialStatus | None, Query(alias="status")] = None,
    offset: Offset = 0,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> TrialsPublic:
    """A sweep's trials in order, paginated."""
    sweep_or_404(session, sweep_id, caller)
    trials, count = trial_store.list_trials(
        session=session, sweep_id=sweep_id, status=status_, offset=offset, limit=limit
    )
    return TrialsPublic(data=[TrialPublic.model_validate(t) for t in trials], count=count)
