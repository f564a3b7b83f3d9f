"""The slice applied to TensorFlow, PyTorch and JAX; the plain warning when it comes too late."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from gpumux.runtime import frameworks, reporter
from gpumux.runtime.context import TrialContext

from .support import FIXTURES, ReportServer, gpumux_lines, run_python, trial_env

HAS_TORCH = importlib.util.find_spec("torch") is not None
NO_TORCH = "PyTorch is not installed here (pip install torch) so its hook cannot be exercised"
# What a script says, and reports, once its framework is imported: before it, the import's.
MARKER = (
    "print('script: imported', flush=True)\n"
    "from gpumux.runtime import reporter\n"
    "reporter.submit(kind='marker', step=None, samples=None, seconds=None, metrics={})\n"
)


def gpu_trial(**changes: Any) -> TrialContext:
    """A trial on a 143,771 MB GPU with a 4096 MB slice, split 4."""
    fields: dict[str, Any] = {
        "trial_id": 1,
        "attempt": 1,
        "url": None,
        "token": None,
        "framework_device": "cuda",
        "memory_limit_mb": 4096,
        "device_memory_mb": 143771,
        "split": 4,
        "cpu_threads": None,
    }
    fields.update(changes)
    return TrialContext(**fields)


GPU = SimpleNamespace(name="/physical_device:GPU:0", device_type="GPU")
CPU = SimpleNamespace(name="/physical_device:CPU:0", device_type="CPU")


class RecordingTfConfig:
    """Stand-in for tf.config on a machine with one GPU; the real one needs a GPU build and GPU."""

    def __init__(self, error: Exception | None = None) -> None:
        self.error = error
        self.calls: list[tuple[str, Any, Any]] = []
        self.experimental = SimpleNamespace(set_memory_growth=self.set_memory_growth)
        self.threading = SimpleNamespace(
            set_intra_op_parallelism_threads=lambda n: self.calls.append(("intra", n, None)),
            set_inter_op_parallelism_threads=lambda n: self.calls.append(("inter", n, None)),
        )

    def list_physical_devices(self, device_type: str) -> list[Any]:
        return [GPU] if device_type == "GPU" else []

    def set_memory_growth(self, device: Any, enable: bool) -> None:
        self.calls.append(("set_memory_growth", device, enable))

    def LogicalDeviceConfiguration(self, memory_limit: int) -> tuple[str, int]:  # noqa: N802
        return ("LogicalDeviceConfiguration", memory_limit)

    def set_logical_device_configuration(self, device: str, logical_devices: list[Any]) -> None:
        self.calls.append(("set_logical_device_configuration", device, logical_devices))
        if self.error is not None:
            raise self.error


def stand_in_tensorflow(config: RecordingTfConfig) -> Any:
    """A `tensorflow` whose only part is the recording tf.config."""
    return SimpleNamespace(config=config)


def test_tensorflow_gpu_gets_one_logical_device_with_the_memory_limit(
    capsys: pytest.CaptureFixture[str],
) -> None:
    config = RecordingTfConfig()

    frameworks.cap_tensorflow(stand_in_tensorflow(config), gpu_trial())

    assert config.calls == [
        (
            "set_logical_device_configuration",
            GPU,
            [("LogicalDeviceConfiguration", 4096)],
        )
    ]
    assert capsys.readouterr().err == (
        "gpumux: tensorflow: GPU:0 capped at 4096 MB (split 4), "
        "applied before TensorFlow initialised\n"
    )


def test_tensorflow_on_a_gpu_gets_threads_for_its_share_of_the_hosts_cores(
    capsys: pytest.CaptureFixture[str],
) -> None:
    config = RecordingTfConfig()

    frameworks.cap_tensorflow(stand_in_tensorflow(config), gpu_trial(cpu_threads=3))

    assert config.calls == [
        ("intra", 3, None),
        ("inter", 3, None),
        ("set_logical_device_configuration", GPU, [("LogicalDeviceConfiguration", 4096)]),
    ]
    assert capsys.readouterr().err.splitlines()[0] == (
        "gpumux: tensorflow: the host's cores, 3 intra-op and 3 inter-op thread(s) (split 4), "
        "applied before TensorFlow initialised"
    )


def test_tensorflow_memory_growth_on_the_capped_gpu_is_ignored(
    capsys: pytest.CaptureFixture[str],
) -> None:
    config = RecordingTfConfig()
    tf = stand_in_tensorflow(config)
    frameworks.cap_tensorflow(tf, gpu_trial())
    capsys.readouterr()

    tf.config.experimental.set_memory_growth(GPU, True)
    tf.config.experimental.set_memory_growth(CPU, True)

    assert config.calls[1:] == [("set_memory_growth", CPU, True)]
    assert capsys.readouterr().err == (
        "gpumux: tensorflow: ignored set_memory_growth(..., True): gpumux caps this trial's "
        "GPU memory at 4096 MB instead\n"
    )


def test_tensorflow_gpu_initialised_too_early_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    config = RecordingTfConfig(
        RuntimeError("Virtual devices cannot be modified after being initialized")
    )

    frameworks.cap_tensorflow(stand_in_tensorflow(config), gpu_trial())

    err = capsys.readouterr().err
    assert err.startswith(
        "gpumux: WARNING: TensorFlow was initialised before gpumux could apply the slice "
        "(Virtual devices cannot be modified after being initialized); "
        "this trial runs WITHOUT its 4096 MB memory limit. To fix it, make sure nothing runs"
    )
    assert err.count("\n") == 1


def test_tensorflow_without_a_visible_gpu_warns_once_it_trains(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(frameworks, "_SEES_NO_GPU", {})
    monkeypatch.setattr(frameworks.context, "current", gpu_trial)
    config = RecordingTfConfig()
    config.list_physical_devices = lambda device_type: []  # type: ignore[method-assign]

    frameworks.cap_tensorflow(stand_in_tensorflow(config), gpu_trial())
    # Imported only (tf.data beside JAX, say): nothing to say yet; another framework training
    # says nothing of TensorFlow.
    frameworks.training_with("torch")
    assert (config.calls, capsys.readouterr().err) == ([], "")

    frameworks.training_with("tensorflow")
    frameworks.training_with("tensorflow")
    assert capsys.readouterr().err == (
        "gpumux: WARNING: TensorFlow sees no GPU, though gpumux placed this trial on one: it "
        "trains on the CPU, its 4096 MB slice is not applied, and its throughput is left out of "
        f"the GPU's split search. To use the GPU, install {frameworks.NO_GPU_FIX['tensorflow']}\n"
    )


@pytest.mark.slow
@pytest.mark.skipif(
    importlib.util.find_spec("tensorflow") is None, reason="TensorFlow is not installed here"
)
def test_a_real_tensorflow_that_sees_no_gpu_on_a_gpu_says_so_and_tells_the_daemon(
    report_server: ReportServer, tmp_path: Path
) -> None:
    # CUDA_VISIBLE_DEVICES names no GPU this process may see: a CUDA build of TensorFlow
    # sees none either, as its CPU build never does.
    env = trial_env(
        report_server.url,
        GPUMUX_DEVICE_KIND="gpu",
        GPUMUX_FRAMEWORK_DEVICE="cuda",
        GPUMUX_MEMORY_LIMIT_MB="4096",
        GPUMUX_DEVICE_MEMORY_MB="143771",
        CUDA_VISIBLE_DEVICES="GPU-00000000-0000-0000-0000-000000000000",
    )
    # One process, one import of TensorFlow: what it says before the marker is the import's,
    # after it the training's; the marker is also a report, queued behind any the import sent
    # (one thread sends them in order), so a device report before it is the import's.
    script = (
        "import tensorflow as tf\n"
        f"{MARKER}"
        "import keras, numpy as np\n"
        "model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])\n"
        "model.compile(optimizer='sgd', loss='mse')\n"
        "model.fit(np.zeros((4, 2)), np.zeros((4, 1)), epochs=1, verbose=0)\n"
    )

    result = run_python(["-c", script], env, tmp_path)

    assert result.returncode == 0, result.stdout
    imported, marker, trained = result.stdout.partition("script: imported\n")
    assert marker, result.stdout
    assert "sees no GPU" not in imported, result.stdout
    assert (
        "gpumux: WARNING: TensorFlow sees no GPU, though gpumux placed this trial on one: it "
        "trains on the CPU, its 4096 MB slice is not applied, and its throughput is left out of "
        f"the GPU's split search. To use the GPU, install {frameworks.NO_GPU_FIX['tensorflow']}"
    ) in gpumux_lines(trained)
    kinds = [r["kind"] for r in report_server.reports]
    assert "device" not in kinds[: kinds.index("marker")], kinds
    device_reports = [r for r in report_server.reports if r["kind"] == "device"]
    assert [r["no_gpu"] for r in device_reports] == ["tensorflow"]


@pytest.mark.skipif(not HAS_TORCH, reason=NO_TORCH)
def test_a_torch_without_cuda_on_a_gpu_says_so_and_tells_the_daemon(
    report_server: ReportServer, tmp_path: Path
) -> None:
    import torch

    env = trial_env(report_server.url, GPUMUX_DEVICE_KIND="gpu", GPUMUX_FRAMEWORK_DEVICE="cuda")
    # One process: the import's output and reports come before the marker, the first step's
    # after it (as for TensorFlow above).
    script = (
        "import torch\n"
        f"{MARKER}"
        "weight = torch.nn.Parameter(torch.zeros(1))\n"
        "optimizer = torch.optim.SGD([weight], lr=0.1)\n"
        "for _ in range(3):\n"
        "    optimizer.zero_grad(); (weight - 1).pow(2).sum().backward(); optimizer.step()\n"
    )

    result = run_python(["-c", script], env, tmp_path)

    assert result.returncode == 0, result.stdout
    imported, marker, trained = result.stdout.partition("script: imported\n")
    assert marker, result.stdout
    assert "sees no GPU" not in imported, result.stdout
    warnings = [line for line in gpumux_lines(trained) if "sees no GPU" in line]
    kinds = [r["kind"] for r in report_server.reports]
    assert "device" not in kinds[: kinds.index("marker")], kinds
    device_reports = [r for r in report_server.reports if r["kind"] == "device"]
    if torch.version.cuda is not None or torch.version.hip is not None:
        # A GPU build: whether it sees the GPU is CUDA's to say when the script asks.
        assert (warnings, device_reports) == ([], [])
        return
    assert warnings == [
        f"gpumux: WARNING: PyTorch {torch.__version__} sees no GPU, though gpumux placed this "
        "trial on one: it trains on the CPU, and its throughput is left out of the GPU's split "
        f"search. To use the GPU, install {frameworks.NO_GPU_FIX['torch']}"
    ]
    assert [(r["no_gpu"], r["trial_id"], r["attempt"]) for r in device_reports] == [("torch", 7, 2)]


@pytest.mark.skipif(not HAS_TORCH, reason=NO_TORCH)
def test_torch_on_the_cpu_device_reports_nothing_of_gpus(
    report_server: ReportServer, tmp_path: Path
) -> None:
    result = run_python(["-c", "import torch"], trial_env(report_server.url), tmp_path)

    assert result.returncode == 0, result.stdout
    assert [r for r in report_server.reports if r["kind"] == "device"] == []


@pytest.mark.slow
def test_real_tensorflow_initialised_first_gets_the_plain_warning(tmp_path: Path) -> None:
    env = trial_env(None, PYTHONPATH=None)  # no bootstrap: the script applies the slice itself

    result = run_python([str(FIXTURES / "tf_too_late.py")], env, tmp_path)

    assert result.returncode == 0, result.stdout
    assert gpumux_lines(result.stdout) == [
        "gpumux: WARNING: TensorFlow was initialised before gpumux could apply the slice "
        "(Intra op parallelism cannot be modified after initialization.); this trial runs "
        f"WITHOUT its limit of 1 thread(s). To fix it, {frameworks.TOO_LATE_FIX}."
    ]
    assert "script: done" in result.stdout


def test_memory_fraction_rounds_down() -> None:
    assert frameworks.memory_fraction(gpu_trial()) == 0.0284
    assert frameworks.memory_fraction(gpu_trial(memory_limit_mb=200_000)) == 1.0
    assert frameworks.memory_fraction(gpu_trial(device_memory_mb=None)) is None


def test_jax_environment_on_a_gpu() -> None:
    environ: dict[str, str] = {}

    frameworks.set_jax_environment(gpu_trial(), environ)

    assert environ == {
        "XLA_PYTHON_CLIENT_PREALLOCATE": "false",
        "XLA_PYTHON_CLIENT_MEM_FRACTION": "0.0284",
    }


def test_jax_environment_keeps_the_users_settings() -> None:
    environ = {"XLA_PYTHON_CLIENT_PREALLOCATE": "true", "XLA_CLIENT_MEM_FRACTION": ".5"}

    frameworks.set_jax_environment(gpu_trial(), environ)

    assert environ == {"XLA_PYTHON_CLIENT_PREALLOCATE": "true", "XLA_CLIENT_MEM_FRACTION": ".5"}


def test_jax_environment_untouched_on_the_cpu_device() -> None:
    environ: dict[str, str] = {}

    frameworks.set_jax_environment(gpu_trial(framework_device="cpu", cpu_threads=1), environ)

    assert environ == {}


@pytest.mark.skipif(not HAS_TORCH, reason=NO_TORCH)
def test_torch_on_the_cpu_device_gets_its_threads(tmp_path: Path) -> None:
    script = "import torch; print(f'script: torch threads {torch.get_num_threads()}')"

    result = run_python(["-c", script], trial_env(None, GPUMUX_CPU_THREADS="1"), tmp_path)

    assert result.returncode == 0, result.stdout
    assert result.stdout.splitlines() == [
        "gpumux: torch: CPU device, 1 thread(s) (split 2)",
        "script: torch threads 1",
    ]


@pytest.mark.skipif(not HAS_TORCH, reason=NO_TORCH)
def test_torch_on_a_gpu_gets_threads_for_its_share_of_the_hosts_cores(
    report_server: ReportServer, tmp_path: Path
) -> None:
    # More than torch would take by itself: the count seen must be gpumux's.
    threads = (os.cpu_count() or 1) + 1
    script = "import torch; print(f'script: torch threads {torch.get_num_threads()}')"
    # A daemon to answer: a CPU-only torch on a GPU tells it so.
    env = trial_env(
        report_server.url,
        GPUMUX_DEVICE_KIND="gpu",
        GPUMUX_FRAMEWORK_DEVICE="cuda",
        GPUMUX_CPU_THREADS=str(threads),
    )

    result = run_python(["-c", script], env, tmp_path)

    assert result.returncode == 0, result.stdout
    lines = result.stdout.splitlines()
    assert f"gpumux: torch: the host's cores, {threads} thread(s) (split 2)" in lines
    assert f"script: torch threads {threads}" in lines


@pytest.mark.skipif(not HAS_TORCH, reason=NO_TORCH)
def test_torch_gpu_cap_waits_for_cuda_initialisation(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import torch

    queued: list[Any] = []
    applied: list[tuple[float, int]] = []
    monkeypatch.setattr(torch.cuda, "_lazy_call", queued.append)
    monkeypatch.setattr(
        torch.cuda, "set_per_process_memory_fraction", lambda f, d: applied.append((f, d))
    )

    frameworks.cap_torch(torch, gpu_trial())

    assert applied == []  # CUDA is not initialised by the import
    assert capsys.readouterr().err == ""
    queued[0]()  # what torch does when the script first uses CUDA
    assert applied == [(0.0284, 0)]
    assert capsys.readouterr().err == (
        "gpumux: torch: cuda:0 capped at 4096 MB (split 4), memory fraction 0.0284 of 143771 MB, "
        "applied as CUDA initialised\n"
    )


@pytest.mark.skipif(not HAS_TORCH, reason=NO_TORCH)
def test_torch_on_a_gpu_reports_its_pool_once_cuda_initialised(
    report_server: ReportServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch

    queued: list[Any] = []
    monkeypatch.setattr(torch.cuda, "_lazy_call", queued.append)
    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction", lambda f, d: None)
    # No CUDA here: what the caching allocator of device 0 would say it reserved.
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device: 2 * 2**30 * (device + 1))
    for name, value in trial_env(report_server.url, GPUMUX_DEVICE_KIND="gpu").items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(reporter, "_reporter", None)
    frameworks.cap_torch(torch, gpu_trial())

    reporter.submit(kind="manual", step=None, samples=1, seconds=1.0, metrics={})
    queued[0]()
    reporter.submit(kind="manual", step=None, samples=1, seconds=1.0, metrics={})

    current = reporter.current()
    assert current is not None and current.flush(timeout=30)
    # Not before CUDA initialised (it would initialise it), and device 0's from then on.
    assert [r["body"].get("pool_mb") for r in report_server.requests] == [None, 2048]
