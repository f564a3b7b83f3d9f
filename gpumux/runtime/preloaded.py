"""Preloaded start: a parent that imported the framework forks trials that run a script as __main__.

The parent calls `preload` once; each forked child calls `run_trial`, which becomes the trial as a
fresh start would (its environment, directory, sys.argv, the bootstrap's caps and hooks) and never
returns. The caps still apply because importing a framework initialises nothing: TensorFlow
creates no thread pool and touches no device until its first operation, which the parent never
runs. The caller does what a fresh launch does around the exec: a session of its own, stdin and
the output descriptors, the user, the signal mask. Standard library only, like the runtime.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import importlib
import os
import runpy
import shutil
import signal
import site
import sys
import threading
import time
import traceback

import gpumux.runtime
from gpumux.runtime import context
from gpumux.runtime.activate import activate

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping, Sequence
    from typing import NoReturn

# Interpreter options a preloaded child can honour: the trial's environment sets -u's effect.
HONOURED_OPTIONS = ("-u",)
# Read by the dynamic loader when the process started, which for a preloaded child was the parent.
LOADER_VARIABLES = ("LD_LIBRARY_PATH", "LD_PRELOAD")
# Read by the interpreter as it starts, into its hash seed, flags, streams, allocator or first
# sys.path entry: a preloaded child's interpreter started long ago (isolated, -I), so a trial that
# sets one starts fresh. Not here: PYTHONPATH, PYTHONUNBUFFERED, PYTHONDONTWRITEBYTECODE (common
# in containers), PYTHONNOUSERSITE and PYTHONUSERBASE, which run_trial applies itself, and those
# read later from os.environ (PYTHONBREAKPOINT, PYTHONASYNCIODEBUG) or only when interactive.
STARTUP_VARIABLES = (
    "PYTHONHASHSEED",
    "PYTHONWARNINGS",
    "PYTHONIOENCODING",
    "PYTHONOPTIMIZE",
    "PYTHONSAFEPATH",
    "PYTHONHOME",
    "PYTHONPLATLIBDIR",
    "PYTHONINSPECT",
    "PYTHONVERBOSE",
    "PYTHONDEBUG",
    "PYTHONDEVMODE",
    "PYTHONUTF8",
    "PYTHONCOERCECLOCALE",
    "PYTHONMALLOC",
    "PYTHONMALLOCSTATS",
    "PYTHONFAULTHANDLER",
    "PYTHONTRACEMALLOC",
    "PYTHONPROFILEIMPORTTIME",
    "PYTHONPYCACHEPREFIX",
    "PYTHONWARNDEFAULTENCODING",
    "PYTHONINTMAXSTRDIGITS",
    "PYTHONNODEBUGRANGES",
    "PYTHONPERFSUPPORT",
    "PYTHONFROZENMODULES",
    "PYTHON_CPU_COUNT",
    "PYTHON_GIL",
    "PYTHON_PRESITE",
    "PYTHON_JIT",
    "PYTHON_PERF_JIT_SUPPORT",
)
# OpenBLAS reads OPENBLAS_NUM_THREADS when it loads, in the parent: the child sets it by name.
OPENBLAS_SETTERS = (
    "openblas_set_num_threads",
    "openblas_set_num_threads64_",
    "scipy_openblas_set_num_threads",
    "scipy_openblas_set_num_threads64_",
)


def preload(modules: Iterable[str]) -> list[str]:
    """Import these modules in the preloading parent; the names of the threads they left running."""
    for name in modules:
        importlib.import_module(name)
    # Only Python's own threads are listed here; native pools (OpenBLAS) are in /proc/self/task.
    return [
        thread.name for thread in threading.enumerate() if thread is not threading.main_thread()
    ]


def script_argv(argv: Sequence[str], env: Mapping[str, str]) -> list[str] | None:
    """The script's sys.argv when `argv` runs a script with this interpreter, else None.

    `python script.py args` gives [script.py, args]; `python -m module args` gives
    [-m, module, args]. Another program, another interpreter (found on the trial's PATH), or an
    option the child cannot honour gives None: that command must start fresh. A relative
    command is found from the current directory, as exec would from the trial's.
    """
    if not argv:
        return None
    program = shutil.which(argv[0], path=env.get("PATH", os.defpath))
    if program is None or not _same_interpreter(program):
        return None
    rest = list(argv[1:])
    while rest and rest[0] in HONOURED_OPTIONS:
        rest.pop(0)
    if not rest or rest[0] == "-":
        return None
    if rest[0] == "-m":
        return rest if len(rest) >= 2 else None
    return None if rest[0].startswith("-") else rest


def fresh_reason(argv: Sequence[str], env: Mapping[str, str]) -> str | None:
    """Why `argv` with the trial's `env` must start fresh in this process, or None if it can
    start preloaded. Call it before the trial's environment replaces this process's own."""
    if script_argv(argv, env) is None:
        return f"{' '.join(argv)!r} is not `python script.py` with this interpreter"
    for name in LOADER_VARIABLES:
        if env.get(name, "") != os.environ.get(name, ""):
            return (
                f"its {name} is not the preloading spawner's, which its libraries were loaded with"
            )
    # An empty value is no setting, for the interpreter as here.
    startup = [name for name in STARTUP_VARIABLES if env.get(name)]
    if startup:
        return f"it sets {', '.join(startup)}, read only as an interpreter starts"
    return None


def run_trial(argv: Sequence[str], env: Mapping[str, str], cwd: str) -> NoReturn:
    """In a forked child: become the trial that `argv` starts, run its script, exit as it did."""
    # First, as for an exec: a relative command or script is found from the trial's directory.
    os.chdir(cwd)
    reason = fresh_reason(argv, env)
    if reason is not None:
        raise ValueError(f"cannot start preloaded: {reason}")
    script = script_argv(argv, env)
    assert script is not None
    os.environ.clear()
    os.environ.update(env)
    _reset_signal_handlers()
    _set_sys_path(script, env)
    _add_user_site(env)
    # What a fresh interpreter does with PYTHONDONTWRITEBYTECODE.
    sys.dont_write_bytecode = bool(env.get("PYTHONDONTWRITEBYTECODE"))
    # The first report's interval starts with the trial, as at a fresh interpreter's start.
    gpumux.runtime._previous_report_at = time.monotonic()
    _cap_openblas(env)
    try:
        activate()
    except Exception as err:
        context.say(
            f"WARNING: the gpumux runtime did not start ({type(err).__name__}: {err}); "
            "this trial runs without its slice and reports nothing"
        )
    _exit(_run_script(script))


def _reset_signal_handlers() -> None:
    # The parent's Python handlers are not the trial's: a fresh interpreter has only SIGINT's.
    for signum in signal.valid_signals():
        with contextlib.suppress(OSError, ValueError):
            if callable(signal.getsignal(signum)):
                signal.signal(signum, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    # A fresh interpreter ignores these (a write to a closed pipe raises BrokenPipeError, past
    # the file size limit OSError); the supervisor restored them for an exec, which never comes.
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)


def _same_interpreter(program: str) -> bool:
    # The same directory keeps a virtualenv's site-packages; samefile tells python3 from python2.
    ours = os.path.abspath(sys.executable)
    theirs = os.path.abspath(program)
    return os.path.dirname(theirs) == os.path.dirname(ours) and os.path.samefile(theirs, ours)


def _set_sys_path(script: list[str], env: Mapping[str, str]) -> None:
    # As the interpreter would: the script's directory (or, with -m, the working directory)
    # first, then PYTHONPATH's entries, which the parent's environment did not have.
    first = os.getcwd() if script[0] == "-m" else os.path.dirname(os.path.abspath(script[0]))
    extra = [entry for entry in env.get("PYTHONPATH", "").split(os.pathsep) if entry]
    rest = [entry for entry in sys.path[1:] if entry not in extra]
    sys.path[:] = [first, *extra, *rest]


def _add_user_site(env: Mapping[str, str]) -> None:
    # The preloading parent runs isolated, without the user's site-packages (pip install --user),
    # which `python script.py` has: added after the trial's HOME and user are in place.
    if env.get("PYTHONNOUSERSITE") or not user_site_enabled(sys.prefix):
        return
    directory = user_site_dir(env)
    if not os.path.isdir(directory):
        return
    before = list(sys.path)
    site.addsitedir(directory)
    added = [entry for entry in sys.path if entry not in before]
    # Where the interpreter puts it: before the installation's own site-packages.
    installed = set(site.getsitepackages())
    at = next((i for i, entry in enumerate(before) if entry in installed), len(before))
    sys.path[:] = [*before[:at], *added, *before[at:]]


def user_site_enabled(prefix: str) -> bool:
    """Whether an interpreter of the installation at `prefix` has a user site (not a virtual
    environment without the system's site-packages)."""
    try:
        with open(os.path.join(prefix, "pyvenv.cfg")) as config:
            lines = config.read().splitlines()
    except FileNotFoundError:
        return True
    for line in lines:
        key, _, value = line.partition("=")
        if key.strip().lower() == "include-system-site-packages":
            return value.strip().lower() == "true"
    return False


def user_site_dir(env: Mapping[str, str]) -> str:
    """The user's site-packages, as the interpreter finds it from the trial's environment."""
    base = env.get("PYTHONUSERBASE") or os.path.join(os.path.expanduser("~"), ".local")
    threads = "t" if "t" in sys.abiflags else ""
    version = f"python{sys.version_info[0]}.{sys.version_info[1]}{threads}"
    return os.path.join(base, "lib", version, "site-packages")


def _cap_openblas(env: Mapping[str, str]) -> None:
    raw = env.get("OPENBLAS_NUM_THREADS", "")
    if not raw.isdigit():
        return
    for path in _loaded_libraries("openblas"):
        library = ctypes.CDLL(path)
        for name in OPENBLAS_SETTERS:
            setter = getattr(library, name, None)
            if setter is not None:
                setter(int(raw))
                break


def _loaded_libraries(word: str) -> list[str]:
    with open("/proc/self/maps") as maps:
        paths = {line.split(maxsplit=5)[-1].strip() for line in maps if word in line}
    return sorted(path for path in paths if path.startswith("/"))


def _run_script(script: list[str]) -> int:
    """Run the script as __main__; its exit status as the interpreter would give it."""
    sys.argv = list(script)
    try:
        if script[0] == "-m":
            sys.argv = script[1:]
            runpy.run_module(script[1], run_name="__main__", alter_sys=True)
        else:
            runpy.run_path(script[0], run_name="__main__")
    except SystemExit as done:
        return _exit_code(done.code)
    except KeyboardInterrupt:
        traceback.print_exc()
        # A fresh interpreter ends by the signal it was interrupted by.
        return -signal.SIGINT
    except BaseException:
        traceback.print_exc()
        return 1
    return 0


def _exit_code(code: object) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def _exit(status: int) -> NoReturn:
    """End as an interpreter does: join the script's threads, run atexit, flush, exit."""
    for thread in threading.enumerate():
        if thread is not threading.current_thread() and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        if stream is not None:
            with contextlib.suppress(Exception):
                stream.flush()
    if status < 0:
        signal.signal(-status, signal.SIG_DFL)
        os.kill(os.getpid(), -status)
    os._exit(status & 0xFF)
