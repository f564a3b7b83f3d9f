"""Post-import hooks run once, after the module's body and before the importer gets it."""

from __future__ import annotations

import importlib
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from gpumux.runtime import importhook


@pytest.fixture
def module_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A sys.path entry for throw-away modules; hooks and modules are removed afterwards."""
    monkeypatch.syspath_prepend(str(tmp_path))
    meta_path = list(sys.meta_path)
    yield tmp_path
    sys.meta_path[:] = meta_path
    for name in [name for name in sys.modules if name.startswith("hooktest_")]:
        del sys.modules[name]


def write_module(directory: Path, name: str, body: str) -> None:
    (directory / f"{name}.py").write_text(body)
    importlib.invalidate_caches()


def test_hook_runs_after_the_body_before_import_returns(module_dir: Path) -> None:
    write_module(module_dir, "hooktest_a", "value = 41\n")
    seen: list[int] = []

    def hook(module: Any) -> None:
        seen.append(module.value)
        module.value += 1

    importhook.install({"hooktest_a": hook})
    import hooktest_a

    assert seen == [41]
    assert hooktest_a.value == 42
    importlib.reload(hooktest_a)
    assert seen == [41], "a reload runs the module alone"
    assert hooktest_a.value == 41


def test_module_imported_before_install_is_hooked_at_once(module_dir: Path) -> None:
    write_module(module_dir, "hooktest_b", "value = 1\n")
    import hooktest_b

    seen: list[ModuleType] = []
    importhook.install({"hooktest_b": seen.append})

    assert seen == [hooktest_b]


def test_failing_hook_warns_and_the_import_succeeds(
    module_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_module(module_dir, "hooktest_c", "value = 3\n")

    def hook(module: ModuleType) -> None:
        raise ValueError("no such device")

    importhook.install({"hooktest_c": hook})
    import hooktest_c

    assert hooktest_c.value == 3
    assert capsys.readouterr().err == (
        "gpumux: WARNING: could not set up hooktest_c (ValueError: no such device); "
        "this trial runs without gpumux's hooktest_c settings\n"
    )


def test_other_modules_and_submodules_are_left_alone(module_dir: Path) -> None:
    package = module_dir / "hooktest_pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "sub.py").write_text("value = 5\n")
    importlib.invalidate_caches()
    seen: list[str] = []

    importhook.install({"hooktest_pkg": lambda module: seen.append(module.__name__)})
    import hooktest_pkg.sub

    assert seen == ["hooktest_pkg"]
    assert hooktest_pkg.sub.value == 5


def test_loader_shared_by_modules_in_a_zip(module_dir: Path) -> None:
    archive = module_dir / "modules.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        zf.writestr("hooktest_z.py", "import hooktest_zdep\nvalue = hooktest_zdep.value + 1\n")
        zf.writestr("hooktest_zdep.py", "value = 1\n")
    sys.path.insert(0, str(archive))
    seen: list[str] = []

    importhook.install({"hooktest_z": lambda module: seen.append(module.__name__)})
    import hooktest_z

    assert seen == ["hooktest_z"]
    assert hooktest_z.value == 2
