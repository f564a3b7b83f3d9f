"""A trial's log and its rotation format: written here by the supervisor, read here by the daemon.

The log is a current piece (`trial.log`) and up to `log_keep` rotated ones (`trial.log.1`,
the newest, to `trial.log.<keep>`). Offsets count the whole output: `trial.log.base` records
how many bytes came before the current piece, so a reader following by offset notices a
rotation instead of rereading or skipping. The supervisor imports this module: standard
library only, and little of it.
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


def read_base(log_path: Pathish) -> int:
    """How many bytes of output came before the current piece (0 before any rotation)."""
    try:
        with open(base_path(log_path)) as base_file:
            record = json.load(base_file)
    except (OSError, ValueError):
        return 0
    base = record.get("base") if isinstance(record, dict) else None
    return base if isinstance(base, int) else 0


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

    def write(self, data: bytes) -> None:
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
        with contextlib.suppress(OSError):
            write_json_atomically(base_path(self.path), {"base": self.base})
        self.size = 0
        self._write(ROTATED_NOTICE)

    def close(self) -> None:
        os.close(self.fd)


def _piece_sizes(log_path: Pathish) -> list[int]:
    """The sizes of the pieces that exist, the current first, up to the first one missing."""
    sizes: list[int] = []
    while True:
        try:
            sizes.append(os.stat(piece_path(log_path, len(sizes))).st_size)
        except FileNotFoundError:
            return sizes


def read_log(log_path: Pathish, offset: int | None, limit: int) -> tuple[bytes, int, int, int]:
    """Up to `limit` bytes of a log from `offset` (None: its tail), reading the rotated
    pieces where the offset falls in one: (data, where it starts, the log's size, bytes
    after `offset` that rotation dropped). Offsets count the whole output."""
    sizes = _piece_sizes(log_path)
    if not sizes:
        # Caught in a rotation's renames (or no log yet): nothing now, nothing lost; a
        # follower asks again from where it is.
        return b"", offset or 0, offset or 0, 0
    starts = [read_base(log_path)]
    for piece_size in sizes[1:]:
        starts.append(starts[-1] - piece_size)
    size = starts[0] + sizes[0]
    if offset is not None and offset > size:
        # The log only grows: a view shorter than what a follower read is one caught in a
        # rotation, the new piece in place before the count of what came before it. Nothing
        # now: the follower asks again from where it is, where the view would have moved it
        # back to reread a piece's worth.
        return b"", offset, offset, 0
    if offset is None:
        offset = max(starts[0], size - TAIL_BYTES)
    skipped = max(0, starts[-1] - offset)
    offset = min(max(offset, starts[-1]), size)
    piece = next(n for n, piece_start in enumerate(starts) if piece_start <= offset)
    try:
        with open(piece_path(log_path, piece), "rb") as log_file:
            log_file.seek(offset - starts[piece])
            return log_file.read(limit), offset, size, skipped
    except FileNotFoundError:
        # Rotated between the look and the read: nothing this time, the next ask finds it.
        return b"", offset, size, skipped


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
