"""The bootstrap sitecustomize: gpumux importable in any trial interpreter, chaining, JAX's env."""

from __future__ import annotations

import importlib.util
import os
import sys
import venv
from pathlib import Path

import pytest

from .support import BOOTSTRAP_DIR, RUNTIME_DIR, run_python, trial_env

SHOW_GPUMUX = "import gpumux.runtime; print('runtime from', gpumux.runtime.__file__)"


@pytest.fixture
def bare_python(tmp_path: Path) -> str:
    """The interpreter of a fresh virtualenv, in which gpumux is not installed."""
    venv.create(tmp_path / "venv", with_pip=False, symlinks=True)
    return str(tmp_path / "venv" / "bin" / "python")


@pytest.fixture
def other_gpumux(tmp_path: Path) -> Path:
    """A sys.path entry that holds another package named gpumux."""
    package = tmp_path / "other" / "gpumux" / "runtime"
    package.mkdir(parents=True)
    (package.parent / "__init__.py").write_text("")
    (package / "__init__.py").write_text("")
    return package.parent.parent


def test_trial_imports_this_gpumux_where_it_is_not_installed(
    bare_python: str, other_gpumux: Path, tmp_path: Path
) -> None:
    env = trial_env(None, PYTHONPATH=os.pathsep.join([str(BOOTSTRAP_DIR), str(other_gpumux)]))

    result = run_python(["-c", SHOW_GPUMUX], env, tmp_path, python=bare_python)

    assert result.returncode == 0, result.stdout
    assert result.stdout.splitlines() == [f"runtime from {RUNTIME_DIR / '__init__.py'}"]


def test_outside_a_trial_the_bootstrap_claims_nothing(
    bare_python: str, other_gpumux: Path, tmp_path: Path
) -> None:
    env = trial_env(None, GPUMUX_TRIAL_ID=None)
    env["PYTHONPATH"] = os.pathsep.join([str(BOOTSTRAP_DIR), str(other_gpumux)])

    result = run_python(["-c", SHOW_GPUMUX], env, tmp_path, python=bare_python)

    assert result.returncode == 0, result.stdout
    assert result.stdout.splitlines() == [
        f"runtime from {other_gpumux / 'gpumux' / 'runtime' / '__init__.py'}"
    ]


@pytest.mark.parametrize("trial_id", ["7", None])
def test_the_hidden_sitecustomize_still_runs(trial_id: str | None, tmp_path: Path) -> None:
    chained = tmp_path / "site"
    chained.mkdir()
    (chained / "sitecustomize.py").write_text("print('chained sitecustomize ran')\n")
    env = trial_env(None, GPUMUX_TRIAL_ID=trial_id)
    env["PYTHONPATH"] = os.pathsep.join([str(BOOTSTRAP_DIR), str(chained)])
    script = "import sitecustomize; print('sitecustomize is', sitecustomize.__file__)"

    result = run_python(["-c", script], env, tmp_path)

    assert result.returncode == 0, result.stdout
    assert result.stdout.splitlines() == [
        "chained sitecustomize ran",
        f"sitecustomize is {chained / 'sitecustomize.py'}",
    ]


def test_a_failing_hidden_sitecustomize_is_printed_not_fatal(tmp_path: Path) -> None:
    chained = tmp_path / "site"
    chained.mkdir()
    (chained / "sitecustomize.py").write_text("raise RuntimeError('broken site set-up')\n")
    env = trial_env(None)
    env["PYTHONPATH"] = os.pathsep.join([str(BOOTSTRAP_DIR), str(chained)])

    result = run_python(["-c", "print('script ran')"], env, tmp_path)

    assert result.returncode == 0, result.stdout
    assert f"gpumux: error in the chained sitecustomize {chained / 'sitecustomize.py'}:" in (
        result.stdout
    )
    assert "RuntimeError: broken site set-up" in result.stdout
    assert result.stdout.splitlines()[-1] == "script ran"


def test_gpu_trial_gets_jax_memory_settings_before_the_script(tmp_path: Path) -> None:
    env = trial_env(
        None,
        GPUMUX_DEVICE_KIND="gpu",
        GPUMUX_FRAMEWORK_DEVICE="cuda",
        GPUMUX_CPU_THREADS=None,
        GPUMUX_MEMORY_LIMIT_MB="4096",
        GPUMUX_DEVICE_MEMORY_MB="143771",
    )
    script = (
        "import os; print(os.environ['XLA_PYTHON_CLIENT_PREALLOCATE'], "
        "os.environ['XLA_PYTHON_CLIENT_MEM_FRACTION'])"
    )

    result = run_python(["-c", script], env, tmp_path)

    assert result.returncode == 0, result.stdout
    assert result.stdout.splitlines() == ["false 0.0284"]


@pytest.mark.slow
def test_tensorflow_imported_by_a_pth_file_is_capped_at_once(
    bare_python: str, tmp_path: Path
) -> None:
    tf_spec = importlib.util.find_spec("tensorflow")
    assert tf_spec is not None and tf_spec.origin is not None
    tf_site = Path(tf_spec.origin).parent.parent
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    site_packages = Path(bare_python).parent.parent / "lib" / version / "site-packages"
    # A .pth line that starts with `import` runs before any sitecustomize.
    (site_packages / "early_tf.pth").write_text(
        f"import sys; sys.path.append({str(tf_site)!r}); import tensorflow\n"
    )
    script = (
        "import tensorflow as tf; "
        "print('script: intra-op threads', tf.config.threading.get_intra_op_parallelism_threads())"
    )

    result = run_python(["-c", script], trial_env(None), tmp_path, python=bare_python)

    assert result.returncode == 0, result.stdout
    lines = [line for line in result.stdout.splitlines() if line.startswith(("gpumux", "script"))]
    assert lines == [
        "gpumux: tensorflow: CPU device, 1 intra-op and 1 inter-op thread(s) (split 2), "
        "applied before TensorFlow initialised",
        "script: intra-op threads 1",
    ]
