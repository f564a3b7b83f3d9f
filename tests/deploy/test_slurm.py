"""The Slurm batch scripts of deploy/slurm: their shape, and the graceful stop at the time limit run
for real (bash, a real daemon, a real database and real trials) with Slurm played by a shim."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from builders import kill_processes_naming
from ports import free_port
from sqlalchemy import select

from gpumux.scheduling.idle import IdleClock
from gpumux.status import NodeState, TrialStatus
from gpumux.storage import backlog
from gpumux.storage.engine import make_engine, make_sessions
from gpumux.storage.models import Node, Trial

ROOT = Path(__file__).parents[2]
SLURM = ROOT / "deploy" / "slurm"
NODES = SLURM / "gpumux-nodes.sbatch"
SLEEPER = ROOT / "tests" / "fixtures" / "sleeper.py"
JOB_ID = "4242"
# A bound against a hang, not a speed: a daemon's whole start took over 20 s on 2 cores with
# two suites running (load 9-14).
DEADLINE_S = 60.0
# The nodes of the job that starts them all at once: more than two, as a real job may have;
# and how long they may take to start together on a machine that may have fewer cores.
NODES_AT_ONCE = 4
NODES_START_S = 120.0

# The long options of sbatch (Slurm 23.11's man page) that a script may set in #SBATCH lines.
SBATCH_OPTIONS = frozenset(
    """account acctg-freq array batch bb bbf begin chdir cluster-constraint clusters comment
    constraint container contiguous core-spec cores-per-socket cpu-freq cpus-per-gpu
    cpus-per-task deadline delay-boot dependency distribution error exclude exclusive export
    export-file extra get-user-env gid gpu-bind gpu-freq gpus gpus-per-node gpus-per-socket
    gpus-per-task gres gres-flags hint hold ignore-pbs input job-name kill-on-invalid-dep
    licenses mail-type mail-user mcs-label mem mem-bind mem-per-cpu mem-per-gpu mincpus
    network nice no-kill no-requeue nodefile nodelist nodes ntasks ntasks-per-core
    ntasks-per-gpu ntasks-per-node ntasks-per-socket open-mode output overcommit oversubscribe
    parsable partition power prefer priority profile propagate qos quiet reboot requeue
    reservation signal sockets-per-node spread-job switches test-only thread-spec
    threads-per-core time time-min tmp tres-per-task uid use-min-nodes verbose wait
    wait-all-nodes wckey wrap""".split()
)

# Slurm's srun, played on this one machine (no Slurm can run here): its options are dropped and
# the command runs as one task on each node of the job (--ntasks-per-node=1), all started at
# once, as srun starts them; each node is played by a local disk (TMPDIR) and a port (the next
# of NODE_PORTS) of its own. Each call is noted in SRUN_LOG.
SRUN_SHIM = """#!/usr/bin/env bash
echo "$*" >>"$SRUN_LOG"
while [ $# -gt 0 ] && [ "${1#-}" != "$1" ]; do shift; done
read -ra ports <<<"$NODE_PORTS"
tasks=()
for ((node = 0; node < SLURM_JOB_NUM_NODES; node++)); do
    mkdir -p "$TMPDIR/host$node"
    SLURM_PROCID=$node SLURM_LOCALID=0 SLURM_NODEID=$node TMPDIR="$TMPDIR/host$node" \\
        GPUMUX_PORT="${ports[$node]}" "$@" &
    tasks+=($!)
done
status=0
for task in "${tasks[@]}"; do wait "$task" || status=$?; done
exit "$status"
"""


def sbatch_options(script: Path) -> dict[str, str]:
    """The #SBATCH options of a batch script, each name with its value."""
    options = {}
    for line in script.read_text().splitlines():
        if line.startswith("#SBATCH"):
            name, _, value = line.removeprefix("#SBATCH").strip().partition("=")
            options[name] = value
    return options


@pytest.mark.parametrize("script", sorted(SLURM.glob("*.sbatch")), ids=lambda p: p.name)
def test_every_batch_script_is_bash_with_options_sbatch_knows(script: Path) -> None:
    subprocess.run(["bash", "-n", str(script)], check=True)
    options = sbatch_options(script)
    assert options, f"{script.name} sets no #SBATCH option"
    unknown = {name for name in options if name.removeprefix("--") not in SBATCH_OPTIONS}
    assert not unknown and all(name.startswith("--") for name in options), unknown
    assert "umask 077" in script.read_text()


def test_the_node_script_traps_the_signal_slurm_sends_its_batch_shell() -> None:
    text = NODES.read_text()
    options = sbatch_options(NODES)
    assert options["--ntasks-per-node"] == "1"
    signal_spec = re.fullmatch(r"B:(\w+)@(\d+)", options["--signal"])
    assert signal_spec is not None, options["--signal"]
    sent = signal_spec.group(1)
    assert re.search(rf"^trap stop_every_node {sent}$", text, re.MULTILINE)
    # The daemons alone are told, through srun, on every node of the job.
    assert "srun --overlap" in text and "kill -TERM" in text
    assert re.search(r"^srun [^\n]*\\\n[^\n]*node_task\"? &$", text, re.MULTILINE)


def test_each_task_has_its_own_node_name_and_local_data_directory_on_the_shared_database() -> None:
    text = NODES.read_text()
    assert 'GPUMUX_NODE_NAME="$(hostname -s)-${SLURM_JOB_ID}-${SLURM_PROCID}"' in text
    assert 'GPUMUX_HOME="$(node_home "$SLURM_PROCID")"' in text
    assert '"${TMPDIR:-/tmp}" "$SLURM_JOB_ID"' in text
    assert ": ${GPUMUX_DATABASE_URL:?" in text.replace('"', "")
    assert "GPUMUX_STOP_TRIALS=true" in text and "GPUMUX_LEAVE_WHEN_IDLE" in text


def test_the_node_script_refuses_to_start_without_a_database_url(tmp_path: Path) -> None:
    env = {"PATH": os.environ["PATH"], "SLURM_JOB_ID": JOB_ID, "HOME": str(tmp_path)}
    ran = subprocess.run(["bash", str(NODES)], env=env, capture_output=True, text=True)
    assert ran.returncode != 0
    assert "set GPUMUX_DATABASE_URL to the shared database" in ran.stderr


def test_the_idle_clock_counts_only_an_unbroken_empty_queue() -> None:
    clock = IdleClock(10.0)
    assert not clock.observe(pending=0, now=100.0)
    assert not clock.observe(pending=1, now=109.0)
    assert not clock.observe(pending=0, now=110.0)
    assert not clock.observe(pending=None, now=115.0)
    assert not clock.observe(pending=0, now=120.0)
    assert clock.observe(pending=0, now=130.0)


def batch_job(
    tmp_path: Path, *, nodes: int = 1, **settings: str
) -> tuple[subprocess.Popen[str], Path, Path]:
    """The node script started as Slurm's batch shell of a job of `nodes` nodes (on an SQLite
    file unless `settings` name another database): the job, the first node daemon's data
    directory and the SQLite file. Each node's Unix socket lives below `tmp_path`: a short one
    (short_tmp_path), as a Unix socket's path is 107 bytes at most."""
    shim = tmp_path / "slurm-bin"
    venv = tmp_path / "venv"
    for directory in (shim, venv / "bin", tmp_path / "node", tmp_path / "submit"):
        directory.mkdir(parents=True)
    (shim / "srun").write_text(SRUN_SHIM)
    (venv / "bin" / "gpumux").write_text(f'#!/bin/sh\nexec {sys.executable} -m gpumux "$@"\n')
    (venv / "bin" / "activate").write_text(f'export PATH="{venv}/bin:$PATH"\n')
    for executable in (shim / "srun", venv / "bin" / "gpumux"):
        executable.chmod(0o755)
    database = tmp_path / "db" / "gpumux.db"
    database.parent.mkdir()
    env = {
        "PATH": f"{shim}:{os.environ['PATH']}",
        "HOME": str(tmp_path),
        "PYTHONPATH": str(ROOT),
        "TMPDIR": str(tmp_path / "node"),
        "SRUN_LOG": str(tmp_path / "srun.log"),
        "SLURM_JOB_ID": JOB_ID,
        "SLURM_JOB_NUM_NODES": str(nodes),
        "SLURM_CPUS_PER_TASK": "2",
        "SLURM_SUBMIT_DIR": str(tmp_path / "submit"),
        "GPUMUX_DATABASE_URL": f"sqlite:///{database}",
        "GPUMUX_VENV": str(venv),
        "GPUMUX_HOST": "127.0.0.1",
        "NODE_PORTS": " ".join(str(free_port()) for _ in range(nodes)),
        "GPUMUX_POLL_INTERVAL": "0.2",
        "GPUMUX_KILL_GRACE": "5",
        **settings,
    }
    # A process group of its own, as a batch shell has: end() kills the job's daemons with it.
    job = subprocess.Popen(
        ["bash", str(NODES)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    return job, tmp_path / "node" / "host0" / f"gpumux-{JOB_ID}-0", database


def wait_for(
    condition: object, what: str, job: subprocess.Popen[str], timeout: float = DEADLINE_S
) -> None:
    """Poll `condition` (a callable) until true; fail with the job's output past `timeout`."""
    assert callable(condition)
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline or job.poll() is not None:
            output = end(job)
            raise AssertionError(f"{what}: not within {timeout} s; the job said:\n{output}")
        time.sleep(0.05)


def end(job: subprocess.Popen[str]) -> str:
    """Kill the job's process group (its shell, srun's tasks, the daemons they started), so
    that nothing keeps its output open; what it said."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(job.pid, signal.SIGKILL)
    output, _ = job.communicate()
    return output


def serves(socket_path: Path) -> bool:
    """Whether a node daemon answers /health on its Unix socket."""
    # Connected first by hand: httpx leaves the socket of a refused connection open.
    with socket.socket(socket.AF_UNIX) as probe:
        try:
            probe.connect(str(socket_path))
        except OSError:
            return False
    transport = httpx.HTTPTransport(uds=str(socket_path))
    with httpx.Client(transport=transport, base_url="http://gpumux", timeout=10) as client:
        return client.get("/health").status_code == 200


def alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie, waiting for its parent to reap it, runs nothing)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def test_the_time_limit_signal_stops_the_node_gracefully_and_requeues_its_running_trials(
    short_tmp_path: Path,
) -> None:
    """Slurm sends USR1 to the batch shell (--signal=B:USR1@300): every running trial is
    stopped and requeued for the next job, none lost or failed, and the job ends with 0."""
    job, home, database = batch_job(short_tmp_path, GPUMUX_LEAVE_WHEN_IDLE="60")
    job_dir = short_tmp_path / "submit" / f"gpumux-job-{JOB_ID}"
    pids = short_tmp_path / "pids"
    pids.mkdir()
    try:
        wait_for(lambda: any((job_dir / "nodes").glob("*.url")), "the node published its URL", job)
        (url_file,) = (job_dir / "nodes").glob("*.url")
        assert url_file.name.endswith(f"-{JOB_ID}-0.url")
        assert (job_dir / "token").stat().st_mode & 0o077 == 0
        transport = httpx.HTTPTransport(uds=str(home / "gpumux.sock"))
        with httpx.Client(transport=transport, base_url="http://gpumux", timeout=10) as client:
            created = client.post(
                "/sweeps",
                json={
                    "params": ["x=1,2"],
                    "command": [sys.executable, str(SLEEPER), str(pids / "trial-{x}")],
                    "workdir": str(short_tmp_path),
                    "env": {"PATH": os.environ["PATH"]},
                    "split": 2,
                },
            )
            assert created.status_code == 201, created.text
            trials_url = f"/sweeps/{created.json()['id']}/trials"

            def both_running() -> bool:
                trials = client.get(trials_url).json()["data"]
                running = [t for t in trials if t["status"] == TrialStatus.running]
                return len(running) == 2 and len(list(pids.glob("trial-?"))) == 2

            wait_for(both_running, "both trials running", job)
        job.send_signal(signal.SIGUSR1)
        output, _ = job.communicate(timeout=DEADLINE_S)
        assert job.returncode == 0, output
    finally:
        if job.poll() is None:
            end(job)
    assert "the time limit is near: a graceful stop on every node" in output
    assert "graceful stop: launching nothing new, stopping trials" in output
    assert "immediate stop" not in output
    assert "--overlap" in (short_tmp_path / "srun.log").read_text()
    sessions = make_sessions(make_engine(f"sqlite:///{database}"))
    with sessions.read() as session:
        trials = session.query(Trial).order_by(Trial.id).all()
        assert [(t.status, t.attempt) for t in trials] == [(TrialStatus.queued, 2)] * 2
        assert backlog.pending_work(session=session) == 2
    sessions.engine.dispose()
    trial_pids = [int(pid) for f in pids.glob("trial-?") for pid in f.read_text().split()]
    assert len(trial_pids) == 4 and not any(alive(pid) for pid in trial_pids)
    assert kill_processes_naming(short_tmp_path) == []
    # The node's trial logs outlive its local disk.
    assert list((job_dir / "logs").rglob("trial-*.log"))


def test_the_first_job_on_a_fresh_shared_database_brings_every_node_up_at_once(
    short_tmp_path: Path, pg_database: str
) -> None:
    """srun starts every node of the job at once: on a fresh PostgreSQL database one of them
    migrates it while the others wait, and all join; USR1 then stops them all gracefully."""
    nodes_dir = short_tmp_path / "submit" / f"gpumux-job-{JOB_ID}" / "nodes"
    job, _, _ = batch_job(
        short_tmp_path,
        nodes=NODES_AT_ONCE,
        GPUMUX_DATABASE_URL=pg_database,
        GPUMUX_LEAVE_WHEN_IDLE="60",
    )
    sockets = [
        short_tmp_path / "node" / f"host{n}" / f"gpumux-{JOB_ID}-{n}" / "gpumux.sock"
        for n in range(NODES_AT_ONCE)
    ]
    try:
        wait_for(
            lambda: (
                all(map(serves, sockets)) and len(list(nodes_dir.glob("*.url"))) == len(sockets)
            ),
            "every node serving and published",
            job,
            NODES_START_S,
        )
        published = sorted(url.stem for url in nodes_dir.glob("*.url"))
        sessions = make_sessions(make_engine(pg_database))
        with sessions.read() as session:
            active = select(Node.name).where(Node.state == NodeState.active)
            joined = sorted(session.scalars(active))
        sessions.engine.dispose()
        job.send_signal(signal.SIGUSR1)
        output, _ = job.communicate(timeout=DEADLINE_S)
    finally:
        if job.poll() is None:
            end(job)
    assert job.returncode == 0, output
    assert [name.rpartition("-")[2] for name in published] == [str(n) for n in range(NODES_AT_ONCE)]
    assert joined == published
    assert output.count("upgrading schema None -> head") == 1, output
    assert kill_processes_naming(short_tmp_path) == []


def test_a_node_with_nothing_to_do_leaves_after_its_grace_time_and_the_job_ends_cleanly(
    short_tmp_path: Path,
) -> None:
    job, home, _ = batch_job(short_tmp_path, GPUMUX_LEAVE_WHEN_IDLE="0.5")
    try:
        output, _ = job.communicate(timeout=DEADLINE_S)
    finally:
        if job.poll() is None:
            end(job)
    assert job.returncode == 0, output
    assert "no trial queued or running on" in output and "for 0.5 s; leaving" in output
    assert not (home / "gpumux.sock").exists()
    assert not list((short_tmp_path / "submit" / f"gpumux-job-{JOB_ID}" / "nodes").iterdir())
    assert kill_processes_naming(short_tmp_path) == []


def test_serve_leave_when_idle_exits_0_once_the_database_had_no_work_that_long(
    tmp_path: Path,
) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "gpumux", "serve", "--home", str(tmp_path / "home")]
    ran = subprocess.run(
        [*command, "--leave-when-idle", "0.2"],
        env=env,
        capture_output=True,
        text=True,
        timeout=DEADLINE_S,
    )
    assert ran.returncode == 0, ran.stderr
    assert "for 0.2 s; leaving" in ran.stderr
    refused = subprocess.run(
        [*command, "--leave-when-idle", "-1"], env=env, capture_output=True, text=True
    )
    assert refused.returncode == 2 and "--leave-when-idle" in refused.stderr
