"""Which filesystem holds the database: mountinfo parsed as the kernel writes it, and a
database on a network filesystem refused before WAL can corrupt it."""

from __future__ import annotations

from pathlib import Path, PurePosixPath

import pytest

from gpumux.storage.dialects import mounts
from gpumux.storage.dialects.base import DatabaseError
from gpumux.storage.dialects.mounts import (
    NETWORK_FILESYSTEMS,
    mount_holding,
    parse_mountinfo,
    require_local_filesystem,
)
from gpumux.storage.engine import make_engine

# Lines as the kernel writes them: optional fields before "-", octal escapes in paths.
MOUNTINFO = """\
22 27 0:21 / /proc rw,nosuid,nodev,noexec,relatime shared:12 - proc proc rw
27 1 254:1 / / rw,relatime shared:1 - ext4 /dev/vda1 rw,discard,errors=remount-ro
61 27 0:52 / /home rw,relatime shared:30 - nfs4 files:/export/home rw,vers=4.2,hard,proto=tcp
62 61 8:17 / /home/alice/scratch rw,relatime shared:31 - xfs /dev/sdb1 rw,attr2,inode64
70 27 0:60 / /mnt/team\\040share rw,nosuid,relatime shared:40 - cifs //nas/team\\040share rw
75 27 0:65 / /mnt/remote rw,nosuid,nodev,relatime shared:45 master:3 - fuse.sshfs al@gpu1:/d rw
80 27 0:70 / /project rw,relatime shared:50 - lustre 10.0.0.1@tcp:/lfs rw,flock
81 27 8:33 / /project rw,relatime shared:51 - ext4 /dev/sdc1 rw
"""


def test_mountinfo_lines_are_parsed_with_their_escapes_and_optional_fields() -> None:
    mounts = parse_mountinfo(MOUNTINFO)
    assert [(str(m.mount_point), m.fstype, m.source) for m in mounts] == [
        ("/proc", "proc", "proc"),
        ("/", "ext4", "/dev/vda1"),
        ("/home", "nfs4", "files:/export/home"),
        ("/home/alice/scratch", "xfs", "/dev/sdb1"),
        ("/mnt/team share", "cifs", "//nas/team share"),
        ("/mnt/remote", "fuse.sshfs", "al@gpu1:/d"),
        ("/project", "lustre", "10.0.0.1@tcp:/lfs"),
        ("/project", "ext4", "/dev/sdc1"),
    ]


@pytest.mark.parametrize(
    ("path", "fstype"),
    [
        ("/home/alice/.local/share/gpumux/gpumux.db", "nfs4"),
        ("/home/alice/scratch/gpumux.db", "xfs"),
        ("/home/alice/scratchpad/gpumux.db", "nfs4"),
        ("/homework/gpumux.db", "ext4"),
        ("/mnt/team share/gpumux.db", "cifs"),
        ("/mnt/remote", "fuse.sshfs"),
        ("/project/gpumux.db", "ext4"),
        ("/var/lib/gpumux/gpumux.db", "ext4"),
    ],
)
def test_the_mount_holding_a_path_is_the_longest_mount_point_above_it_and_the_top_one(
    path: str, fstype: str
) -> None:
    mount = mount_holding(PurePosixPath(path), parse_mountinfo(MOUNTINFO))
    assert mount is not None and mount.fstype == fstype


def fake_mount(mount_point: Path, fstype: str) -> str:
    """A mountinfo text with `/` on ext4 and the given filesystem mounted at mount_point."""
    escaped = str(mount_point).replace("\\", "\\134").replace(" ", "\\040")
    return (
        "27 1 254:1 / / rw,relatime shared:1 - ext4 /dev/vda1 rw\n"
        f"90 27 0:80 / {escaped} rw,relatime shared:60 - {fstype} server:/export rw,vers=4.2\n"
    )


@pytest.mark.parametrize("fstype", sorted(NETWORK_FILESYSTEMS))
def test_a_database_on_a_network_filesystem_is_refused_with_the_reason_and_the_way_out(
    tmp_path: Path, fstype: str
) -> None:
    share = tmp_path / "team share"
    share.mkdir()
    db = share / "not-yet" / "gpumux.db"
    with pytest.raises(DatabaseError) as refused:
        require_local_filesystem(db, mountinfo=fake_mount(share.resolve(), fstype))
    message = str(refused.value)
    assert str(db) in message and f"{fstype} server:/export mounted at {share.resolve()}" in message
    assert "WAL" in message and "shared by the processes of one host" in message
    assert "GPUMUX_DB" in message and "GPUMUX_HOME" in message and "/var/lib/gpumux" in message


def test_a_path_through_a_symlink_is_checked_where_it_leads(tmp_path: Path) -> None:
    nfs = tmp_path / "nfs"
    nfs.mkdir()
    (tmp_path / "link").symlink_to(nfs)
    mountinfo = fake_mount(nfs.resolve(), "nfs")
    with pytest.raises(DatabaseError, match="nfs server:/export"):
        require_local_filesystem(tmp_path / "link" / "gpumux.db", mountinfo=mountinfo)
    require_local_filesystem(tmp_path / "local" / "gpumux.db", mountinfo=mountinfo)


def test_make_engine_refuses_a_database_on_a_network_filesystem(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_text(fake_mount(tmp_path.resolve() / "nfs", "nfs4"))
    monkeypatch.setattr(mounts, "MOUNTINFO", mountinfo)
    (tmp_path / "nfs").mkdir()
    with pytest.raises(DatabaseError, match="nfs4"):
        make_engine(f"sqlite:///{tmp_path / 'nfs' / 'gpumux.db'}")
    make_engine(f"sqlite:///{tmp_path / 'gpumux.db'}").dispose()


def test_without_a_mountinfo_file_nothing_is_checked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(mounts, "MOUNTINFO", tmp_path / "absent")
    require_local_filesystem(tmp_path / "gpumux.db")


def test_the_real_check_passes_a_database_on_this_local_disk(tmp_path: Path) -> None:
    mount = mount_holding(
        PurePosixPath(tmp_path.resolve()),
        parse_mountinfo(mounts.MOUNTINFO.read_text()),
    )
    assert mount is not None and mount.fstype not in NETWORK_FILESYSTEMS
    require_local_filesystem(tmp_path / "not-yet" / "gpumux.db")
