"""Launching a placed trial: claim its slot in the database, then start its supervisor."""

from __future__ import annotations

import logging
import os
import secrets
import time
from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session

from gpumux.config import Settings
from gpumux.devices.kinds import kind_of
from gpumux.devices.kinds.base import TrialCap
from gpumux.devices.snapshot import DeviceSnapshot
from gpumux.grammar.command import render_command
from gpumux.home import accounts
from gpumux.processes import rundir
from gpumux.processes.contract import LaunchSpec
from gpumux.processes.spawner_client import Spawner
from gpumux.processes.supervised import LaunchError, SupervisedTrial, SupervisorOptions
from gpumux.scheduling.placement import Placement
from gpumux.scheduling.reconcile import run_dir
from gpumux.scheduling.watched import Running
from gpumux.status import TrialStatus
from gpumux.storage import lifecycle
from gpumux.storage import trials as trial_store
from gpumux.storage.engine import Sessions
from gpumux.storage.models import Sweep, Trial
from gpumux.storage.nodes import ThisNode

log = logging.getLogger(__name__)


def node_lease_file(settings: Settings, sessions: Sessions) -> Path | None:
    """The file that says until when this node's supervisors may run its trials: only on a
    database other nodes share (none can take a trial from the one daemon on SQLite)."""
    return settings.layout.node_lease if sessions.dialect.shared else None


class _LeaseLapsed(Exception):
    """A claim found the lease file lapsed once it held the write lock: undone."""


class Launcher:
    """Starts placed trials under their supervisors; fails those that cannot start."""

    def __init__(
        self,
        *,
        settings: Settings,
        sessions: Sessions,
        url: str,
        spawner: Spawner | None = None,
        here: ThisNode | None = None,
    ) -> None:
        self.settings = settings
        self.sessions = sessions
        # The node incarnation that claims: a claim needs its lease to hold.
        self.here = here or ThisNode()
        # Forks the supervisors, when the daemon runs one; else each starts afresh.
        self.spawner = spawner
        # Where trials report: the daemon's first listening address.
        self.url = url
        # A scheduler that runs for no node (a tool, a test) holds no lease to watch.
        lease_file = None if self.here.identity is None else node_lease_file(settings, sessions)
        self.lease_file = lease_file
        # Whether the log said that claims wait for a renewal, since the lease last held.
        self._lapse_said = False
        self.options = SupervisorOptions(
            kill_grace=settings.kill_grace,
            heartbeat_interval=settings.heartbeat_interval,
            log_max_bytes=int(settings.log_max_mb * 1024 * 1024),
            log_keep=settings.log_keep,
            lease_file=None if lease_file is None else str(lease_file),
        )

    def launch(self, chosen: Placement, device: DeviceSnapshot) -> Running | None:
        """Start one placed trial: record it as starting in its slot, then spawn its supervisor.
        None when it did not start (gone, no longer queued, or failed with the reason)."""
        if self.lease_file_lapsed():
            return None
        token = secrets.token_urlsafe(32)
        try:
            # One transaction, one commit: a launch's every write waits for the disk.
            with self.sessions.write.begin() as session:
                trial = trial_store.claim_trial(
                    session=session, trial_id=chosen.trial_id, node=self.here.identity
                )
                if trial is None:
                    return None
                # The claim may have waited for the write lock past the lease file; held now,
                # it keeps the renewal out, so the file cannot hold again before the commit.
                if self.lease_file_lapsed():
                    raise _LeaseLapsed
                try:
                    user, user_env = run_as(trial.sweep)
                except LaunchError as error:
                    log.warning("trial %s: %a", chosen.trial_id, str(error))
                    lifecycle.record_not_started(session=session, trial=trial, error=str(error))
                    return None
                spec = self._claim(session, trial, chosen, device, token, user_env)
                time_limit = trial.sweep.time_limit_s
                directory = run_dir(self.settings, trial)
        except _LeaseLapsed:
            # The claim rolled back: the trial stays queued, its attempts untouched.
            return None
        spawner = self.spawner.serving(preload=spec.preload) if self.spawner is not None else None
        try:
            process = SupervisedTrial.spawn(
                spec, run_dir=directory, options=self.options, user=user, spawner=spawner
            )
        except LaunchError as error:
            log.warning("trial %s: %s", chosen.trial_id, error)
            self.fail_unstarted(chosen.trial_id, str(error))
            return None
        # It counts as running once its supervisor has started the command (the loop records
        # that with the leader's pid, soon).
        return Running(
            process=process,
            sweep_id=spec.sweep_id,
            memory_limit_mb=chosen.memory_limit_mb,
            deadline=time.monotonic() + time_limit if time_limit else None,
        )

    def lease_file_lapsed(self) -> bool:
        """Whether the lease this host's supervisors obey (`node.lease`) has lapsed, though the
        database's may hold: a renewal that waited (for the write lock, for the CPU) past it
        writes a file counted from before the wait. A claim then starts a supervisor that
        refuses to run the trial, and each refusal requeues it as its next attempt: claimed
        again at once, it would use up its retries and end lost without having run. The next
        renewal writes a lease that holds, and the claims go on."""
        if self.lease_file is None or not rundir.lease_lapsed(self.lease_file):
            self._lapse_said = False
            return False
        if not self._lapse_said:
            log.warning(
                "node %s: its lease file has lapsed (a renewal late, or unable to write it); "
                "claiming nothing until one renews it",
                self.here.identity.name if self.here.identity is not None else "-",
            )
            self._lapse_said = True
        return True

    def _claim(
        self,
        session: Session,
        trial: Trial,
        chosen: Placement,
        device: DeviceSnapshot,
        token: str,
        user_env: dict[str, str],
    ) -> LaunchSpec:
        """Record the trial as starting in its slot, on this node; the spec its supervisor
        starts it from."""
        log_path = self.settings.layout.trial_log(
            sweep_id=trial.sweep_id, trial_id=trial.id, attempt=trial.attempt
        )
        lifecycle.record_launch(
            session=session,
            trial=trial,
            node_id=self.here.id,
            device=chosen.device_key,
            slot=chosen.slot,
            split=chosen.split,
            memory_limit_mb=chosen.memory_limit_mb,
            cpu_threads=chosen.cpu_threads,
            token=token,
            log_path=str(log_path),
        )
        sweep = trial.sweep
        setup = kind_of(device).trial_setup(
            device,
            slot=chosen.slot,
            cap=TrialCap(memory_limit_mb=chosen.memory_limit_mb, cpu_threads=chosen.cpu_threads),
            pin=self.settings.cpu_affinity,
        )
        return LaunchSpec(
            trial_id=trial.id,
            sweep_id=sweep.id,
            attempt=trial.attempt,
            argv=render_command(sweep.command, trial.params),
            workdir=sweep.workdir,
            base_env={**sweep.env, **user_env},
            params=trial.params,
            url=self.url,
            token=token,
            log_path=log_path,
            device_kind=device.kind,
            split=chosen.split,
            device_env=setup.env,
            cpu_affinity=setup.cpu_affinity,
            preload=sweep.preload,
        )

    def fail_unstarted(self, trial_id: int, error: str) -> None:
        """Record a trial that could not start as failed, with the reason."""
        node_id = self.here.id
        with self.sessions.write.begin() as session:
            trial = trial_store.get_trial(session=session, trial_id=trial_id)
            if trial is not None and trial.status is TrialStatus.queued:
                trial = trial_store.claim_trial(
                    session=session, trial_id=trial_id, node=self.here.identity
                )
            elif trial is not None and trial.status is TrialStatus.starting:
                trial = trial if trial.node_id in (node_id, None) else None
            else:
                trial = None
            if trial is not None:
                lifecycle.record_not_started(session=session, trial=trial, error=error)


def run_as(sweep: Sweep) -> tuple[dict[str, Any] | None, dict[str, str]]:
    """Whom a trial of this sweep runs as: when the daemon is root, the sweep's owner (their
    uid, gid and groups, their HOME), never root's; otherwise the daemon's own user."""
    if os.geteuid() != 0:
        return None, {}
    try:
        account = accounts.UserAccount.from_name(sweep.owner.name)
    except accounts.UnknownUser as error:
        raise LaunchError(f"cannot run as {sweep.owner.name}: {error}") from error
    if account.uid == 0:
        return None, {}
    reason = accounts.readable_directory(sweep.workdir, account)
    if reason is not None:
        raise LaunchError(f"{account.name} cannot use the working directory: {reason}")
    user = {"uid": account.uid, "gid": account.gid, "groups": list(account.groups)}
    env = {"HOME": str(account.home), "USER": account.name, "LOGNAME": account.name}
    return user, env
