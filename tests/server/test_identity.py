"""Identity: the kernel's word for a Unix-socket peer, through uvicorn, for real Linux users."""

from __future__ import annotations

import asyncio
import dataclasses
import grp
import json
import os
import pwd
import secrets
import shutil
import socket
import stat
import struct
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from fastapi import FastAPI, Request

from gpumux.config import Settings
from gpumux.home.accounts import UnknownUser, UserAccount, readable_directory
from gpumux.server.identity import (
    PeerCredentials,
    PeerH11Protocol,
    PeerHttpProtocol,
    accepted,
    credentials,
    is_admin,
    peer_credentials,
    request_peer,
)

# Run as another user: only the standard library, and the response body as JSON.
CLIENT = r"""
import json, os, socket, sys
with socket.socket(socket.AF_UNIX) as sock:
    sock.connect(sys.argv[1])
    sock.sendall(b"GET /peer HTTP/1.1\r\nHost: gpumux\r\nConnection: close\r\n\r\n")
    response = b""
    while chunk := sock.recv(65536):
        response += chunk
body = response.split(b"\r\n\r\n", 1)[1]
print(json.dumps({"uid": os.getuid(), "pid": os.getpid(), "peer": json.loads(body)}))
"""

CONNECT_AND_WAIT = (
    "import socket, sys; socket.socket(socket.AF_UNIX).connect(sys.argv[1]); sys.stdin.read()"
)
LIST_AND_ENTER = "import os, sys; os.listdir(sys.argv[1]); os.chdir(sys.argv[1])"

# Claims root to any dynamically linked program that asks libc who it is.
FAKE_ROOT_C = """
#include <sys/types.h>
uid_t getuid(void) { return 0; }
uid_t geteuid(void) { return 0; }
gid_t getgid(void) { return 0; }
gid_t getegid(void) { return 0; }
"""


@pytest.fixture(scope="session")
def open_dir() -> Iterator[Path]:
    """A directory every user can traverse (tmp_path lies under a root-only one)."""
    path = Path(tempfile.mkdtemp(prefix="gpumux-identity-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path)


@dataclass(frozen=True)
class LocalUser:
    """A throwaway Linux user, member of one extra group, and a Python it can run."""

    account: UserAccount
    group_name: str
    group_gid: int
    python: str

    def run(
        self, argv: list[str], env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            argv,
            user=self.account.uid,
            group=self.account.gid,
            extra_groups=list(self.account.groups),
            env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", **(env or {})},
            cwd="/",
            capture_output=True,
            text=True,
            timeout=60,
        )


@pytest.fixture(scope="session")
def local_user() -> Iterator[LocalUser]:
    """A real user made with useradd for this session, and deleted after it."""
    if os.geteuid() != 0:
        pytest.skip("needs root: the test creates a Linux user with useradd")
    missing = [
        tool for tool in ("useradd", "userdel", "groupadd", "groupdel") if not shutil.which(tool)
    ]
    if missing:
        pytest.skip(f"needs {', '.join(missing)} to create a Linux user")
    suffix = secrets.token_hex(4)
    name, group_name = f"gpumuxtest_{suffix}", f"gpumuxtestg_{suffix}"
    subprocess.run(["groupadd", group_name], check=True, capture_output=True)
    try:
        subprocess.run(
            ["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin"]
            + ["--groups", group_name, name],
            check=True,
            capture_output=True,
        )
        try:
            account = UserAccount.from_name(name)
            user = LocalUser(account, group_name, grp.getgrnam(group_name).gr_gid, python="")
            pythons = [sys.executable, os.path.realpath(sys.executable), "/usr/bin/python3"]
            python = next((p for p in pythons if _runs(user, p)), None)
            if python is None:
                pytest.skip(f"no Python that {name} may run among {pythons}")
            yield dataclasses.replace(user, python=python)
        finally:
            subprocess.run(["userdel", name], check=True, capture_output=True)
    finally:
        subprocess.run(["groupdel", group_name], check=False, capture_output=True)


def _runs(user: LocalUser, python: str) -> bool:
    try:
        return user.run([python, "-I", "-c", "pass"]).returncode == 0
    except PermissionError:  # a directory on the way is closed to the user
        return False


def peer_app() -> FastAPI:
    app = FastAPI()

    @app.get("/peer")
    def peer(request: Request) -> dict[str, int] | None:
        found = request_peer(request.scope)
        return None if found is None else dataclasses.asdict(found)

    return app


@dataclass(frozen=True)
class Served:
    uds: Path
    port: int


_PROTOCOLS: set[type[asyncio.Protocol]] = {PeerH11Protocol, PeerHttpProtocol}
PROTOCOLS = sorted(_PROTOCOLS, key=lambda cls: cls.__name__)


@pytest.fixture(params=PROTOCOLS, ids=[cls.__name__ for cls in PROTOCOLS])
def served(request: pytest.FixtureRequest, open_dir: Path) -> Iterator[Served]:
    """The peer-echoing app on a Unix socket anyone may open and on a TCP port, one server."""
    path = Path(tempfile.mkdtemp(dir=open_dir)) / "gpumux.sock"
    path.parent.chmod(0o755)
    uds = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    uds.bind(str(path))
    path.chmod(0o666)
    uds.listen(16)
    tcp = socket.socket()
    tcp.bind(("127.0.0.1", 0))
    tcp.listen(16)
    config = uvicorn.Config(
        peer_app(), http=request.param, ws="none", log_level="warning", lifespan="off"
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=lambda: asyncio.run(server.serve(sockets=[uds, tcp])))
    thread.start()
    try:
        yield Served(uds=path, port=tcp.getsockname()[1])
    finally:
        server.should_exit = True
        thread.join()
        uds.close()
        tcp.close()


def test_peer_credentials_of_a_socket_pair() -> None:
    left, right = socket.socketpair()
    with left, right:
        assert peer_credentials(left) == PeerCredentials(os.getpid(), os.getuid(), os.getgid())


def test_peer_credentials_name_the_process_that_connected(tmp_path: Path) -> None:
    path = tmp_path / "s.sock"
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(str(path))
        listener.listen(1)
        child = subprocess.Popen(
            [sys.executable, "-c", CONNECT_AND_WAIT, str(path)],
            stdin=subprocess.PIPE,
        )
        try:
            connection, _ = listener.accept()
            with connection:
                assert peer_credentials(connection).pid == child.pid
        finally:
            assert child.stdin is not None
            child.stdin.close()
            assert child.wait(timeout=30) == 0


def test_request_peer_reads_only_credentials() -> None:
    peer = PeerCredentials(pid=1, uid=2, gid=3)
    assert request_peer({"gpumux.peer": peer}) == peer
    assert request_peer({"gpumux.peer": {"pid": 1, "uid": 0, "gid": 0}}) is None
    assert request_peer({}) is None


def test_a_request_on_the_unix_socket_carries_its_peer(served: Served) -> None:
    transport = httpx.HTTPTransport(uds=str(served.uds))
    with httpx.Client(transport=transport, base_url="http://gpumux", timeout=10) as client:
        for _ in range(2):  # the second request reuses the connection
            assert client.get("/peer").json() == {
                "pid": os.getpid(),
                "uid": os.getuid(),
                "gid": os.getgid(),
            }


def test_a_request_over_tcp_carries_no_peer(served: Served) -> None:
    response = httpx.get(f"http://127.0.0.1:{served.port}/peer", timeout=10)
    assert response.status_code == 200
    assert response.json() is None


def echoed(result: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert result.returncode == 0, result.stderr
    answer: dict[str, Any] = json.loads(result.stdout)
    return answer


def test_another_user_is_seen_as_themselves(served: Served, local_user: LocalUser) -> None:
    answer = echoed(local_user.run([local_user.python, "-I", "-c", CLIENT, str(served.uds)]))
    account = local_user.account
    assert answer["uid"] == account.uid
    assert answer["peer"] == {"pid": answer["pid"], "uid": account.uid, "gid": account.gid}


@pytest.fixture(scope="session")
def fake_root_library(open_dir: Path) -> Path:
    """A shared library that makes getuid() and friends answer 0."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("needs a C compiler to build the LD_PRELOAD library")
    source, library = open_dir / "fakeroot.c", open_dir / "fakeroot.so"
    source.write_text(FAKE_ROOT_C)
    subprocess.run(
        [compiler, "-shared", "-fPIC", "-o", str(library), str(source)],
        check=True,
        capture_output=True,
    )
    library.chmod(0o755)
    return library


def test_ld_preload_does_not_change_the_uid_the_server_sees(
    served: Served, local_user: LocalUser, fake_root_library: Path
) -> None:
    answer = echoed(
        local_user.run(
            [local_user.python, "-I", "-c", CLIENT, str(served.uds)],
            env={"LD_PRELOAD": str(fake_root_library)},
        )
    )
    assert answer["uid"] == 0  # the client believes it is root
    assert answer["peer"]["uid"] == local_user.account.uid


def test_a_user_namespace_does_not_change_the_uid_the_server_sees(
    served: Served, local_user: LocalUser
) -> None:
    unshare = ["unshare", "--user", "--map-root-user"]
    if shutil.which("unshare") is None:
        pytest.skip("needs unshare (util-linux)")
    probe = local_user.run([*unshare, "id", "-u"])
    if probe.returncode != 0 or probe.stdout.strip() != "0":
        pytest.skip(f"unprivileged user namespaces are not available here: {probe.stderr.strip()}")
    answer = echoed(
        local_user.run([*unshare, local_user.python, "-I", "-c", CLIENT, str(served.uds)])
    )
    assert answer["uid"] == 0  # root inside its own namespace
    assert answer["peer"]["uid"] == local_user.account.uid


def test_user_account_from_name_and_uid(local_user: LocalUser) -> None:
    account = local_user.account
    assert account.name.startswith("gpumuxtest_")
    assert account.gid in account.groups
    assert local_user.group_gid in account.groups
    assert account.shell == "/usr/sbin/nologin"
    assert UserAccount.from_uid(account.uid) == account


def test_root_account() -> None:
    root = UserAccount.from_uid(0)
    assert (root.name, root.uid, root.gid) == ("root", 0, 0)
    assert 0 in root.groups
    assert UserAccount.from_name("root") == root


def test_unknown_users_are_named_in_the_error() -> None:
    with pytest.raises(UnknownUser, match="no user named 'gpumux_no_such_user'"):
        UserAccount.from_name("gpumux_no_such_user")
    with pytest.raises(UnknownUser, match="uid 2147483000 has no account"):
        UserAccount.from_uid(2147483000)


ACL_USER_OBJ, ACL_USER, ACL_GROUP_OBJ, ACL_GROUP, ACL_MASK, ACL_OTHER = 1, 2, 4, 8, 16, 32
UNDEFINED_ID = 0xFFFFFFFF


def set_acl(
    path: Path, owner: int, named: list[tuple[int, int, int]], mask: int, other: int
) -> None:
    """Write an access ACL as setfacl would: owner, named entries, group 0, mask, other."""
    entries = [(ACL_USER_OBJ, owner, UNDEFINED_ID), *named, (ACL_GROUP_OBJ, 0, UNDEFINED_ID)]
    entries += [(ACL_MASK, mask, UNDEFINED_ID), (ACL_OTHER, other, UNDEFINED_ID)]
    entries.sort(key=lambda entry: (entry[0], entry[2]))
    blob = struct.pack("<I", 2) + b"".join(struct.pack("<HHI", *entry) for entry in entries)
    try:
        os.setxattr(path, "system.posix_acl_access", blob)
    except OSError as error:
        pytest.skip(f"this file system takes no POSIX ACL: {error}")


def make_dir(path: Path, mode: int, uid: int = 0, gid: int = 0) -> Path:
    path.mkdir()
    os.chown(path, uid, gid)
    path.chmod(mode)
    return path


# name -> (build it under the base for this user, whether the user may enter and list it)
TreeCase = tuple[Callable[[Path, LocalUser], Path], bool]

TREE: dict[str, TreeCase] = {
    "open 0755": (lambda base, user: make_dir(base / "open", 0o755), True),
    "private 0700": (lambda base, user: make_dir(base / "private", 0o700), False),
    "group 0750, user in the group": (
        lambda base, user: make_dir(base / "team", 0o750, gid=user.group_gid),
        True,
    ),
    "group 0750, user not in the group": (
        lambda base, user: make_dir(base / "others", 0o750),
        False,
    ),
    "0755 under a 0700 parent": (
        lambda base, user: make_dir(make_dir(base / "sealed", 0o700) / "inner", 0o755),
        False,
    ),
    "0711: enter, not list": (lambda base, user: make_dir(base / "blind", 0o711), False),
    "0755 under a 0711 parent": (
        lambda base, user: make_dir(make_dir(base / "pass", 0o711) / "inner", 0o755),
        True,
    ),
    "owner bits 0 rule even with group 7": (
        lambda base, user: make_dir(base / "self", 0o070, uid=user.account.uid, gid=user.group_gid),
        False,
    ),
    "symlink into a 0700 directory": (
        lambda base, user: _symlink(
            base / "link", make_dir(make_dir(base / "vault", 0o700) / "inner", 0o755)
        ),
        False,
    ),
    "0700 with an ACL for the user": (
        lambda base, user: _with_acl(
            make_dir(base / "acl_user", 0o700), [(ACL_USER, 5, user.account.uid)], mask=5
        ),
        True,
    ),
    "0700 with an ACL for the user, masked": (
        lambda base, user: _with_acl(
            make_dir(base / "acl_masked", 0o700), [(ACL_USER, 5, user.account.uid)], mask=0
        ),
        False,
    ),
    "0755 with an ACL denying the user": (
        lambda base, user: _with_acl(
            make_dir(base / "acl_deny", 0o755),
            [(ACL_USER, 0, user.account.uid)],
            mask=5,
            other=5,
        ),
        False,
    ),
    "0700 with an ACL for the user's group": (
        lambda base, user: _with_acl(
            make_dir(base / "acl_group", 0o700), [(ACL_GROUP, 5, user.group_gid)], mask=5
        ),
        True,
    ),
}


def _symlink(link: Path, target: Path) -> Path:
    link.symlink_to(target)
    return link


def _with_acl(path: Path, named: list[tuple[int, int, int]], mask: int, other: int = 0) -> Path:
    set_acl(path, owner=7, named=named, mask=mask, other=other)
    return path


@pytest.mark.parametrize("case", TREE)
def test_readable_directory_agrees_with_the_kernel(
    case: str, local_user: LocalUser, open_dir: Path
) -> None:
    base = Path(tempfile.mkdtemp(dir=open_dir, prefix="tree-"))
    base.chmod(0o755)
    try:
        build, expected = TREE[case]
        path = build(base, local_user)
        reason = readable_directory(path, local_user.account)
        kernel = local_user.run([local_user.python, "-I", "-c", LIST_AND_ENTER, str(path)])
        assert (kernel.returncode == 0) is expected, kernel.stderr
        assert (reason is None) is expected, reason
        if reason is not None:
            assert local_user.account.name in reason
    finally:
        shutil.rmtree(base)


def stranger(
    uid: int = 54321, groups: tuple[int, ...] = (54321,), name: str = "ghost"
) -> UserAccount:
    return UserAccount(
        name=name, uid=uid, gid=groups[0], groups=groups, home=Path("/"), shell="/bin/sh"
    )


def test_readable_directory_for_root_and_for_what_is_no_directory(tmp_path: Path) -> None:
    private = make_dir(tmp_path / "private", 0o700, uid=os.getuid(), gid=os.getgid())
    root = UserAccount.from_uid(0)
    assert readable_directory(private, root) is None
    assert readable_directory(tmp_path / "absent", root) == f"{tmp_path / 'absent'} does not exist"
    (tmp_path / "file").touch()
    assert readable_directory(tmp_path / "file", root) == f"{tmp_path / 'file'} is not a directory"
    # Behind a directory they cannot search, a stranger learns neither that the path is
    # missing nor what it is: only where the way is shut.
    shut = next(p for p in reversed(tmp_path.parents) if not os.stat(p).st_mode & stat.S_IXOTH)
    for hidden in (tmp_path / "absent", tmp_path / "file"):
        reason = readable_directory(hidden, stranger())
        assert reason is not None and reason.startswith(f"ghost cannot reach {hidden}: ")
        assert f"no search permission on {shut} " in reason


def test_readable_directory_names_the_blocking_directory(tmp_path: Path) -> None:
    sealed = make_dir(tmp_path / "sealed", 0o700, uid=os.getuid(), gid=os.getgid())
    inner = make_dir(sealed / "inner", 0o755, uid=os.getuid(), gid=os.getgid())
    tmp_path.chmod(0o755)
    reason = readable_directory(inner, stranger())
    assert reason is not None
    assert "ghost cannot reach" in reason
    # The first directory on the way that the stranger may not search.
    blocking = next(p for p in reversed(inner.parents) if not os.stat(p).st_mode & stat.S_IXOTH)
    assert f"no search permission on {blocking} (drwx" in reason


def test_is_admin_by_name_or_group(tmp_path: Path) -> None:
    alice, root_member = stranger(name="alice"), stranger(groups=(54321, 0))
    plain = Settings(home=tmp_path)
    assert not is_admin(alice, plain)
    assert is_admin(alice, Settings(home=tmp_path, admins="carol, alice"))
    assert not is_admin(alice, Settings(home=tmp_path, admins="alice_b,carol"))
    assert is_admin(root_member, Settings(home=tmp_path, admin_group="root"))
    assert not is_admin(alice, Settings(home=tmp_path, admin_group="root"))
    assert not is_admin(root_member, Settings(home=tmp_path, admin_group="gpumux_no_such_group"))


def test_accepted_users(tmp_path: Path) -> None:
    alice = stranger(name="alice", uid=54321)
    assert accepted(alice, Settings(home=tmp_path), daemon_uid=0) is None
    assert accepted(alice, Settings(home=tmp_path), daemon_uid=54321) is None
    assert accepted(alice, Settings(home=tmp_path, accept_users="bob, alice"), daemon_uid=0) is None
    assert accepted(alice, Settings(home=tmp_path, accept_users="bob,alice"), daemon_uid=1) is None
    reason = accepted(alice, Settings(home=tmp_path, accept_users="bob"), daemon_uid=1)
    assert reason is not None
    daemon_user = pwd.getpwuid(1).pw_name
    assert f"runs as {daemon_user} and does not serve alice" in reason
    assert "GPUMUX_ACCEPT_USERS" in reason


@pytest.mark.parametrize(
    ("header", "scheme", "expected"),
    [
        ("Bearer abc", "Bearer", "abc"),
        ("bearer  abc ", "Bearer", "abc"),
        ("BEARER abc", "bearer", "abc"),
        ("Node 3:secret", "Node", "3:secret"),
        ("Node 3:secret", "Bearer", None),
        ("Bearer", "Bearer", None),
        ("Bearer   ", "Bearer", None),
        ("Basic dXNlcjpwYXNz", "Bearer", None),
        ("", "Bearer", None),
        (None, "Bearer", None),
    ],
)
def test_an_authorization_header_gives_its_credentials_for_its_scheme_only(
    header: str | None, scheme: str, expected: str | None
) -> None:
    assert credentials(header, scheme) == expected
