"""How a supervisor starts its trial: a fork, a new session, the spec's cores, user and
directory, then an exec (a fresh start) or, in a supervisor forked by the preloading spawner,
the trial without an exec (a preloaded start); and why a start failed, for the trial's log.

A preloaded start (the spec's `preload`): when this supervisor was forked by the preloading
spawner, which imported gpumux.runtime.preloaded and the framework, and the command is
`python script.py` with that very interpreter (and nothing else needs a fresh process:
preloaded.fresh_reason), the trial child becomes the trial without an exec
(preloaded.run_trial), after the same session, descriptors, user and directory as a fresh one;
otherwise it says why on the trial's log, and execs. It finds that module in sys.modules, never
imports it: a supervisor not forked by the preloading spawner has none.

The supervisor imports it, so it imports what the supervisor may: the standard library.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import sys
from typing import Any

# The trial's side of a preloaded start: the preloading spawner preloads it; never imported here.
PRELOADED_MODULE = "gpumux.runtime.preloaded"


def explain_spawn_error(error: OSError | ValueError, argv: list[str], cwd: str, path: str) -> str:
    """Why the trial's command could not start, and what to do about it."""
    program = argv[0]
    if isinstance(error, ValueError):
        return f"could not start {program!r}: {error} (in its command, directory or environment)"
    if isinstance(error, FileNotFoundError) and error.filename == cwd:
        return f"working directory {cwd} does not exist"
    if isinstance(error, FileNotFoundError):
        return f"command not found: {program!r} (searched PATH={path}); check the command"
    if isinstance(error, PermissionError) or error.errno == errno.EACCES:
        return f"permission denied running {program!r}: is it executable (chmod +x)?"
    return f"could not start {program!r}: {error}"


class SpawnError(RuntimeError):
    """The trial's command could not start; the message says why and what to do."""


def spawn(spec: dict[str, Any], output: int) -> int:
    """Fork and exec the trial in a new session, as the spec's user when root; its pid."""
    errors_read, errors_write = os.pipe2(os.O_CLOEXEC)
    pid = os.fork()
    if pid == 0:
        os.close(errors_read)
        _become_trial(spec, output, errors_write)
    os.close(errors_write)
    with os.fdopen(errors_read, "rb") as errors:
        failure = errors.read()
    if not failure:
        return pid  # the exec closed the pipe: the command runs
    os.waitpid(pid, 0)
    stage, number, text = failure.decode(errors="replace").split(":", 2)
    user = spec.get("user")
    if stage == "setup" and user is not None:
        raise SpawnError(
            f"cannot switch to uid {user['uid']} gid {user['gid']}: {text} (the daemon must "
            "run as root, with CAP_SETUID and CAP_SETGID, to run trials as their owners)"
        )
    if stage == "chdir" and user is not None:
        raise SpawnError(
            f"uid {user['uid']} cannot enter the working directory {spec['cwd']}: {text}"
        )
    error = OSError(int(number), text, spec["cwd"] if stage == "chdir" else spec["argv"][0])
    if stage == "exec" and error.errno == errno.ENOENT:
        error = FileNotFoundError(error.errno, text, spec["argv"][0])
    path = spec["env"].get("PATH", "")
    raise SpawnError(explain_spawn_error(error, spec["argv"], spec["cwd"], path))


def _become_trial(spec: dict[str, Any], output: int, errors: int) -> None:
    """In the forked child: become the trial, or report which step failed and exit."""
    stage = "setup"
    try:
        os.setsid()
        signal.pthread_sigmask(signal.SIG_SETMASK, set())
        # Python ignores SIGPIPE and SIGXFSZ, and exec keeps what is ignored: restore both.
        restored = (signal.SIGINT, signal.SIGHUP, signal.SIGTERM, signal.SIGUSR1)
        for signum in (*restored, signal.SIGCHLD, signal.SIGPIPE, signal.SIGXFSZ):
            signal.signal(signum, signal.SIG_DFL)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.dup2(output, 1)
        os.dup2(output, 2)
        os.closerange(3, errors)
        os.closerange(errors + 1, os.sysconf("SC_OPEN_MAX"))
        _pin(spec.get("cpu_affinity"))
        user = spec.get("user")
        if user is not None and os.geteuid() == 0:
            os.setgroups(user["groups"])
            os.setgid(user["gid"])
            os.setuid(user["uid"])
        # Entered after the switch to the user: a directory they may not enter fails.
        stage = "chdir"
        os.chdir(spec["cwd"])
        if spec.get("preload") and _starts_preloaded(spec):
            preloaded = sys.modules[PRELOADED_MODULE]
            stage = "preload"
            # No exec closes the error pipe: the command runs from here on. The wakeup fd
            # was the supervisor's, closed above; its number may name the trial's files.
            signal.set_wakeup_fd(-1)
            os.close(errors)
            errors = -1
            preloaded.run_trial(spec["argv"], spec["env"], spec["cwd"])
        stage = "exec"
        os.execvpe(spec["argv"][0], spec["argv"], spec["env"])
    except BaseException as error:
        number = getattr(error, "errno", None) or 0
        text = getattr(error, "strerror", None) or str(error)
        with contextlib.suppress(OSError):
            if errors < 0:
                os.write(
                    2, f"gpumux: the preloaded start failed: {text}\n".encode(errors="replace")
                )
            else:
                os.write(errors, f"{stage}:{number}:{text}".encode(errors="replace"))
    finally:
        os._exit(127)


def _starts_preloaded(spec: dict[str, Any]) -> bool:
    """In the trial child of a --preload trial: whether it can start preloaded here; if not,
    says why on its output (the trial's log) before it starts fresh."""
    preloaded = sys.modules.get(PRELOADED_MODULE)
    if preloaded is None:
        why = "the preloading spawner did not fork its supervisor (not ready yet, or failed: "
        why += "see the daemon's log)"
    else:
        why = preloaded.fresh_reason(spec["argv"], spec["env"])
        if why is None:
            return True
    with contextlib.suppress(OSError):
        message = f"gpumux: this --preload trial starts fresh: {why}\n"
        os.write(2, message.encode(errors="replace"))
    return False


def _pin(cores: list[int] | None) -> None:
    """In the trial child, on its log: pin it to `cores` (GPUMUX_CPU_AFFINITY), or say why it
    runs on every core instead; a core it may not have costs the pinning, not the trial."""
    if not cores:
        return
    try:
        os.sched_setaffinity(0, cores)
    except OSError as error:
        line = f"gpumux: WARNING: cannot pin the trial to cores {cores} ({error}): not pinned\n"
    else:
        line = f"gpumux: pinned to cores {','.join(map(str, cores))}\n"
    os.write(1, line.encode())
