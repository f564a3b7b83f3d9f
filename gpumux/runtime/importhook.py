"""Post-import hooks: run a function on a module right after it finishes importing.

The hook runs inside the importing statement, before the script gets the module back, so it can
configure a framework before the script runs its first operation.
"""

from __future__ import annotations

import sys

from gpumux.runtime.context import say

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence
    from importlib.machinery import ModuleSpec
    from types import ModuleType

    Hook = Callable[[ModuleType], None]


class PostImportFinder:
    """A meta-path finder that finds nothing itself: it hooks the loaders other finders return."""

    def __init__(self, hooks: Mapping[str, Hook]) -> None:
        self._hooks = dict(hooks)
        self._searching: set[str] = set()

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        """Find `fullname` with the other finders; for a hooked name, wrap its loader."""
        hook = self._hooks.get(fullname)
        if hook is None or fullname in self._searching:
            return None
        self._searching.add(fullname)
        try:
            spec = _find_elsewhere(self, fullname, path, target)
        finally:
            self._searching.discard(fullname)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        exec_module = loader.exec_module

        def exec_then_hook(module: ModuleType) -> None:
            exec_module(module)
            if module.__name__ != fullname:
                return  # a loader shared by many modules (a zipimporter) loaded another one
            # Put the loader back as it was, so that a reload runs the module alone.
            vars(loader).pop("exec_module", None)
            if self._hooks.pop(fullname, None) is not None:
                run_hook(fullname, hook, module)

        try:
            loader.exec_module = exec_then_hook  # type: ignore[method-assign]
        except AttributeError:
            say(f"WARNING: cannot hook the import of {fullname} (its loader is read-only)")
        return spec


def install(hooks: Mapping[str, Hook]) -> PostImportFinder:
    """Hook these top-level modules; those already imported get their hook now."""
    pending: dict[str, Hook] = {}
    for name, hook in hooks.items():
        module = sys.modules.get(name)
        if module is None:
            pending[name] = hook
        else:
            run_hook(name, hook, module)
    finder = PostImportFinder(pending)
    sys.meta_path.insert(0, finder)
    return finder


def run_hook(name: str, hook: Hook, module: ModuleType) -> None:
    """Run one hook; a failing hook is reported and never breaks the user's import."""
    try:
        hook(module)
    except Exception as err:
        say(
            f"WARNING: could not set up {name} ({type(err).__name__}: {err}); "
            f"this trial runs without gpumux's {name} settings"
        )


def _find_elsewhere(
    finder: PostImportFinder,
    fullname: str,
    path: Sequence[str] | None,
    target: ModuleType | None,
) -> ModuleSpec | None:
    for other in sys.meta_path:
        find_spec = getattr(other, "find_spec", None)
        if other is finder or find_spec is None:
            continue
        spec: ModuleSpec | None = find_spec(fullname, path, target)
        if spec is not None:
            return spec
    return None
