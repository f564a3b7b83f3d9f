"""gpumux bootstrap: the launcher puts this directory first on a trial's PYTHONPATH.

In a trial (GPUMUX_TRIAL_ID set) it makes `import gpumux` resolve to the package this file belongs
to, even in an interpreter where gpumux is not installed or another version is, and hooks the
frameworks (gpumux.runtime.activate). In every process it then imports the sitecustomize that it
hides further down sys.path, as Python would have without it.

It runs at every interpreter start, so it uses only modules that Python has already loaded.
"""

from __future__ import annotations

import os
import sys
from importlib.machinery import PathFinder

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence
    from importlib.machinery import ModuleSpec
    from types import ModuleType

_BOOTSTRAP_DIR = os.path.dirname(os.path.abspath(__file__))
# bootstrap/ -> runtime/ -> gpumux/ -> the directory that holds the gpumux package
_PACKAGE_PARENT = os.path.dirname(os.path.dirname(os.path.dirname(_BOOTSTRAP_DIR)))


class GpumuxFinder:
    """Finds `gpumux` and its submodules in this bootstrap's own package, before other finders."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        """The spec of gpumux or gpumux.*, from this package; None for any other name."""
        if fullname == "gpumux":
            return PathFinder.find_spec(fullname, [_PACKAGE_PARENT])
        if fullname.startswith("gpumux.") and path is not None:
            return PathFinder.find_spec(fullname, path)
        return None


def _activate() -> None:
    sys.meta_path.insert(0, GpumuxFinder())
    try:
        from gpumux.runtime.activate import activate

        activate()
    except Exception as err:
        sys.stderr.write(
            f"gpumux: WARNING: the gpumux runtime did not start ({type(err).__name__}: {err}); "
            "this trial runs without its slice and reports nothing\n"
        )


def _chain() -> None:
    here = os.path.realpath(_BOOTSTRAP_DIR)
    real = [os.path.realpath(entry or os.curdir) for entry in sys.path]
    start = real.index(here) + 1 if here in real else 0
    rest = [
        entry for entry, path in zip(sys.path[start:], real[start:], strict=True) if path != here
    ]
    spec = PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    ours = sys.modules.get("sitecustomize")
    module = spec.loader.create_module(spec) or type(sys)(spec.name)
    module.__spec__ = spec
    module.__loader__ = spec.loader
    if spec.has_location:
        module.__file__ = spec.origin
        module.__cached__ = spec.cached  # type: ignore[attr-defined]
    sys.modules["sitecustomize"] = module
    try:
        spec.loader.exec_module(module)
    except Exception:
        if ours is not None:
            sys.modules["sitecustomize"] = ours
        import traceback

        sys.stderr.write(f"gpumux: error in the chained sitecustomize {spec.origin}:\n")
        traceback.print_exc()


if os.environ.get("GPUMUX_TRIAL_ID"):
    _activate()
_chain()
