"""Local accounts: who a user is on this host, and whether they may use a directory.

Read from the system's user database (NSS), so LDAP-backed accounts count as local ones.
"""

from __future__ import annotations

import errno
import grp
import logging
import os
import pwd
import stat
import struct
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

_READ, _EXECUTE = 4, 1


class UnknownUser(LookupError):
    """No account on this host has that name or uid."""


@dataclass(frozen=True)
class UserAccount:
    """A local account: the ids a process of that user runs with, and where it lives."""

    name: str
    uid: int
    gid: int
    groups: tuple[int, ...]  # every group it is in, the primary one included, sorted
    home: Path
    shell: str

    @classmethod
    def from_uid(cls, uid: int) -> UserAccount:
        """The account with this uid; UnknownUser when there is none."""
        try:
            entry = pwd.getpwuid(uid)
        except KeyError:
            raise UnknownUser(f"uid {uid} has no account on this host") from None
        return cls._from_entry(entry)

    @classmethod
    def from_name(cls, name: str) -> UserAccount:
        """The account with this name; UnknownUser when there is none."""
        try:
            entry = pwd.getpwnam(name)
        except KeyError:
            raise UnknownUser(f"no user named {name!r} on this host") from None
        return cls._from_entry(entry)

    @classmethod
    def _from_entry(cls, entry: pwd.struct_passwd) -> UserAccount:
        groups = tuple(sorted(set(os.getgrouplist(entry.pw_name, entry.pw_gid))))
        return cls(
            name=entry.pw_name,
            uid=entry.pw_uid,
            gid=entry.pw_gid,
            groups=groups,
            home=Path(entry.pw_dir),
            shell=entry.pw_shell,
        )


# POSIX ACL xattr layout (linux/posix_acl_xattr.h): a version, then (tag, perm, id) entries.
_ACL_XATTR = "system.posix_acl_access"
_ACL_HEADER = struct.Struct("<I")
_ACL_ENTRY = struct.Struct("<HHI")
_ACL_USER_OBJ = 0x01
_ACL_USER = 0x02
_ACL_GROUP_OBJ = 0x04
_ACL_GROUP = 0x08
_ACL_MASK = 0x10
_ACL_OTHER = 0x20


def _acl_entries(path: Path) -> list[tuple[int, int, int]] | None:
    """The access ACL's (tag, perm, id) entries, or None when the mode bits say it all."""
    try:
        raw = os.getxattr(path, _ACL_XATTR)
    except OSError as error:
        if error.errno not in (errno.ENODATA, errno.ENOTSUP, errno.EOPNOTSUPP):
            log.warning("%s: cannot read its ACL (%s); judging by mode bits", path, error)
        return None
    body = raw[_ACL_HEADER.size :]
    if len(raw) < _ACL_HEADER.size or len(body) % _ACL_ENTRY.size:
        log.warning("%s: malformed ACL; judging by mode bits", path)
        return None
    return list(_ACL_ENTRY.iter_unpack(body))


def _acl_grants(
    entries: list[tuple[int, int, int]], info: os.stat_result, account: UserAccount, want: int
) -> bool:
    """The access check of acl(5): owner, named user, groups (any may grant), other."""
    mask = next((perm for tag, perm, _ in entries if tag == _ACL_MASK), 7)
    if account.uid == info.st_uid:
        return any(tag == _ACL_USER_OBJ and perm & want == want for tag, perm, _ in entries)
    for tag, perm, ident in entries:
        if tag == _ACL_USER and ident == account.uid:
            return perm & mask & want == want
    matching = [
        perm & mask
        for tag, perm, ident in entries
        if (tag == _ACL_GROUP_OBJ and info.st_gid in account.groups)
        or (tag == _ACL_GROUP and ident in account.groups)
    ]
    if matching:
        return any(perm & want == want for perm in matching)
    return any(tag == _ACL_OTHER and perm & want == want for tag, perm, _ in entries)


def _grants(path: Path, info: os.stat_result, account: UserAccount, want: int) -> bool:
    """Whether the kernel would give this user `want` (rwx bits) on the file."""
    entries = _acl_entries(path)
    if entries is not None:
        return _acl_grants(entries, info, account, want)
    # Only one class applies, the first that matches: an owner is not saved by the group bits.
    if account.uid == info.st_uid:
        bits = info.st_mode >> 6
    elif info.st_gid in account.groups:
        bits = info.st_mode >> 3
    else:
        bits = info.st_mode
    return bits & want == want


def _describe(path: Path, info: os.stat_result) -> str:
    """Mode, owner and group of a file, as ls shows them."""
    try:
        owner = pwd.getpwuid(info.st_uid).pw_name
    except KeyError:
        owner = str(info.st_uid)
    try:
        group = grp.getgrgid(info.st_gid).gr_name
    except KeyError:
        group = str(info.st_gid)
    acl = "+" if _acl_entries(path) is not None else ""
    return f"{stat.filemode(info.st_mode)}{acl} {owner}:{group}"


def _ancestors(path: Path) -> list[Path]:
    """The directories a lookup of `path` passes through: every prefix, as given and resolved."""
    seen: list[Path] = []
    for route in (path, path.resolve()):
        for ancestor in reversed(route.parents):
            if ancestor not in seen:
                seen.append(ancestor)
    return seen


def readable_directory(path: str | os.PathLike[str], account: UserAccount) -> str | None:
    """None when the user may enter and list the directory, else why not.

    Judged without switching to the user: search (x) on every directory on the way, read and
    search on the directory itself, from the mode bits and POSIX access ACLs, as the kernel
    checks them; root passes any directory. NFSv4 ACLs and security modules (SELinux,
    AppArmor) are not considered.
    """
    target = Path(os.path.abspath(path))
    if account.uid != 0:
        # The way there first, as the user would walk it: what lies beyond a directory they
        # cannot search (whether the path exists, what it is) is not theirs to learn.
        for ancestor in reversed(target.parents):
            try:
                ancestor_info = ancestor.stat()
            except OSError:
                return f"{account.name} cannot reach {target}: {ancestor} is not there"
            if not stat.S_ISDIR(ancestor_info.st_mode):
                return f"{account.name} cannot reach {target}: {ancestor} is not a directory"
            if not _grants(ancestor, ancestor_info, account, _EXECUTE):
                return (
                    f"{account.name} cannot reach {target}: no search permission on {ancestor} "
                    f"({_describe(ancestor, ancestor_info)})"
                )
    try:
        info = target.stat()
    except FileNotFoundError:
        return f"{target} does not exist"
    except OSError as error:
        return f"{target} cannot be examined: {error.strerror}"
    if not stat.S_ISDIR(info.st_mode):
        return f"{target} is not a directory"
    if account.uid == 0:
        return None
    for ancestor in _ancestors(target):
        try:
            ancestor_info = ancestor.stat()
        except OSError as error:
            return f"{ancestor} cannot be examined: {error.strerror}"
        if not _grants(ancestor, ancestor_info, account, _EXECUTE):
            return (
                f"{account.name} cannot reach {target}: no search permission on {ancestor} "
                f"({_describe(ancestor, ancestor_info)})"
            )
    if not _grants(target, info, account, _READ | _EXECUTE):
        return f"{account.name} cannot enter and list {target} ({_describe(target, info)})"
    return None
