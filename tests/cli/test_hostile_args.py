"""Every command of the real CLI, given hostile arguments, ends in a message, never a traceback.

Each case is a `python -m gpumux` process of its own, forked from a server that imported gpumux
once (forkserver.py): about 470 cases, where each fresh interpreter spent 0.8 s of CPU on its
imports. The usage errors below, and a few hostile cases (FRESH: through the imports a command
makes on its way, which the server made before), run in fresh interpreters."""

from __future__ import annotations

import os
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import pytest
import typer.main
from builders import TEST_MARK
from forkserver import (
    ForkServer,
    OutOfStep,
    StillRunning,
    argv_as_the_interpreter_decodes_it,
    as_argv,
)

from gpumux.cli.app import app
from gpumux.config import Settings
from gpumux.main import summary
from gpumux.server.daemon import embedded

# Bytes that are not UTF-8, an id beyond any column, a negative one, nothing, control
# characters, a value longer than any field, numbers that are not finite, an unknown option.
NOT_UTF8 = b"x\xff\xfe"
HOSTILE: tuple[str | bytes, ...] = (
    NOT_UTF8,
    str(10**100),
    "-5",
    "",
    "\x01\x07\x1b[31m\x7f",
    "y" * 50_000,
    "inf",
    "nan",
    "1e400",
    "--no-such-option",
)
# Numbers that are not finite: hostile to a number, ordinary words to a name.
NOT_FINITE = ("inf", "nan", "1e400")
# Refused by every command, whatever the parameter.
ALWAYS_REFUSED = (NOT_UTF8, "--no-such-option")
RUN_TIMEOUT_S = 60
# What gpumux.main prints for an exception no command caught.
UNEXPECTED = "failed unexpectedly"
WORKERS = 4
# What a case's environment may differ in from its server's: what gpumux reads when a command
# runs, and what is the test's own (conftest's mark for its leak guard, pytest's name of it).
CASE_VARIABLES = {
    "GPUMUX_HOME",
    "GPUMUX_URL",
    "XDG_CONFIG_HOME",
    "TMPDIR",
    TEST_MARK,
    "PYTEST_CURRENT_TEST",
    "GPUMUX_LEAVE_WHEN_IDLE",
    "GPUMUX_PORT",
}
# Hostile cases run in fresh interpreters as well: `serve`, `tune` (which imports the daemon on
# its way) and one other command, each against no daemon.
FRESH: tuple[list[str | bytes], ...] = (
    ["serve", "--home", "y" * 50_000],
    ["tune", "--splits", "1", "--time-limit", "5", "--", "inf"],
    ["export", str(10**100), "--optuna", "sqlite:///study.db"],
)


def commands() -> Iterator[tuple[list[str], Any]]:
    """Every command of the typer app as its words (`token create`) and its click command."""

    def walk(command: Any, path: list[str]) -> Iterator[tuple[list[str], Any]]:
        if hasattr(command, "commands"):
            for name, sub in command.commands.items():
                yield from walk(sub, [*path, name])
        else:
            yield path, command

    yield from walk(typer.main.get_command(app), [])


def with_value(path: list[str], value: str | bytes, study: Path) -> list[str | bytes]:
    """`path` with `value` as its positional argument, and what else it needs to get that far."""
    command = " ".join(path)
    if command == "sweep":
        return [*path, "--detach", value, "--", "true"]
    if command == "tune":
        return [*path, "--splits", "1", "--time-limit", "5", "--", value]
    if command == "export":
        return [*path, value, "--optuna", f"sqlite:///{study}"]
    return [*path, value]


def serve_cases(command: Any, homes: Path) -> list[tuple[list[str | bytes], bool, Path]]:
    """(argv, whether it must be refused, where it runs) for every hostile value in each option
    of `serve`, which takes no argument: each case in a directory of its own under `homes`, with
    its data directory in it (the hostile option comes after it, so a hostile --home is the one
    taken), so that a relative --db, --uds or --home stays the case's own."""
    found: list[tuple[list[str | bytes], bool, Path]] = []

    def case(argv: list[str | bytes], must_refuse: bool) -> None:
        where = homes / str(len(found))
        where.mkdir(parents=True)
        found.append((["serve", "--home", str(where / "home"), *argv], must_refuse, where))

    named = [p for p in command.params if p.param_type_name == "option" and not p.is_flag]
    for option in named:
        number = option.type_descriptor.annotation in (int, float)
        for value in HOSTILE:
            if value in NOT_FINITE and not number:
                # For a name or an address, one more ordinary word: no daemon started for it.
                continue
            if option.name == "leave_when_idle" and value == str(10**100):
                # Taken, rightly: a serve that would wait 1e100 s to leave.
                continue
            case([option.opts[0], value], value == NOT_UTF8)
    for value in (NOT_UTF8, str(10**100), "\x01\x07\x1b[31m\x7f"):
        # Where `serve` listens: where clients look.
        where = homes / str(len(found))
        where.mkdir(parents=True)
        found.append(
            (["--url", value, "serve", "--home", str(where / "home")], value == NOT_UTF8, where)
        )
    return found


def cases(
    path: list[str], command: Any, study: Path, *, options: bool
) -> list[tuple[list[str | bytes], bool, Path]]:
    """(argv, whether it must be refused, where it runs) for hostile values in the command's
    argument, and with `options` in each of its options too."""
    if path == ["serve"]:
        return serve_cases(command, study.parent / "serve")
    found = [(with_value(path, value, study), value in ALWAYS_REFUSED) for value in HOSTILE]
    if options:
        found += options_cases(path, command, study)
    return [(argv, must_refuse, study.parent) for argv, must_refuse in found]


def options_cases(
    path: list[str], command: Any, study: Path
) -> list[tuple[list[str | bytes], bool]]:
    """(argv, whether it must be refused) for hostile values in each of the command's options
    and in the daemon's address."""
    found: list[tuple[list[str | bytes], bool]] = []
    plain = with_value(path, "1", study)
    named = [p for p in command.params if p.param_type_name == "option" and not p.is_flag]
    for number, option in enumerate(named):
        # Each option: bytes that are not UTF-8, and one of the others in turn (an option's
        # value that looks like an option is a value, so it may be accepted).
        for value in (NOT_UTF8, HOSTILE[1 + number % (len(HOSTILE) - 2)]):
            argv = [plain[0], option.opts[0], value, *plain[1:]]
            found.append((argv, value == NOT_UTF8))
    for value in (NOT_UTF8, str(10**100), "\x01\x07\x1b[31m\x7f"):
        found.append((["--url", value, *plain], value == NOT_UTF8))
    return found


def run(
    argv: list[str | bytes], env: dict[str, str], cwd: Path
) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [os.fsencode(sys.executable), b"-m", b"gpumux", *map(os.fsencode, argv)],
        env=env,
        cwd=cwd,
        capture_output=True,
        timeout=RUN_TIMEOUT_S,
    )


def verdict(
    argv: list[str | bytes],
    must_refuse: bool,
    env: dict[str, str],
    cwd: Path,
    servers: queue.Queue[ForkServer],
) -> str | None:
    """What is wrong with how the CLI ended on `argv` (run by one of `servers`), or None."""
    shown = [os.fsencode(word)[:40] for word in argv]
    server = servers.get()
    try:
        ended = server.run(argv, env=env, cwd=cwd, timeout=RUN_TIMEOUT_S)
    except (StillRunning, OutOfStep) as error:
        return f"{shown}: {error}"
    finally:
        servers.put(server)
    if ended.left:
        return f"{shown}: left running, now killed: {ended.left}"
    return judged(shown, must_refuse, ended.code, ended.stdout, ended.stderr)


def judged(
    shown: list[bytes], must_refuse: bool, returncode: int, stdout: bytes, stderr: bytes
) -> str | None:
    """What is wrong with how the CLI ended on `shown`, or None."""
    output = (stdout + stderr).decode(errors="replace")
    if "Traceback" in output:
        return f"{shown}: a traceback\n{output[-3000:]}"
    if UNEXPECTED in output:
        # gpumux.main's last net: a bug the command did not foresee, not a message for the user.
        return f"{shown}: {output[-1000:]}"
    if must_refuse and returncode == 0:
        return f"{shown}: accepted"
    if returncode != 0 and not stderr.strip():
        return f"{shown}: exit {returncode} with no message"
    return None


def quiet_env(tmp_path: Path) -> dict[str, str]:
    """This environment without gpumux's variables, its temporary files (and so the tracebacks
    gpumux.main writes) in `tmp_path`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUMUX_")}
    env["TMPDIR"] = str(tmp_path)
    return env


@pytest.fixture(scope="module")
def daemon_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    home = tmp_path_factory.mktemp("daemon") / "home"
    with embedded(Settings(home=home)):
        yield home


def case_env(tmp_path: Path, home: Path, *, daemon: bool) -> dict[str, str]:
    """A case's environment: its own home, user configuration and temporary files, and the
    daemon at `home`'s or none."""
    env = quiet_env(tmp_path)
    env["GPUMUX_HOME"] = str(home)
    # `token create` writes the user's token file: here, not in the real home.
    env["XDG_CONFIG_HOME"] = str(tmp_path / "config")
    if not daemon:
        env["GPUMUX_URL"] = f"unix:{tmp_path / 'nobody.sock'}"
    return env


def server_env() -> dict[str, str]:
    """The cases' environment but for CASE_VARIABLES, in a module's fixture: conftest's autouse
    fixtures (no GPUMUX_* variable, the GPUs hidden) are a test's, set up after it."""
    env = {name: value for name, value in os.environ.items() if not name.startswith("GPUMUX_")}
    env["CUDA_VISIBLE_DEVICES"] = ""
    return env


@contextmanager
def fork_servers(
    directories: Sequence[Path], env: Mapping[str, str]
) -> Iterator[queue.Queue[ForkServer]]:
    """A fork server for each of `directories`, idle in a queue; each one closed at the end
    (when a test fails too), the case it may have in flight killed with it."""
    idle: queue.Queue[ForkServer] = queue.Queue()
    with ExitStack() as started:
        for directory in directories:
            server = ForkServer(directory, env=env)
            started.callback(server.close)
            idle.put(server)
        yield idle


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[queue.Queue[ForkServer]]:
    """A fork server for each of the WORKERS threads: each case a process of its own, forked
    from one that imported gpumux once (about 470 cases, 0.8 s of CPU each to import it)."""
    directories = [tmp_path_factory.mktemp("forked") for _ in range(WORKERS)]
    with fork_servers(directories, server_env()) as idle:
        yield idle


def gone(pid: int) -> bool:
    """The process no longer runs (a zombie runs nothing; PID 1 here may never reap it)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rpartition(")")[2].split()[0] == "Z"
    except FileNotFoundError:
        return True


def test_a_test_that_fails_with_a_case_in_flight_leaves_no_server_and_no_case_running(
    tmp_path: Path,
) -> None:
    pid_file = tmp_path / "case.pid"
    (tmp_path / "sleeper.py").write_text(
        f"import os, time\nopen({str(pid_file)!r}, 'w').write(str(os.getpid()))\ntime.sleep(600)\n"
    )
    ends: list[BaseException] = []

    def run_case(server: ForkServer) -> None:
        try:
            server.run([], env=server.environment, cwd=tmp_path, timeout=600, module="sleeper")
        except BaseException as error:
            ends.append(error)

    directories = [tmp_path / "a", tmp_path / "b"]
    for directory in directories:
        directory.mkdir()
    with pytest.raises(RuntimeError), fork_servers(directories, server_env()) as idle:
        started = [idle.get(), idle.get()]
        case = threading.Thread(target=run_case, args=(started[0],), daemon=True)
        case.start()
        deadline = time.monotonic() + RUN_TIMEOUT_S
        while not pid_file.exists() or not pid_file.read_text():
            assert time.monotonic() < deadline, "the case never started"
            time.sleep(0.02)
        raise RuntimeError("a case failed")
    pids = [int(pid_file.read_text()), *(server.process.pid for server in started)]
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while not all(map(gone, pids)) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert [pid for pid in pids if not gone(pid)] == []
    case.join(RUN_TIMEOUT_S)
    assert not case.is_alive() and ends, "the case's run ended with its server"


def test_a_forked_case_gets_its_arguments_as_the_interpreter_decodes_them() -> None:
    words = [os.fsencode(value) for value in HOSTILE]
    assert as_argv(words) == argv_as_the_interpreter_decodes_it(words)


def test_a_case_differs_from_its_server_only_in_what_a_command_reads(
    tmp_path: Path, servers: queue.Queue[ForkServer]
) -> None:
    server = servers.get()
    servers.put(server)
    env = case_env(tmp_path, tmp_path / "home", daemon=False)
    differing = {
        name
        for name in env.keys() | server.environment.keys()
        if env.get(name) != server.environment.get(name)
    }
    assert differing <= CASE_VARIABLES


# Each command against a daemon and against none; `serve`, which looks for none, once.
AGAINST = [
    pytest.param(path, command, against, id=f"{' '.join(path)}-{against}")
    for path, command in commands()
    for against in ("a daemon", "no daemon")
    if path != ["serve"] or against == "a daemon"
]


@pytest.mark.parametrize(("path", "command", "against"), AGAINST)
def test_hostile_arguments_end_in_a_message_and_an_exit_code(
    tmp_path: Path,
    daemon_home: Path,
    servers: queue.Queue[ForkServer],
    path: list[str],
    command: Any,
    against: str,
) -> None:
    home = daemon_home if against == "a daemon" else tmp_path / "home"
    env = case_env(tmp_path, home, daemon=against == "a daemon")
    if path == ["serve"]:
        # A serve that accepts its arguments leaves at once rather than serving until stopped.
        env["GPUMUX_LEAVE_WHEN_IDLE"] = "0"
        # Not the default port, which a person's own daemon here may hold.
        env["GPUMUX_PORT"] = "0"
    study = tmp_path / "study.db"
    with ThreadPoolExecutor(WORKERS) as pool:
        verdicts = pool.map(
            lambda case: verdict(case[0], case[1], env, case[2], servers),
            # Options are parsed before any daemon is looked for: once is enough.
            cases(path, command, study, options=against == "a daemon"),
        )
        wrong = [v for v in verdicts if v is not None]
    assert not wrong, "\n".join(wrong)
    assert not list(tmp_path.glob("gpumux-traceback-*"))


@pytest.mark.parametrize("argv", FRESH, ids=[str(argv[0]) for argv in FRESH])
def test_hostile_arguments_end_in_a_message_in_a_fresh_interpreter_too(
    tmp_path: Path, argv: list[str | bytes]
) -> None:
    done = run(argv, case_env(tmp_path, tmp_path / "home", daemon=False), tmp_path)
    shown = [os.fsencode(word)[:40] for word in argv]
    wrong = judged(shown, False, done.returncode, done.stdout, done.stderr)
    assert wrong is None, wrong
    assert not list(tmp_path.glob("gpumux-traceback-*"))


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--url", "\x01x", "ls"], "the daemon's address '\\x01x' is not a URL"),
        (["--url", "http://256.0.0.1:1", "ls"], "is not a URL (Invalid IPv4 address"),
        (["--url", "http://x:" + "9" * 50_000, "ls"], "is not a URL (Invalid port"),
        (["token", "create", ""], "user: String should have at least 1 character"),
        (["token", "create", "y" * 50_000], "user: String should have at most 64 characters"),
        (["token", "revoke", ""], "user: String should have at least 1 character"),
        (["top", "--interval", "1e100"], "less than or equal to 3600"),
        (["serve", "--port", "99999"], "less than or equal to 65535"),
    ],
    ids=["control", "address", "port", "no user", "long user", "revoke no one", "top", "serve"],
)
def test_what_no_daemon_could_take_is_a_usage_error_before_any_is_looked_for(
    tmp_path: Path, argv: list[str], message: str
) -> None:
    env = quiet_env(tmp_path)
    env["GPUMUX_HOME"] = str(tmp_path / "home")
    env["GPUMUX_URL"] = f"unix:{tmp_path / 'nobody.sock'}"
    done = run(list(argv), env, tmp_path)
    stderr = " ".join(done.stderr.decode().split())
    assert done.returncode == 2, stderr
    assert message in stderr
    assert len(stderr) < 1000
    assert not (tmp_path / "home").exists()


def test_the_last_net_says_what_failed_in_one_short_line() -> None:
    line = summary(ValueError("\x1b[31m" + "y" * 50_000 + "\nsecond line"))
    assert line.startswith("ValueError: \\x1b[31myyy")
    assert line.endswith("y…")
    assert len(line) < 300
