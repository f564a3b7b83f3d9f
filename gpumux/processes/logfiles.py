"""A trial's log and its rotation format: written here by the supervisor, read here by the daemon.

The log is a current piece (`trial.log`) and up to `log_keep` rotated ones (`trial.log.1`,
the newest, to `trial.log.<keep>`). Offsets count the whole output: `trial.log.base` records
how many bytes came before the current piece, and which piece that is (its inode), so a reader
following by offset notices a rotation instead of rereading or skipping; a count that could not
be written (a full disk) is written again with the next output and at the end. A reader may
look halfway through a rotation: it reads the count before the pieces, and again after them
with the current piece, looking again where either changed; a count written for a piece
rotated since is moved on by the pieces after it; a piece seen under two names (renamed up
between two looks, or linked as .1 and still current) counts once; a name that is another
piece's by the time it is opened reads nothing this time. The supervisor imports this module:
standard library only, and little of it.
"""

from __future__ import annotations

import contextlib
import json
import os

from gpumux.processes.rundir import Pathish, write_json_atomically

# How much of a log is served when no offset is asked for.
TAIL_BYTES = 16 * 1024
# How far back from a piece's end tail_lines looks for its lines.
TAIL_LINES_WINDOW = 64 * 1024
ROTATED_NOTICE = b"[gpumux: log rotated; the earlier output is in the .1 file]\n"


def piece_path(log_path: Pathish, piece: int) -> str:
    """Piece 0 is the current one; piece n the n-th newest rotated away."""
    return os.fspath(log_path) if piece == 0 else f"{os.fspath(log_path)}.{piece}"


def base_path(log_path: Pathish) -> str:
    """Where a rotated log records how many bytes came before its current piece."""
    return os.fspath(log_path) + ".base"


def read_base(log_path: Pathish) -> tuple[int, int | None]:
    """How many bytes of output came before the current piece (0 before any rotation), and
    the inode of the piece the count was written for (None where the record names none)."""
    try:
        with open(base_path(log_path)) as base_file:
            record = json.load(base_file)
    except (OSError, ValueError):
        return 0, None
    if not isinstance(record, dict):
        return 0, None
    base, inode = record.get("base"), record.get("inode")
    return (base if isinstance(base, int) else 0), (inode if isinstance(inode, int) else None)


class RotatingLog:
    """The trial's log: appended to, rotated at a size cap, and honest about lost output."""

    def __init__(self, path: str, *, max_bytes: int, keep: int) -> None:
        self.path = path
        self.max_bytes = max_bytes
        self.keep = keep
        self.lost = 0
        self._why_lost = ""
        self.base = 0
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        self.size = os.fstat(self.fd).st_size
        self.at_line_start = True
        # A count of what came before the current piece that could not be written (a full
        # disk): written again before the next output and at the end, so that readers heal.
        self.count_pending = False

    def write(self, data: bytes) -> None:
        if self.count_pending:
            self._write_count()
        if self.lost:
            newline = b"" if self.at_line_start else b"\n"
            notice = f"[gpumux: {self.lost} bytes of output lost: {self._why_lost}]\n".encode()
            if self._write(newline + notice) < len(newline + notice):
                self.lost += len(data)
                return
            self.lost = 0
        self.lost += len(data) - self._write(data)
        if self.size >= self.max_bytes:
            self.rotate()

    def _write(self, data: bytes) -> int:
        """Write what fits; how many bytes did."""
        view = memoryview(data)
        while view:
            try:
                written = os.write(self.fd, view)
            except OSError as error:
                # A full disk must not stop the trial: count what is lost, say so once it fits.
                self._why_lost = os.strerror(error.errno or 0).lower()
                break
            self.size += written
            self.at_line_start = view[written - 1 : written] == b"\n"
            view = view[written:]
        return len(data) - len(view)

    def rotate(self) -> None:
        """log -> log.1 -> log.2 ...; the oldest piece beyond `keep` is dropped.

        The new piece is opened first: where that fails (no inode, no quota) the log grows on
        and rotation is tried again at the next write, instead of killing this supervisor.
        """
        fresh_path = f"{self.path}.new"
        try:
            fresh = os.open(fresh_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o600)
        except OSError:
            return
        try:
            for piece in range(self.keep, 1, -1):
                with contextlib.suppress(FileNotFoundError):
                    os.replace(piece_path(self.path, piece - 1), piece_path(self.path, piece))
            if self.keep:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(piece_path(self.path, 1))
                os.link(self.path, piece_path(self.path, 1))
            # The swap is one rename: a reader always finds a current piece.
            os.replace(fresh_path, self.path)
        except OSError:
            os.close(fresh)
            with contextlib.suppress(OSError):
                os.unlink(fresh_path)
            return
        os.close(self.fd)
        self.fd = fresh
        self.base += self.size
        self._write_count()
        self.size = 0
        self._write(ROTATED_NOTICE)

    def _write_count(self) -> None:
        """Record how many bytes came before the current piece, and which piece that is."""
        try:
            record = {"base": self.base, "inode": os.fstat(self.fd).st_ino}
            write_json_atomically(base_path(self.path), record)
        except OSError:
            self.count_pending = True
            return
        self.count_pending = False

    def close(self) -> None:
        if self.count_pending:
            self._write_count()
        os.close(self.fd)


# Looks at a log's pieces, each checked against the count and the current piece read again
# after it: a rotation seen in between is looked at again; one on every look reads nothing.
LOOKS = 5


def _scan(log_path: Pathish) -> list[tuple[int, os.stat_result]]:
    """The pieces that exist, the current first, as (number, stat), up to two names missing.

    A rotation renames the pieces one at a time, oldest first: one name may be missing between
    two, and a piece renamed up between the stats of its old and its new name (or linked as .1
    and still current) is seen twice: it counts once, under the first.
    """
    found: list[tuple[int, os.stat_result]] = []
    seen: set[int] = set()
    number = missing = 0
    while number == 0 or missing < 2:
        try:
            stat = os.stat(piece_path(log_path, number))
        except FileNotFoundError:
            if number == 0:
                break
            missing += 1
        else:
            missing = 0
            if stat.st_ino not in seen:
                seen.add(stat.st_ino)
                found.append((number, stat))
        number += 1
    return found


def _look(log_path: Pathish) -> list[tuple[int, int, os.stat_result]]:
    """The pieces that exist, the current first, as (number, where it starts in the output,
    its stat); none where there is no log, or it rotated on every look.

    The count is read before the pieces, so that it is never newer than they are: where it was
    written for a piece rotated since, the pieces after that one follow it. A look is kept only
    where the count and the current piece are the same after it as before.
    """
    for _ in range(LOOKS):
        base, counted = read_base(log_path)
        found = _scan(log_path)
        if not found:
            return []
        try:
            current = os.stat(piece_path(log_path, 0)).st_ino
        except FileNotFoundError:
            continue
        if current == found[0][1].st_ino and read_base(log_path) == (base, counted):
            break
    else:
        return []
    inodes = [stat.st_ino for _, stat in found]
    if counted in inodes[1:]:
        base += sum(stat.st_size for _, stat in found[1 : inodes.index(counted) + 1])
    elif counted is None and base == 0:
        # No count yet (the first rotation's, or none could be written): the oldest piece
        # holds the output's start.
        base = sum(stat.st_size for _, stat in found[1:])
    pieces: list[tuple[int, int, os.stat_result]] = []
    start = base
    for number, stat in found:
        if pieces:
            start -= stat.st_size
        pieces.append((number, start, stat))
    return pieces


def _at_least(log_path: Pathish) -> int:
    """How long the log is at least: the count, read first, and the current piece's size."""
    base, _ = read_base(log_path)
    try:
        return base + os.stat(piece_path(log_path, 0)).st_size
    except FileNotFoundError:
        return base


def read_log(log_path: Pathish, offset: int | None, limit: int) -> tuple[bytes, int, int, int]:
    """Up to `limit` bytes of a log from `offset` (None: its tail), reading the rotated
    pieces where the offset falls in one: (data, where it starts, the log's size, bytes
    after `offset` that rotation dropped). Offsets count the whole output."""
    pieces = _look(log_path)
    if not pieces:
        # No log yet, or one rotated on every look: nothing now, nothing lost; a follower
        # asks again from where it is, a tail request from where the log is at least.
        at = _at_least(log_path) if offset is None else offset
        return b"", at, at, 0
    _, current_start, current = pieces[0]
    size = current_start + current.st_size
    if offset is not None and offset > size:
        # The log only grows: a view shorter than what a follower read is a count not written
        # yet (a full disk) for a piece no longer kept, or a log truncated by hand. Nothing
        # now: the follower asks again from where it is, not moved back to reread.
        return b"", offset, offset, 0
    asked = max(current_start, size - TAIL_BYTES) if offset is None else offset
    oldest_start = pieces[-1][1]
    skipped = max(0, oldest_start - asked)
    offset = min(max(asked, oldest_start), size)
    number, start, stat = next(piece for piece in pieces if piece[1] <= offset)
    try:
        with open(piece_path(log_path, number), "rb") as log_file:
            if os.fstat(log_file.fileno()).st_ino == stat.st_ino:
                log_file.seek(offset - start)
                return log_file.read(limit), offset, size, skipped
    except FileNotFoundError:
        pass
    # Rotated between the look and the read (the name gone, or another piece's now, whose
    # bytes at this offset are not these): nothing this time, the next ask looks again.
    return b"", asked, size, 0


def tail_lines(log_path: Pathish | None, lines: int) -> str:
    """The last lines of a log, reaching back through its rotated pieces while the newer ones
    are short, or '' when there is none."""
    if log_path is None:
        return ""
    found: list[str] = []
    piece = 0
    while len(found) < lines:
        path = piece_path(log_path, piece)
        # A missing rotated piece ends the log; a missing current one (deleted, say) still
        # lets the rotated ones speak.
        if piece > 0 and not os.path.exists(path):
            break
        found = _last_lines(path, lines - len(found)) + found
        piece += 1
    return "\n".join(found[-lines:])


def _last_lines(path: str, lines: int) -> list[str]:
    try:
        with open(path, "rb") as log_file:
            size = log_file.seek(0, os.SEEK_END)
            log_file.seek(max(0, size - TAIL_LINES_WINDOW))
            data = log_file.read()
    except OSError:
        return []
    return data.decode("utf-8", errors="replace").splitlines()[-lines:]
