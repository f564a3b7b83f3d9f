"""Which filesystem holds a path, from /proc/self/mountinfo: SQLite's WAL needs a local one."""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from gpumux.storage.dialects.base import DatabaseError

log = logging.getLogger(__name__)

MOUNTINFO = Path("/proc/self/mountinfo")
# Filesystems shared between hosts (kernel fstype names, FUSE ones as "fuse.<name>"): SQLite's
# WAL index lives in shared memory (the -shm file mapped by every connection), which these
# cannot keep coherent across hosts, and their byte-range locks are unreliable.
NETWORK_FILESYSTEMS = frozenset(
    {
        "9p",
        "afs",
        "beegfs",
        "ceph",
        "cifs",
        "coda",
        "fuse.ceph",
        "fuse.ceph-fuse",
        "fuse.gcsfuse",
        "fuse.glusterfs",
        "fuse.juicefs",
        "fuse.rclone",
        "fuse.s3fs",
        "fuse.sshfs",
        "gfs2",
        "glusterfs",
        "gpfs",
        "lustre",
        "ncpfs",
        "nfs",
        "nfs4",
        "ocfs2",
        "orangefs",
        "panfs",
        "pvfs2",
        "smb3",
        "smbfs",
        "sshfs",
        "wekafs",
    }
)
_OCTAL_ESCAPE = re.compile(r"\\([0-7]{3})")


@dataclass(frozen=True)
class Mount:
    """One line of /proc/self/mountinfo: where a filesystem is mounted, its type and source."""

    mount_point: PurePosixPath
    fstype: str
    source: str


def parse_mountinfo(text: str) -> list[Mount]:
    """The mounts listed in the text of a /proc/PID/mountinfo file, in its order."""
    mounts = []
    for line in text.splitlines():
        fields = line.split()
        # ID PARENT MAJ:MIN ROOT MOUNT_POINT OPTIONS [OPTIONAL...] - FSTYPE SOURCE SUPER_OPTIONS
        if "-" not in fields[6:]:
            continue
        separator = fields.index("-", 6)
        if len(fields) < separator + 3:
            continue
        mounts.append(
            Mount(
                mount_point=PurePosixPath(_unescape(fields[4])),
                fstype=fields[separator + 1],
                source=_unescape(fields[separator + 2]),
            )
        )
    return mounts


def _unescape(field: str) -> str:
    # The kernel writes space, tab, newline and backslash as \040, \011, \012 and \134.
    return _OCTAL_ESCAPE.sub(lambda match: chr(int(match.group(1), 8)), field)


def mount_holding(path: PurePosixPath, mounts: Sequence[Mount]) -> Mount | None:
    """The mount that holds an absolute, resolved path: the longest mount point above it.

    Of mounts on one mount point, the last listed is the one on top.
    """
    holder = None
    for mount in mounts:
        if path.is_relative_to(mount.mount_point) and (
            holder is None or len(mount.mount_point.parts) >= len(holder.mount_point.parts)
        ):
            holder = mount
    return holder


def require_local_filesystem(path: Path, *, mountinfo: str | None = None) -> None:
    """Refuse a database on a network filesystem, where WAL mode cannot work.

    `mountinfo` is the text of /proc/self/mountinfo, read when not given; where there is none
    (not Linux) nothing is checked.
    """
    # A database not created yet resolves through its nearest existing directory.
    resolved = path.resolve()
    if mountinfo is None:
        try:
            mountinfo = MOUNTINFO.read_text(errors="surrogateescape")
        except OSError as error:
            log.debug("db %s: filesystem not checked: %s", path, error)
            return
    mount = mount_holding(PurePosixPath(resolved), parse_mountinfo(mountinfo))
    if mount is None or mount.fstype not in NETWORK_FILESYSTEMS:
        return
    raise DatabaseError(
        f"{path} is on a network filesystem ({mount.fstype} {mount.source} mounted at "
        f"{mount.mount_point}); SQLite's WAL mode keeps its index in memory shared by the "
        "processes of one host, so a database there can be corrupted or fail to open. "
        "Put it on a local disk: set GPUMUX_DB (--db) to a file there, or GPUMUX_HOME "
        "(--home) to a local directory such as /var/lib/gpumux"
    )
