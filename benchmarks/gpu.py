"""A GPU check anyone can run: gpumux on this host's first NVIDIA GPU, one table, under 8 minutes.

    python benchmarks/gpu.py [--out DIR] [--wheels DIR] [--dry-run]

Steps, each with its own time budget and all within 5.5 minutes: `gpumux devices`; the real-NVML
tests (tests/devices/test_probes.py, where pytest is installed); a first sweep at `--split auto` of
short trials of examples/torch_mlp.py, and the CUDA context the daemon measured of them (NVML's
figure less PyTorch's pool); the SHARCNET sequence (`gpumux tune --splits 1,3,5,8,13,21,34`) and the
same sweep at the best N tune found; a real out-of-memory sweep (each trial allocates 1/(cores - 2)
of the GPU with PyTorch, at `--split auto`); JAX under a slice where JAX is installed; and 34 bare
processes of the workload as the no-split baseline. It prints one table and writes it to
DIR/gpu-check.md (DIR/logs/ holds each step's output).

Without an NVIDIA GPU (or PyTorch), it says so on its first line ("no NVIDIA GPU: ...") and runs
the same steps on the simulated H200 with simulated trials (GPUMUX_SIMULATED_GPU), time x0.25:
the figures are then the simulator's; the real-NVML, out-of-memory, JAX and bare-process steps
are skipped.
`--dry-run` prints the commands and runs nothing. `--wheels DIR` first installs gpumux and its
dependencies from DIR with no index (docs/benchmarks.md says how to fill it).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SPLITS = [1, 3, 5, 8, 13, 21, 34]
BARE = 34
SIMULATED_SCALE = "0.25"
CONTEXT_STEP = "CUDA context (NVML less the pool)"
# The whole check's limit: each step gets its own budget, and no more than what is left of this;
# with the daemon's start and stop (and --wheels' install, about 2 minutes) within 8 minutes.
TOTAL_S = 330.0


@dataclass
class Row:
    step: str
    result: str
    seconds: float
    figure: str


@dataclass
class Check:
    home: Path
    logs: Path
    env: dict[str, str]
    workload: list[str]
    gpu: bool
    dry_run: bool
    rows: list[Row] = field(default_factory=list)
    deadline: float = field(default_factory=lambda: time.monotonic() + TOTAL_S)

    def run(self, name: str, argv: list[str], *, budget: float) -> tuple[int, str, float]:
        """Run one command within its budget; its output kept under logs/."""
        print(f"$ {' '.join(argv)}", flush=True)
        if self.dry_run:
            return 0, "", 0.0
        start = time.monotonic()
        budget = max(1.0, min(budget, self.deadline - start))
        try:
            done = subprocess.run(
                argv,
                env=self.env,
                cwd=REPO,
                capture_output=True,
                text=True,
                timeout=budget,
            )
            code, output = done.returncode, done.stdout + done.stderr
        except subprocess.TimeoutExpired as expired:
            code = 124
            output = _text(expired.stdout) + _text(expired.stderr) + f"\n(over {budget:.0f} s)"
            # What the killed command asked of the daemon must not run on into the next step.
            output += cancel_active(self.env)
        seconds = time.monotonic() - start
        (self.logs / f"{name}.log").write_text(output)
        return code, output, seconds

    def add(self, step: str, code: int, seconds: float, figure: str) -> None:
        result = "dry run" if self.dry_run else ("ok" if code == 0 else f"failed (rc {code})")
        self.rows.append(Row(step, result, seconds, figure))

    def skip(self, step: str, why: str) -> None:
        print(f"skipped {step}: {why}", flush=True)
        self.rows.append(Row(step, "skipped", 0.0, why))


def cancel_active(env: dict[str, str]) -> str:
    """Cancel every queued or running sweep of the check's daemon; what was cancelled."""
    from gpumux.client import Client
    from gpumux.home.layout import Layout
    from gpumux.status import SweepStatus

    cancelled = []
    with Client(f"unix:{Layout(Path(env['GPUMUX_HOME'])).socket}") as client:
        for status in (SweepStatus.queued, SweepStatus.running):
            for sweep in client.list_sweeps(status=status, limit=500).data:
                client.cancel_sweep(sweep.id)
                cancelled.append(sweep.id)
    return f"\n(cancelled sweeps {cancelled})" if cancelled else ""


def _text(data: bytes | str | None) -> str:
    if data is None:
        return ""
    return data.decode(errors="replace") if isinstance(data, bytes) else data


def nvidia_gpu() -> str | None:
    """Why there is no NVIDIA GPU to check here; None when there is one (and PyTorch)."""
    try:
        import pynvml

        pynvml.nvmlInit()
        count = pynvml.nvmlDeviceGetCount()
        pynvml.nvmlShutdown()
    except Exception as error:
        return f"NVML: {type(error).__name__}: {error}"
    if count == 0:
        return "NVML lists no GPU"
    if importlib.util.find_spec("torch") is None:
        return "PyTorch is not installed (the workload is examples/torch_mlp.py)"
    return None


def install_wheels(wheels: Path) -> None:
    """gpumux and its dependencies from a directory of wheels, with no index (no internet)."""
    ours = sorted(wheels.glob("gpumux-*.whl"))
    if not ours:
        sys.exit(f"--wheels {wheels}: no gpumux-*.whl there (docs/benchmarks.md says how)")
    # pytest too where its wheels were carried: the real-NVML tests need it, and pytest-timeout
    # for the timeout pyproject.toml sets (an unknown option is an error there).
    extra = [
        str(path)
        for pattern in ("pytest-[0-9]*.whl", "pytest_timeout-*.whl")
        for path in sorted(wheels.glob(pattern))[-1:]
    ]
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--find-links", str(wheels)]
        + [str(ours[-1]), *extra],
        check=True,
    )


def gpumux(*args: str) -> list[str]:
    return [sys.executable, "-m", "gpumux", *args]


def best_tune_split(output: str) -> int | None:
    """The N that gpumux tune marked best in its table."""
    for line in output.splitlines():
        if "best" in line and (found := re.match(r"\s*\W?\s*(\d+)\s", line)):
            return int(found.group(1))
    return None


def wait_for_daemon(check: Check, serve: subprocess.Popen[bytes]) -> bool:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and serve.poll() is None:
        done = subprocess.run(
            gpumux("ls"), env=check.env, cwd=REPO, capture_output=True, timeout=30
        )
        if done.returncode == 0:
            return True
        time.sleep(0.5)
    return False


def sweep_seconds(check: Check, name: str, split: str, trials: int) -> tuple[int, float, str]:
    """One sweep of `trials` trials of the workload at `split` on the running daemon."""
    argv = gpumux("sweep", f"lr=1e-4..1e-2:{trials}", "--split", split, "--", *check.workload)
    code, output, seconds = check.run(name, argv, budget=100)
    searched = re.findall(r"^split search on [^:]*: (.*)$", output, re.M)
    return code, seconds, searched[-1][:160] if searched else ""


def measured_context(check: Check) -> str | None:
    """The CUDA context the daemon measured of the trials so far, from its log: the largest,
    which it budgets beside each of the workload's slices; None where it measured none (a
    framework with no pool, a trial of several processes on the GPU, no figure held still)."""
    said = re.findall(r"its CUDA context is (\d+) MiB", (check.logs / "serve.log").read_text())
    return f"{max(int(mb) for mb in said):,} MiB, the largest a trial showed" if said else None


def bare_processes(check: Check) -> tuple[int, float]:
    """BARE copies of the workload at once with no gpumux: the no-split baseline."""
    print(f"$ {BARE} x {' '.join(check.workload)} (no gpumux)", flush=True)
    if check.dry_run:
        return 0, 0.0
    env = {k: v for k, v in check.env.items() if not k.startswith("GPUMUX_")}
    start = time.monotonic()
    with (check.logs / "bare.log").open("w") as log:
        procs = [
            subprocess.Popen(check.workload, env=env, cwd=REPO, stdout=log, stderr=log)
            for _ in range(BARE)
        ]
        try:
            codes = [
                proc.wait(timeout=max(1.0, check.deadline - time.monotonic())) for proc in procs
            ]
        except subprocess.TimeoutExpired:
            for proc in procs:
                proc.kill()
            codes = [124]
    return max(codes, key=abs), time.monotonic() - start


def run_checks(check: Check) -> None:
    serve = None
    if not check.dry_run:
        serve = subprocess.Popen(
            gpumux("serve"),
            env=check.env,
            cwd=REPO,
            stdout=(check.logs / "serve.log").open("w"),
            stderr=subprocess.STDOUT,
        )
        if not wait_for_daemon(check, serve):
            check.add("gpumux serve", 1, 0.0, "the daemon did not answer; see logs/serve.log")
            serve.kill()
            return
    try:
        code, output, seconds = check.run("devices", gpumux("devices"), budget=30)
        gpus = len(re.findall(r"GPU-[0-9a-f]", output))
        check.add("gpumux devices", code, seconds, f"{gpus} GPU line(s)")

        if not check.gpu:
            check.skip("real-NVML tests", "no NVIDIA GPU")
        elif importlib.util.find_spec("pytest") is None:
            check.skip("real-NVML tests", "pytest is not installed (add it to --wheels)")
        else:
            # pyproject's addopts name the suite's parallel workers, which this check carries not.
            argv = [
                sys.executable,
                "-m",
                "pytest",
                "-q",
                "-p",
                "no:cacheprovider",
                "-o",
                "addopts=",
            ]
            code, output, seconds = check.run(
                "nvml-tests", argv + ["tests/devices/test_probes.py"], budget=60
            )
            summary = re.findall(r"\d+ (?:passed|failed|skipped)[^\n]*", output)
            check.add("real-NVML tests", code, seconds, summary[-1] if summary else "")

        # A first sweep of the workload, before tune stores its curve as the workload's profile:
        # the split search measures on it (and the trials' CUDA context with it).
        code, auto_seconds, settled = sweep_seconds(check, "auto", "auto", 34)
        check.add("sweep 34 trials, --split auto (first)", code, auto_seconds, settled)
        if not check.dry_run:
            context = measured_context(check)
            if context is None:
                check.skip(
                    CONTEXT_STEP, "not measured: no trial told its pool beside a steady figure"
                )
            else:
                check.add(CONTEXT_STEP, 0, 0.0, context)

        splits = ",".join(str(n) for n in SPLITS)
        code, output, seconds = check.run(
            "tune", gpumux("tune", "--splits", splits, "--", *check.workload), budget=180
        )
        best = best_tune_split(output)
        check.add(f"gpumux tune {splits}", code, seconds, f"best N={best}")

        if best is not None or check.dry_run:
            fixed = str(best or 21)
            code, fixed_seconds, _ = sweep_seconds(check, "fixed", fixed, 34)
            ratio = auto_seconds / fixed_seconds if fixed_seconds else 0.0
            check.add(
                f"same sweep, --split {fixed}", code, fixed_seconds, f"auto/fixed {ratio:.2f}x"
            )

        if not check.gpu:
            check.skip("out-of-memory sweep", "needs a real GPU's PyTorch")
        else:
            # The split search starts at this host's cores (or fewer): a trial that needs a
            # slice of 1/(cores - 2) runs out of memory there, and fits two or three N below.
            cores = len(os.sched_getaffinity(0))
            oom = [sys.executable, str(REPO / "benchmarks" / "gpu_oom.py"), str(max(2, cores - 2))]
            argv = gpumux("sweep", "i=1..16:16", "--split", "auto", "--", *oom)
            code, output, seconds = check.run("oom", argv, budget=80)
            daemon_log = (check.logs / "serve.log").read_text(errors="replace")
            said = "out of memory" in daemon_log or "out of memory" in output
            # The step checks that an OOM is met and handled: none met proves nothing.
            check.add(
                "out-of-memory sweep (auto)", code or int(not said), seconds, f"OOM seen: {said}"
            )

        if not check.gpu:
            check.skip("JAX under a slice", "needs a real GPU")
        elif importlib.util.find_spec("jax") is None:
            check.skip("JAX under a slice", "JAX is not installed")
        else:
            jax = [sys.executable, str(REPO / "benchmarks" / "gpu_jax.py")]
            code, output, seconds = check.run(
                "jax", gpumux("sweep", "i=1,2,3,4", "--split", "4", "--", *jax), budget=60
            )
            check.add("JAX, 4 trials at --split 4", code, seconds, "see logs/jax.log")

        if not check.gpu:
            check.skip(f"{BARE} bare processes", "a simulated trial runs only under gpumux")
        else:
            code, seconds = bare_processes(check)
            check.add(f"{BARE} bare processes (no gpumux)", code, seconds, "the no-split baseline")
    finally:
        if serve is not None:
            serve.send_signal(signal.SIGTERM)
            try:
                serve.wait(timeout=60)
            except subprocess.TimeoutExpired:
                serve.kill()


def table(rows: list[Row]) -> str:
    lines = ["| step | result | seconds | figure |", "|---|---|---|---|"]
    lines += [f"| {r.step} | {r.result} | {r.seconds:.1f} | {r.figure} |" for r in rows]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="where gpu-check.md and logs/ go (a temp dir)")
    parser.add_argument("--wheels", type=Path, help="install gpumux from these wheels first")
    parser.add_argument("--dry-run", action="store_true", help="print the commands only")
    args = parser.parse_args()
    if args.wheels is not None and not args.dry_run:
        install_wheels(args.wheels)
    out = args.out or Path(tempfile.mkdtemp(prefix="gpumux-gpu-check-"))
    (out / "logs").mkdir(parents=True, exist_ok=True)
    home = Path(tempfile.mkdtemp(prefix="gpumux-gpu-home-"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUMUX_")}
    # Trials stop with the daemon: none outlives the check, whose directory then goes.
    env.update(GPUMUX_HOME=str(home), COLUMNS="200", GPUMUX_STOP_TRIALS="1")
    missing = nvidia_gpu()
    if missing is None:
        print("NVIDIA GPU found: the steps run on it", flush=True)
        workload = [sys.executable, "examples/torch_mlp.py", "--samples=50000"]
        workload += ["--width=1024", "--steps-per-epoch=200", "--epochs=3"]
    else:
        print(
            f"no NVIDIA GPU: {missing}; running on the simulated H200 with simulated trials "
            f"(time x{SIMULATED_SCALE}): the figures are the simulator's",
            flush=True,
        )
        # The measured host's 16 cores, not this one's, as benchmarks/split_search.py does.
        env.update(
            GPUMUX_SIMULATED_GPU="h200-torch-mlp",
            GPUMUX_SIMULATED_TIME_SCALE=SIMULATED_SCALE,
            GPUMUX_HOST_CORES="16",
        )
        workload = [sys.executable, "-m", "gpumux.devices.simulated.trial", "--seconds=20"]
    check = Check(
        home=home,
        logs=out / "logs",
        env=env,
        workload=workload,
        gpu=missing is None,
        dry_run=args.dry_run,
    )
    started = time.monotonic()
    try:
        run_checks(check)
    finally:
        shutil.rmtree(home, ignore_errors=True)
    report = table(check.rows) + f"\n\ntotal {time.monotonic() - started:.0f} s\n"
    print(report)
    (out / "gpu-check.md").write_text(report)
    print(f"written: {out / 'gpu-check.md'}")


if __name__ == "__main__":
    main()
