"""Does a preloaded start pay? Fresh trials (a new interpreter) vs. preloaded ones (forked from a
parent that has imported the framework), running examples/digits_keras.py.

    python benchmarks/preloaded_start.py [--epochs 5] [--repeats 3] [--at-once 1 2 3]

- fresh: `python examples/digits_keras.py` with the environment gpumux's launcher gives a trial
  (the bootstrap sitecustomize on PYTHONPATH, its caps at TensorFlow's import), as the supervisor
  starts it;
- preloaded: one parent imports tensorflow and keras (gpumux.runtime.preloaded.preload) and forks
  each trial, which applies the same caps and runs the script as __main__ (preloaded.run_trial).
Both report to a local report server, as to a daemon: the time to the first epoch's report is
measured from the launch, and the end from the launch to the exit. At 2 and 3 trials at once
each gets the CPU device's threads for its split (cores // split). Variants interleaved, medians
over repeats. Then a correctness check: the caps a preloaded child applied, and the script's result
next to a fresh run's.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from gpumux.devices.kinds.base import TrialCap, cpu_share
from gpumux.devices.kinds.cpu import CpuKind
from gpumux.devices.probes import CpuProbe
from gpumux.processes.contract import LaunchSpec, trial_env

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "examples" / "digits_keras.py"
PRELOAD = ("tensorflow", "keras")
TRIAL_TIMEOUT_S = 600
PROBE = """\
import tensorflow as tf
print("probe: intra", tf.config.threading.get_intra_op_parallelism_threads(),
      "inter", tf.config.threading.get_inter_op_parallelism_threads())
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(
    cpu, [tf.config.LogicalDeviceConfiguration(), tf.config.LogicalDeviceConfiguration()])
print("probe: logical CPUs", len(tf.config.list_logical_devices("CPU")))
"""


@dataclass
class Reports:
    """Arrival times (monotonic) of each trial's first epoch report, from the trials' POSTs."""

    first_epoch: dict[int, float] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)


def serve_reports(reports: Reports) -> tuple[ThreadingHTTPServer, str]:
    """A report server standing in for the daemon: it records when each first epoch arrives."""

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            arrived = time.monotonic()
            if body.get("kind") == "epoch":
                with reports.lock:
                    reports.first_epoch.setdefault(int(body["trial_id"]), arrived)
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: object) -> None:
            """Quiet."""

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True).start()
    return httpd, f"http://127.0.0.1:{httpd.server_address[1]}"


def cpu_env(split: int) -> dict[str, str]:
    """What the CPU device kind sets for a trial at this split, on this host."""
    (device,) = CpuProbe().snapshot()
    cap = TrialCap(memory_limit_mb=None, cpu_threads=cpu_share(device, split) or 1)
    return dict(CpuKind().trial_setup(device, slot=0, cap=cap, pin=False).env)


def environment(trial_id: int, split: int, url: str) -> dict[str, str]:
    """The environment gpumux's launcher gives a CPU trial at this split."""
    base = {name: value for name, value in os.environ.items() if name != "PYTHONPATH"}
    base["TF_CPP_MIN_LOG_LEVEL"] = "2"
    spec = LaunchSpec(
        trial_id=trial_id,
        sweep_id=1,
        attempt=1,
        argv=(),
        workdir=str(ROOT),
        base_env=base,
        params={},
        url=url,
        token="benchmark",
        log_path=Path(os.devnull),
        device_kind="cpu",
        split=split,
        device_env=cpu_env(split),
    )
    return trial_env(spec)


class PreloadingParent:
    """The preloading parent: a process that preloaded the framework and forks trials on request."""

    def __init__(self) -> None:
        started = time.monotonic()
        self.process = subprocess.Popen(
            [sys.executable, __file__, "--preloading-parent"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONPATH": str(ROOT), "TF_CPP_MIN_LOG_LEVEL": "2"},
        )
        assert self.process.stdin is not None and self.process.stdout is not None
        self.stdin, self.stdout = self.process.stdin, self.process.stdout
        self.ready = json.loads(self.stdout.readline())
        self.ready["start_s"] = time.monotonic() - started

    def launch(self, trial_id: int, argv: list[str], env: dict[str, str], log: Path) -> None:
        """Ask the parent to fork one trial."""
        request = {"id": trial_id, "argv": argv, "env": env, "cwd": str(ROOT), "log": str(log)}
        self.stdin.write(json.dumps(request) + "\n")
        self.stdin.flush()

    def ended(self) -> tuple[int, int, float]:
        """The next trial to end: (id, exit status, monotonic time of its end)."""
        line = json.loads(self.stdout.readline())
        return int(line["id"]), int(line["status"]), float(line["ended"])

    def close(self) -> None:
        self.stdin.close()
        self.process.wait(timeout=60)


def preloading_parent_main() -> None:
    """The preloading parent's loop: preload, then fork a trial per request line, report ends."""
    from gpumux.runtime import preloaded

    started = time.monotonic()
    python_threads = preloaded.preload(PRELOAD)
    tasks = sorted(os.listdir("/proc/self/task"))
    names = [Path(f"/proc/self/task/{task}/comm").read_text().strip() for task in tasks]
    ready = {"preload_s": time.monotonic() - started, "threads": python_threads, "tasks": names}
    print(json.dumps(ready), flush=True)
    children: dict[int, int] = {}
    pending, open_input = b"", True
    while open_input or children:
        # Read the descriptor, not sys.stdin: its buffer would hide lines from select().
        if open_input and select.select([0], [], [], 0.01)[0]:
            chunk = os.read(0, 1 << 20)
            open_input = bool(chunk)
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for line in lines:
                request = json.loads(line)
                children[fork_trial(request)] = request["id"]
        elif not open_input:
            time.sleep(0.01)
        while children:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            ended = {"id": children.pop(pid), "status": os.waitstatus_to_exitcode(status)}
            print(json.dumps({**ended, "ended": time.monotonic()}), flush=True)


def fork_trial(request: dict[str, object]) -> int:
    """Fork one preloaded trial in a session of its own, its output in its log; the child's pid."""
    from gpumux.runtime import preloaded

    pid = os.fork()
    if pid:
        return pid
    try:
        os.setsid()
        log = os.open(str(request["log"]), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        preloaded.run_trial(request["argv"], request["env"], str(request["cwd"]))  # type: ignore[arg-type]
    finally:
        os._exit(127)


@dataclass
class Trial:
    """One trial's times, seconds from its launch."""

    first_epoch_s: float
    end_s: float
    status: int


def run_batch(
    variant: str,
    at_once: int,
    epochs: int,
    url: str,
    reports: Reports,
    parent: PreloadingParent,
    logs: Path,
    first_id: int,
) -> list[Trial]:
    """`at_once` trials launched together, fresh or preloaded; each one's times."""
    argv = [sys.executable, str(SCRIPT), f"--epochs={epochs}"]
    launched: dict[int, float] = {}
    ended: dict[int, tuple[float, int]] = {}
    fresh: dict[int, subprocess.Popen[bytes]] = {}
    for trial_id in range(first_id, first_id + at_once):
        env = environment(trial_id, at_once, url)
        log = logs / f"{variant}-{trial_id}.log"
        launched[trial_id] = time.monotonic()
        if variant == "preloaded":
            parent.launch(trial_id, argv, env, log)
        else:
            with log.open("wb") as output:
                fresh[trial_id] = subprocess.Popen(
                    argv,
                    env=env,
                    cwd=ROOT,
                    stdin=subprocess.DEVNULL,
                    stdout=output,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
    while len(ended) < at_once:
        if variant == "preloaded":
            trial_id, status, at = parent.ended()
            ended[trial_id] = (at, status)
            continue
        for trial_id, process in fresh.items():
            if trial_id not in ended and process.poll() is not None:
                ended[trial_id] = (time.monotonic(), process.returncode)
        time.sleep(0.01)
    # Every report is recorded by now: a trial's exit waits for the answers to its reports.
    with reports.lock:
        first = dict(reports.first_epoch)
    return [
        Trial(
            first_epoch_s=first.get(trial_id, float("nan")) - launched[trial_id],
            end_s=ended[trial_id][0] - launched[trial_id],
            status=ended[trial_id][1],
        )
        for trial_id in launched
    ]


def correctness(parent: PreloadingParent, url: str, reports: Reports, logs: Path) -> None:
    """The caps and the result of a preloaded child next to a fresh run's, at split 2 (1 thread)."""
    probe = logs / "probe.py"
    probe.write_text(PROBE)
    lines: dict[str, list[str]] = {}
    for variant, trial_id in (("fresh", 900), ("preloaded", 901)):
        for what, argv in (
            ("probe", [sys.executable, str(probe)]),
            ("result", [sys.executable, str(SCRIPT), "--epochs=3"]),
        ):
            env = environment(trial_id, 2, url)
            log = logs / f"check-{variant}-{what}.log"
            if variant == "preloaded":
                parent.launch(trial_id, argv, env, log)
                parent.ended()
            else:
                with log.open("wb") as output:
                    subprocess.run(
                        argv,
                        env=env,
                        cwd=ROOT,
                        stdout=output,
                        stderr=subprocess.STDOUT,
                        timeout=TRIAL_TIMEOUT_S,
                        check=False,
                    )
            wanted = ("probe:", "final ", "gpumux: tensorflow")
            lines[f"{variant} {what}"] = [
                line for line in log.read_text().splitlines() if line.startswith(wanted)
            ]
    for name, found in lines.items():
        print(f"  {name}: {' | '.join(found)}")
    same = lines["fresh result"] == lines["preloaded result"]
    print(f"  the script's result and gpumux's cap lines are the same fresh and preloaded: {same}")


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--at-once", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--preloading-parent", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.preloading_parent:
        preloading_parent_main()
        return
    reports = Reports()
    httpd, url = serve_reports(reports)
    parent = PreloadingParent()
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} cores, load {os.getloadavg()}")
    print(
        f"preloading parent: preloaded {', '.join(PRELOAD)} in {parent.ready['preload_s']:.2f} s "
        f"(started in {parent.ready['start_s']:.2f} s); Python threads after the import: "
        f"{parent.ready['threads'] or 'none'}; tasks in /proc/self/task: {parent.ready['tasks']}"
    )
    results: dict[tuple[str, int], list[Trial]] = {}
    next_id = 1
    with tempfile.TemporaryDirectory(prefix="gpumux-preloaded-") as scratch:
        logs = Path(scratch)
        for repeat in range(args.repeats):
            for at_once in args.at_once:
                order = (
                    ("fresh", "preloaded")
                    if (repeat + at_once) % 2 == 0
                    else ("preloaded", "fresh")
                )
                for variant in order:
                    batch = run_batch(
                        variant, at_once, args.epochs, url, reports, parent, logs, next_id
                    )
                    next_id += at_once
                    results.setdefault((variant, at_once), []).extend(batch)
                    failed = [trial.status for trial in batch if trial.status != 0]
                    print(
                        f"repeat {repeat + 1} {variant} x{at_once}: ends "
                        + " ".join(f"{trial.end_s:.2f}" for trial in batch)
                        + (f" FAILED {failed}" if failed else ""),
                        flush=True,
                    )
        print(f"\nper trial, seconds from launch (medians over {args.repeats} repeats):")
        print(f"{'at once':>7} {'variant':>9} {'1st epoch':>10} {'end':>7} {'saved':>7}")
        for at_once in args.at_once:
            fresh_end = median([trial.end_s for trial in results[("fresh", at_once)]])
            for variant in ("fresh", "preloaded"):
                trials = results[(variant, at_once)]
                end = median([trial.end_s for trial in trials])
                first = median([trial.first_epoch_s for trial in trials])
                saved = f"{1 - end / fresh_end:6.0%}" if variant == "preloaded" else ""
                print(f"{at_once:>7} {variant:>9} {first:>10.2f} {end:>7.2f} {saved:>7}")
        print("\ncorrectness (split 2: 1 thread):")
        correctness(parent, url, reports, logs)
    parent.close()
    httpd.shutdown()


if __name__ == "__main__":
    main()
