"""Builders of test inputs, imported by tests as `from builders import ...`."""

from __future__ import annotations

import asyncio
import atexit
import getpass
import os
import signal
import socket
import ssl
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

import httpx
import uvicorn
from fastapi import FastAPI
from sqlalchemy import event
from sqlalchemy.orm import Session

from gpumux.client import Client
from gpumux.devices.kinds.base import TrialCap
from gpumux.devices.kinds.cpu import CpuKind
from gpumux.devices.snapshot import DeviceSnapshot, GpuProcess
from gpumux.fields import MAX_COUNT
from gpumux.grammar.sweepplan import SweepPlan, parse_objective
from gpumux.home import tokenfile
from gpumux.schemas.common import Problem
from gpumux.schemas.sweeps import SweepCreate, SweepPublic
from gpumux.schemas.trials import TrialPublic
from gpumux.search import planning
from gpumux.status import SearchMethod, SweepStatus, TrialStatus
from gpumux.storage import lifecycle, membership, tokens
from gpumux.storage import owners as owner_store
from gpumux.storage import sweeps as sweep_store
from gpumux.storage import trials as trial_store
from gpumux.storage.budget import ReportBudget
from gpumux.storage.engine import Sessions
from gpumux.storage.models import Sweep, Trial, token_hash


def ample_budget() -> ReportBudget:
    """A report budget no test's few reports reach: each report of a new step takes a row."""
    return ReportBudget(rate=1e6, burst=10**6, rows=10**6)


def sweep_body(tmp_path: Path, *params: str, **fields: Any) -> dict[str, Any]:
    """A POST /sweeps body as a client sends it: the parameters given, a command, a directory."""
    return {
        "params": list(params),
        "command": ["python", "train.py"],
        "workdir": str(tmp_path),
        "env": {"PATH": os.environ["PATH"]},
        **fields,
    }


def sweep_in(
    workdir: Path, *params: str, command: list[str] | None = None, **fields: object
) -> SweepCreate:
    """A SweepCreate running `command` in `workdir` with this interpreter's environment."""
    return SweepCreate.model_validate(
        {
            "params": list(params),
            "command": command or ["true"],
            "workdir": str(workdir),
            "env": dict(os.environ),
            **fields,
        }
    )


def planned(
    sweep: SweepCreate, *, seed: int = 1, trial_params: Sequence[dict[str, Any]] | None = None
) -> SweepPlan:
    """The plan the API stores for `sweep` (its trials, or `trial_params` in their place)."""
    plan = planning.plan_sweep(sweep, max_grid=MAX_COUNT, seed=seed)
    return plan if trial_params is None else replace(plan, trial_params=list(trial_params))


def sweep_plan(
    workdir: Path,
    *params: str,
    command: list[str] | None = None,
    seed: int = 1,
    trial_params: Sequence[dict[str, Any]] | None = None,
    **fields: object,
) -> SweepPlan:
    """The plan of sweep_in(workdir, *params, command=command, **fields), as planned()."""
    sweep = sweep_in(workdir, *params, command=command, **fields)
    return planned(sweep, seed=seed, trial_params=trial_params)


CPU = DeviceSnapshot(
    key="cpu",
    kind="cpu",
    index=0,
    name="Test CPU",
    uuid=None,
    memory_total_mb=16000,
    memory_used_mb=4000,
    memory_free_mb=12000,
    utilization_pct=None,
    processes=None,
    cpu_count=8,
)


def cpu_snapshot(**fields: Any) -> DeviceSnapshot:
    """A CPU device as the probe reports it: 8 cores, 12 GB of 16 free; `fields` override."""
    return replace(CPU, **fields)


# An H100's memory as NVML reports it, in MiB.
H100_MB = 81559


def h100_snapshot(held: Mapping[int, int | None], *, unlisted_mb: int = 0) -> DeviceSnapshot:
    """An H100 listing the processes of `held` (pid: MiB it holds; None: listed without its
    memory), and `unlisted_mb` used that no process accounts for."""
    used = sum(mb or 0 for mb in held.values()) + unlisted_mb
    return DeviceSnapshot(
        key="GPU-0",
        kind="gpu",
        index=0,
        name="NVIDIA H100 80GB HBM3",
        uuid="GPU-0",
        memory_total_mb=H100_MB,
        memory_used_mb=used,
        memory_free_mb=H100_MB - used,
        utilization_pct=0,
        processes=tuple(GpuProcess(pid=pid, used_memory_mb=mb) for pid, mb in held.items()),
        cpu_count=None,
    )


def cpu_trial_env(threads: int) -> dict[str, str]:
    """The device part of a CPU trial's environment with `threads` threads, as its kind sets it
    (no memory size: the trial contract's tests compare it whole)."""
    device = cpu_snapshot(memory_total_mb=None)
    cap = TrialCap(memory_limit_mb=None, cpu_threads=threads)
    return dict(CpuKind().trial_setup(device, slot=0, cap=cap, pin=False).env)


@contextmanager
def selects(sessions: Sessions) -> Iterator[list[tuple[str, Any]]]:
    """The SELECT statements run on the engine inside the block, with their parameters."""
    statements: list[tuple[str, Any]] = []

    def record(_conn: Any, _cursor: Any, statement: str, parameters: Any, *_: Any) -> None:
        if statement.lstrip().upper().startswith("SELECT"):
            statements.append((statement, parameters))

    event.listen(sessions.engine, "before_cursor_execute", record)
    try:
        yield statements
    finally:
        event.remove(sessions.engine, "before_cursor_execute", record)


def stored_sweep(
    session: Session, tmp_path: Path, n: int = 3, *, owner: str = "alice", **fields: Any
) -> Sweep:
    """A sweep of `n` trials (x = 1..n) stored for `owner` as the API stores one."""
    return sweep_store.create_sweep(
        session=session,
        plan=sweep_plan(
            tmp_path,
            f"x=1..{n}",
            **fields,
            seed=7,
            trial_params=[{"x": i} for i in range(1, n + 1)],
        ),
        owner=owner_store.get_or_create_owner(session=session, name=owner),
    )


def joined_nodes(session: Session, *names: str) -> list[int]:
    """The ids of nodes that joined the database under `names`, one after the other."""
    return [
        membership.join(
            session=session,
            name=name,
            home=f"home-{name}",
            url=None,
            pid=1,
            lease_s=30,
            lost_retries=2,
        ).id
        for name in names
    ]


def sweep_public(**fields: Any) -> SweepPublic:
    """A sweep as the API answers one (ada's, running, a grid, ranked by val_loss:min), with
    `fields` instead (`objective` in the joined form `loss:max`, or None for none)."""
    values: dict[str, Any] = dict(
        id=3,
        name=None,
        owner="ada",
        status=SweepStatus.running,
        command=["python", "train.py"],
        params=["lr=1e-4..1e-1"],
        workdir="/tmp",
        trials=None,
        seed=11,
        split="auto",
        metric="val_loss",
        mode="min",
        time_limit_s=None,
        trial_count=2,
        cancel_requested=False,
        created_at=datetime.now(UTC),
        finished_at=None,
        counts={},
    )
    if "objective" in fields:
        objective = fields.pop("objective")
        metric, mode = parse_objective(objective) if objective else (None, None)
        fields |= {"metric": metric, "mode": mode}
    return SweepPublic.model_validate(values | fields)


def trial_public(**fields: Any) -> TrialPublic:
    """A trial as the API answers one (trial 1 of sweep 3, succeeded on the CPU now), with
    `fields` instead."""
    now = datetime.now(UTC)
    values: dict[str, Any] = dict(
        id=1,
        sweep_id=3,
        number=1,
        params={},
        status=TrialStatus.succeeded,
        attempt=1,
        device="cpu",
        slot=0,
        split=2,
        memory_limit_mb=None,
        cpu_threads=1,
        pid=None,
        queued_at=now,
        started_at=now,
        ended_at=now,
        exit_code=None,
        signal=None,
        error=None,
        objective=None,
        samples_per_s=None,
        last_report_at=None,
    )
    return TrialPublic.model_validate(values | fields)


def launched(session: Session, trial: Trial, *, running: bool = False, **fields: Any) -> None:
    """Record a queued trial as launched with `fields` (its device, slot, split, process group):
    starting, or running once its command started (`running`)."""
    lifecycle.set_trial_status(session=session, trial=trial, status=TrialStatus.starting, **fields)
    if running:
        lifecycle.set_trial_status(session=session, trial=trial, status=TrialStatus.running)


def stored_running_trial(session: Session, tmp_path: Path, **fields: Any) -> int:
    """The one trial of a stored sweep ranked by val_loss, running with the report token
    "secret" (and `fields`, e.g. its attempt); its id."""
    sweep = stored_sweep(session, tmp_path, 1, objective="val_loss:min")
    trial = trial_store.list_trials(session=session, sweep_id=sweep.id)[0][0]
    launched(session, trial, running=True, token_hash=token_hash("secret"), **fields)
    return trial.id


def adaptive_sweep(
    session: Session,
    tmp_path: Path,
    budget: int,
    *params: str,
    search: SearchMethod = SearchMethod.tpe,
    owner: str = "alice",
    **fields: Any,
) -> Sweep:
    """An adaptive sweep with a budget of `budget` trials, none asked yet, stored as the API
    stores one (default: tpe over x=1..100 and lr=1e-4..1e-1, minimising loss)."""
    fields.setdefault("objective", "loss:min")
    return sweep_store.create_sweep(
        session=session,
        plan=sweep_plan(
            tmp_path,
            *(params or ("x=1..100", "lr=1e-4..1e-1")),
            trials=budget,
            search=search,
            **fields,
            seed=7,
            trial_params=[],
        ),
        owner=owner_store.get_or_create_owner(session=session, name=owner),
    )


def bearer(sessions: Sessions, user: str | None = None) -> dict[str, str]:
    """Headers carrying a fresh API token of `user` (default: whoever runs the tests)."""
    with sessions.write.begin() as session:
        token = tokens.create_token(session=session, owner_name=user or getpass.getuser())
    return {"Authorization": f"Bearer {token}"}


def daemon_token(home: Path) -> str:
    """The token a daemon keeps for its own user in its data directory."""
    token = tokenfile.daemon_token(home)
    assert token is not None, f"no daemon token in {home}"
    return token


def daemon_bearer(home: Path) -> dict[str, str]:
    """Headers carrying the token a daemon keeps for its own user in its data directory."""
    return {"Authorization": f"Bearer {daemon_token(home)}"}


# The context of served()'s clients, which speak plain HTTP: none trusted, where httpx's default
# loads the CA bundle for each client (0.1-0.6 s a test under load, for a TLS never used).
PLAIN_HTTP = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)


class _Mount:
    """The ASGI app of a shared server: forwards each request to the app of the test that now
    holds the server (lifespan off: requests only)."""

    def __init__(self) -> None:
        self.app: FastAPI | None = None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        assert self.app is not None, f"a request after its test let the server go: {scope}"
        await self.app(scope, receive, send)


class _SharedServer:
    """uvicorn on a real TCP socket in a thread of its own, kept for the whole run: starting one
    is quick, but stopping one takes uvicorn 0.2 s (its ticks of 0.1 s), on each of hundreds of
    tests. Each test mounts its own app; nothing of a test's outlives it but the socket."""

    def __init__(self) -> None:
        self.mount = _Mount()
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        # A connection a test's client left open closes within a second, well inside IDLE_WAIT_S.
        self.server = uvicorn.Server(
            uvicorn.Config(self.mount, log_level="warning", lifespan="off", timeout_keep_alive=1)
        )
        # A daemon thread: the run may end with the server still idle in the pool (stopped at
        # exit, below, where the interpreter lets it).
        self.thread = threading.Thread(
            target=lambda: asyncio.run(self.server.serve(sockets=[self.sock])), daemon=True
        )
        self.thread.start()

    def idle(self) -> bool:
        """Whether no connection or request of the last test is left (waits IDLE_WAIT_S at most)."""
        state = self.server.server_state
        deadline = time.monotonic() + IDLE_WAIT_S
        while state.connections or state.tasks:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.005)
        return True

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join()
        self.sock.close()


# How long a test's connections may take to close once its clients have: a server still busy
# with the test's requests after it is stopped, not lent to the next test.
IDLE_WAIT_S = 5.0
_idle_servers: list[_SharedServer] = []


@atexit.register
def _stop_idle_servers() -> None:
    while _idle_servers:
        _idle_servers.pop().stop()


@contextmanager
def served(app: FastAPI, headers: Mapping[str, str] | None = None) -> Iterator[httpx.Client]:
    """A client of `app` served by uvicorn on a real TCP socket, in a thread, for the block (a
    server of the run's, idle, lent to the block: see _SharedServer)."""
    server = _idle_servers.pop() if _idle_servers else _SharedServer()
    server.mount.app = app
    try:
        with httpx.Client(
            base_url=server.url, timeout=30, headers=headers, verify=PLAIN_HTTP
        ) as client:
            yield client
    finally:
        drained = server.idle()
        server.mount.app = None
        if drained:
            _idle_servers.append(server)
        else:
            server.stop()


# Marks every process a test starts (through the environment it inherits, which the trials of
# its sweeps get too), so that conftest finds what a test left running; not GPUMUX_*: the CLI
# tests pass no GPUMUX_* variable of their own on.
TEST_MARK = "PYTEST_GPUMUX_TEST"


def unmarked_environment() -> dict[str, str]:
    """This process's environment without TEST_MARK: for a process that outlives the test that
    starts it (a PostgreSQL server a test resumes belongs to its cluster)."""
    return {name: value for name, value in os.environ.items() if name != TEST_MARK}


# What a terminal's Ctrl-C and hang-up send. A run in the background (nohup, or `&` in a script)
# inherits them ignored and passes that on to everything it starts; gpumux keeps it so (nohup's
# point), so a test that sends one starts its subject as a terminal would, with the defaults.
TERMINAL_SIGNALS = (signal.SIGINT, signal.SIGHUP)


def terminal_signals() -> None:
    """For Popen's preexec_fn: the child takes Ctrl-C and hang-up as a terminal's process does,
    however the tests were started (only signal calls run between fork and exec)."""
    for signum in TERMINAL_SIGNALS:
        signal.signal(signum, signal.SIG_DFL)


def problem(response: httpx.Response, status_code: int) -> Problem:
    """The response's Problem body, once its status is checked."""
    assert response.status_code == status_code, response.text
    assert set(response.json()) == {"detail", "errors"}
    return Problem.model_validate(response.json())


def kill_processes_naming(path: Path) -> list[int]:
    """SIGKILL every process whose command line names `path` (a test's leftovers); their pids."""
    needle = os.fsencode(path)
    killed = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry.name}/cmdline", "rb") as cmdline:
                named = needle in cmdline.read()
            if named:
                os.kill(int(entry.name), signal.SIGKILL)
                killed.append(int(entry.name))
        except (OSError, ProcessLookupError):
            continue
    return killed


# The simulated GPU's trial (gpumux.devices.simulated): it sleeps as the device's model says.
SIMULATED_TRIAL = [sys.executable, "-m", "gpumux.devices.simulated.trial"]


def simulated_sweep(
    client: Client, *, trials: int, split: int | Literal["auto"], args: Sequence[str] = ()
) -> int:
    """The id of a new sweep of `trials` simulated trials given `args`, in this directory and
    environment."""
    created = client.create_sweep(
        SweepCreate(
            params=[],
            command=[*SIMULATED_TRIAL, *args],
            workdir=str(Path.cwd()),
            env=dict(os.environ),
            trials=trials,
            split=split,
        )
    )
    return created.id
