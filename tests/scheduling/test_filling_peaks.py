"""SlotFiller.fill gives placement its searches' measured peaks: a first wave's trials, raised
from N=2 to 5 and seen holding little, are budgeted at the new slice only where their
workload's search measured a peak (a real filler over real sessions)."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import timedelta
from pathlib import Path
from typing import Any

from builders import H100_MB, h100_snapshot, stored_sweep

from gpumux.config import Settings
from gpumux.devices.accounting import Overheads
from gpumux.devices.snapshot import DeviceSnapshot
from gpumux.scheduling.filling import SlotFiller
from gpumux.scheduling.placement import Placement
from gpumux.search.studies import Studies
from gpumux.status import TrialStatus
from gpumux.storage import trials as trial_store
from gpumux.storage.engine import Sessions
from gpumux.storage.models import Sweep, utcnow

PIDS = (5001, 5002)
SEEN_MB = 4000


class Searches:
    """The split searches as the filler asks them: the sweep's N raised to 5 on the H100,
    and its workload's measured peak there (`peak`)."""

    def __init__(self, peak: int | None) -> None:
        self.peak = peak
        self.asked: list[tuple[int, str]] = []

    def searched_splits(self, *, session: Any, sweep: Sweep, devices: Any) -> dict[str, int]:
        return {"GPU-0": 5}

    def peak_mb(self, *, sweep: Sweep, device_key: str) -> int | None:
        self.asked.append((sweep.id, device_key))
        return self.peak

    def contexts(
        self, sweeps: Iterable[Sweep], *, session: Any, devices: Any
    ) -> dict[tuple[str, int], int]:
        """No CUDA context measured: every trial holds the configured overhead."""
        return {}


class Launcher:
    """Records what the filler launches; starts nothing."""

    def __init__(self) -> None:
        self.launched: list[Placement] = []

    def launch(self, placement: Placement, device: DeviceSnapshot) -> None:
        self.launched.append(placement)

    def fail_unstarted(self, trial_id: int, reason: str) -> None:
        raise AssertionError(reason)


class Watched:
    def caps_by_group(self) -> dict[int, int]:
        return {}

    def add(self, trial_id: int, started: Any) -> None:
        raise AssertionError("nothing starts")


def h100() -> DeviceSnapshot:
    return h100_snapshot(dict.fromkeys(PIDS, SEEN_MB))


def launched(sessions: Sessions, settings: Settings, tmp_path: Path, peak: int | None) -> int:
    """How many of the sweep's queued trials the filler launches beside its first wave."""
    usable = H100_MB - settings.reserve_mb
    with sessions.write.begin() as session:
        sweep = stored_sweep(session, tmp_path, 7)
        assert sweep.split is None
        wave = trial_store.list_trials(session=session, sweep_id=sweep.id)[0][: len(PIDS)]
        for trial, pid in zip(wave, PIDS, strict=True):
            trial.status, trial.device, trial.split = TrialStatus.running, "GPU-0", 2
            trial.pid = pid
            trial.memory_limit_mb = usable // 2 - settings.overhead_mb
            trial.started_at = utcnow() - timedelta(seconds=30)
            trial.last_report_at = utcnow()
            trial.slot = pid % 100
    overheads = Overheads(configured_mb=settings.overhead_mb)
    searches, launcher = Searches(peak), Launcher()
    filler = SlotFiller(
        settings=settings,
        sessions=sessions,
        searches=searches,  # type: ignore[arg-type]
        studies=Studies(),
        launcher=launcher,  # type: ignore[arg-type]
        watched=Watched(),  # type: ignore[arg-type]
        overheads=overheads,
    )
    filler.fill([h100()], group_of={pid: pid for pid in PIDS})
    assert searches.asked == [(sweep.id, "GPU-0")] * len(PIDS)
    return len(launcher.launched)


def test_the_filler_places_beside_a_raised_wave_by_its_searchs_measured_peak(
    sessions: Sessions, settings: Settings, tmp_path: Path
) -> None:
    # The wave's 2 trials hold 2/5 of the card at the new N: 3 slices of 5 are free.
    assert launched(sessions, settings, tmp_path, peak=SEEN_MB) == 3


def test_the_filler_keeps_a_raised_waves_caps_with_no_measured_peak(
    sessions: Sessions, settings: Settings, tmp_path: Path
) -> None:
    assert launched(sessions, settings, tmp_path, peak=None) == 0
