"""This trial's slice of its device, applied to TensorFlow, PyTorch and JAX.

On a GPU the slice is a memory limit and a share of the host's cores as threads; on the CPU device
it is a thread count. Each function here runs right after its framework is imported (see
importhook), and says on stderr what it applied. A framework that sees no GPU where gpumux placed
the trial on one (a CPU-only build) trains on the host's CPU: once it trains (not when it is only
imported: a JAX script may use tensorflow-cpu for its data), that is said loudly and reported to
the daemon, which leaves the trial's throughput out of the GPU's split search.
"""

from __future__ import annotations

import math

from gpumux.runtime import context
from gpumux.runtime.context import TrialContext, say

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import MutableMapping
    from types import ModuleType

# What to install where a framework sees no GPU, by the name the daemon stores (the CLI and the
# dashboard show it too).
NO_GPU_FIX = {
    "tensorflow": "pip install 'tensorflow[and-cuda]' (tensorflow-cpu never sees a GPU)",
    "torch": "a CUDA build of PyTorch: pip install torch from PyPI on Linux, or see "
    "https://pytorch.org/get-started/locally/",
}

# The frameworks imported in this process that see no GPU on its trial's GPU, each with the name
# it is shown by: said and reported when one trains (`training_with`).
_SEES_NO_GPU: dict[str, str] = {}

TOO_LATE_FIX = (
    "make sure nothing runs a TensorFlow operation before `import tensorflow` returns "
    "(a .pth file, another sitecustomize, a plugin) and that the script does not configure "
    "TensorFlow's devices itself"
)


def memory_fraction(trial: TrialContext) -> float | None:
    """The slice as a fraction of the whole GPU, rounded down; None when either size is unknown."""
    if not trial.memory_limit_mb or not trial.device_memory_mb:
        return None
    # Rounded down so that the framework's own rounding cannot grant more than the slice.
    return min(1.0, math.floor(trial.memory_limit_mb / trial.device_memory_mb * 1e4) / 1e4)


def cap_tensorflow(tf: ModuleType, trial: TrialContext) -> None:
    """Give TensorFlow this trial's slice: a logical GPU with a memory limit, and CPU threads."""
    if trial.on_gpu:
        if trial.cpu_threads is not None:
            _set_tensorflow_threads(tf, trial, where="the host's cores")
        gpus = tf.config.list_physical_devices("GPU")
        if gpus:
            _cap_tensorflow_gpu(tf, gpus[0], trial)
        else:
            _SEES_NO_GPU["tensorflow"] = "TensorFlow"
    else:
        _cap_tensorflow_cpu(tf, trial)


def training_with(framework: str) -> None:
    """`framework` ("tensorflow", "torch") trains in this process: if it sees no GPU on the
    trial's GPU, say so and tell the daemon (once)."""
    shown = _SEES_NO_GPU.pop(framework, None)
    trial = context.current()
    if shown is not None and trial is not None:
        report_no_gpu(framework, shown, trial)


def report_no_gpu(framework: str, shown: str, trial: TrialContext) -> None:
    """Say that `framework` sees no GPU on the GPU gpumux placed this trial on, and tell the
    daemon (once per process; the daemon keeps the first)."""
    limit = trial.memory_limit_mb
    slice_note = f", its {limit} MB slice is not applied" if limit else ""
    say(
        f"WARNING: {shown} sees no GPU, though gpumux placed this trial on one: it trains on "
        f"the CPU{slice_note}, and its throughput is left out of the GPU's split search. "
        f"To use the GPU, install {NO_GPU_FIX[framework]}"
    )
    # Imported here: the reporter's modules cost every trial's start, and most never get here.
    from gpumux.runtime import reporter

    reporter.submit(
        kind="device", step=None, samples=None, seconds=None, metrics={}, no_gpu=framework
    )


def check_torch_sees_gpu(torch: ModuleType, trial: TrialContext) -> None:
    """Note a PyTorch built without CUDA (or ROCm) on a GPU: it can never see the GPU (said
    at its first optimizer step).

    Only the build is looked at: asking CUDA for its devices here would initialise it in every
    trial, breaking CUDA in children forked before their first use.
    """
    if not trial.on_gpu:
        return
    version = getattr(torch, "version", None)
    if getattr(version, "cuda", None) is None and getattr(version, "hip", None) is None:
        _SEES_NO_GPU["torch"] = f"PyTorch {getattr(torch, '__version__', '')}".strip()


def _cap_tensorflow_gpu(tf: ModuleType, gpu: object, trial: TrialContext) -> None:
    limit = trial.memory_limit_mb
    if limit is None:
        say("tensorflow: no GPUMUX_MEMORY_LIMIT_MB; TensorFlow's GPU memory is left as it is")
        return
    config = tf.config.LogicalDeviceConfiguration(memory_limit=limit)
    try:
        tf.config.set_logical_device_configuration(gpu, [config])
    except RuntimeError as err:
        _warn_too_late(f"its {limit} MB memory limit", err)
        return
    say(
        f"tensorflow: GPU:0 capped at {limit} MB{trial.split_note}, "
        "applied before TensorFlow initialised"
    )
    _ignore_memory_growth(tf, limit)


def _ignore_memory_growth(tf: ModuleType, limit: int) -> None:
    # Scripts often turn memory growth on; TensorFlow refuses it on a GPU split into logical
    # devices (ValueError), which would end an unmodified script. The slice already bounds memory.
    experimental = tf.config.experimental
    original = experimental.set_memory_growth

    def set_memory_growth(device: object, enable: bool) -> None:
        if getattr(device, "device_type", None) != "GPU":
            original(device, enable)
            return
        say(
            f"tensorflow: ignored set_memory_growth(..., {enable}): gpumux caps this trial's "
            f"GPU memory at {limit} MB instead"
        )

    experimental.set_memory_growth = set_memory_growth


def _cap_tensorflow_cpu(tf: ModuleType, trial: TrialContext) -> None:
    if trial.cpu_threads is None:
        say("tensorflow: CPU device without GPUMUX_CPU_THREADS; thread counts left as they are")
        return
    _set_tensorflow_threads(tf, trial, where="CPU device")


def _set_tensorflow_threads(tf: ModuleType, trial: TrialContext, *, where: str) -> None:
    threads = trial.cpu_threads
    try:
        tf.config.threading.set_intra_op_parallelism_threads(threads)
        tf.config.threading.set_inter_op_parallelism_threads(threads)
    except RuntimeError as err:
        _warn_too_late(f"its limit of {threads} thread(s)", err)
        return
    say(
        f"tensorflow: {where}, {threads} intra-op and {threads} inter-op thread(s)"
        f"{trial.split_note}, applied before TensorFlow initialised"
    )


def _warn_too_late(what: str, err: RuntimeError) -> None:
    if "cannot be modified" not in str(err):
        raise err
    say(
        f"WARNING: TensorFlow was initialised before gpumux could apply the slice ({err}); "
        f"this trial runs WITHOUT {what}. To fix it, {TOO_LATE_FIX}."
    )


def cap_torch(torch: ModuleType, trial: TrialContext) -> None:
    """Give PyTorch this trial's slice: a CUDA memory fraction, and CPU threads."""
    if trial.on_gpu and trial.cpu_threads is not None:
        torch.set_num_threads(trial.cpu_threads)
        say(f"torch: the host's cores, {trial.cpu_threads} thread(s){trial.split_note}")
    if not trial.on_gpu:
        threads = trial.cpu_threads
        if threads is None:
            say("torch: CPU device without GPUMUX_CPU_THREADS; thread count left as it is")
            return
        torch.set_num_threads(threads)
        say(f"torch: CPU device, {threads} thread(s){trial.split_note}")
        return
    fraction = memory_fraction(trial)
    if fraction is None:
        say(
            "torch: no GPUMUX_MEMORY_LIMIT_MB or GPUMUX_DEVICE_MEMORY_MB; CUDA memory left as it is"
        )
        return
    message = (
        f"torch: cuda:0 capped at {trial.memory_limit_mb} MB{trial.split_note}, memory fraction "
        f"{fraction} of {trial.device_memory_mb} MB, applied as CUDA initialised"
    )

    def apply() -> None:
        # Runs inside torch's CUDA initialisation: raising would fail the script's first CUDA call.
        try:
            torch.cuda.set_per_process_memory_fraction(fraction, 0)
        except Exception as err:
            say(f"WARNING: torch: could not cap CUDA memory ({err}); this trial runs WITHOUT it")
            return
        say(message)
        # What the cap bounds: the daemon tells the CUDA context from NVML's figure by it.
        from gpumux.runtime import reporter

        reporter.pool_from(lambda: torch.cuda.memory_reserved(0))

    # Queued until the script first uses CUDA: initialising it here would cost a context in
    # scripts that never use the GPU and break CUDA in children forked before their first use.
    torch.cuda._lazy_call(apply)


def set_jax_environment(trial: TrialContext, environ: MutableMapping[str, str]) -> None:
    """Turn JAX's preallocation off and cap its memory; JAX reads these only when it starts."""
    fraction = memory_fraction(trial)
    if not trial.on_gpu or fraction is None:
        return
    environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    # JAX accepts the old and the new name; setting both can fail its CUDA plugin, so only one.
    if "XLA_PYTHON_CLIENT_MEM_FRACTION" not in environ and "XLA_CLIENT_MEM_FRACTION" not in environ:
        environ["XLA_PYTHON_CLIENT_MEM_FRACTION"] = str(fraction)
