"""The trial log's rotation format: RotatingLog writes it, read_log and tail_lines read it."""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from gpumux.processes import logfiles
from gpumux.processes.logfiles import RotatingLog, piece_path, read_log, tail_lines


def write_lines(path: Path, count: int, *, max_bytes: int, keep: int) -> None:
    """Numbered lines (`line 0000`, ...) written through a RotatingLog, one write each."""
    log = RotatingLog(str(path), max_bytes=max_bytes, keep=keep)
    for number in range(count):
        log.write(f"line {number:04d}\n".encode())
    log.close()


def open_log(path: Path, count: int, *, keep: int) -> RotatingLog:
    """A RotatingLog of 120-byte pieces, still open, with `count` numbered lines written."""
    log = RotatingLog(str(path), max_bytes=120, keep=keep)
    for number in range(count):
        log.write(f"line {number:04d}\n".encode())
    return log


def pieces_oldest_first(path: Path) -> bytes:
    """What the pieces on disk hold, in the order it was written."""
    pieces = []
    piece = 0
    while os.path.exists(piece_path(path, piece)):
        pieces.append(Path(piece_path(path, piece)).read_bytes())
        piece += 1
    return b"".join(reversed(pieces))


class Follower:
    """Follows a log by offset as `gpumux logs -f` does: each ask from where the last ended."""

    def __init__(self, path: Path, *, limit: int) -> None:
        self.path, self.limit = path, limit
        self.offset, self.read, self.skipped = 0, b"", 0

    def ask(self) -> bytes:
        """Up to `limit` bytes more; what it read (the bytes it was told were dropped add up
        in `skipped`)."""
        data, start, _, skipped = read_log(self.path, self.offset, self.limit)
        self.read += data
        self.offset = start + len(data)
        self.skipped += skipped
        return data

    def read_all(self) -> bytes:
        """Asks until there is nothing more; all it read."""
        while self.ask():
            pass
        return self.read


def assert_read_whole(follower: Follower) -> None:
    """The follower reads the rest: in all the whole output of four rotations at least, byte
    for byte, told of nothing dropped."""
    follower.read_all()
    assert (follower.path.parent / "trial.log.4").exists(), "four rotations at least"
    assert follower.skipped == 0, "nothing was dropped"
    assert follower.read == pieces_oldest_first(follower.path)


def numbers(text: bytes | str) -> list[int]:
    raw = text.decode() if isinstance(text, bytes) else text
    return [int(line.split()[1]) for line in raw.splitlines() if line.startswith("line ")]


def test_log_offsets_count_the_whole_output_across_rotated_pieces(tmp_path: Path) -> None:
    log = tmp_path / "trial.log"
    (tmp_path / "trial.log.2").write_bytes(b"abc")
    (tmp_path / "trial.log.1").write_bytes(b"def")
    log.write_bytes(b"gh")
    (tmp_path / "trial.log.base").write_text('{"base": 7}')  # one byte was dropped before
    assert read_log(log, 0, 100) == (b"abc", 1, 9, 1)
    assert read_log(log, 2, 100) == (b"bc", 2, 9, 0)
    assert read_log(log, 4, 2) == (b"de", 4, 9, 0)
    assert read_log(log, 6, 100) == (b"f", 6, 9, 0)
    assert read_log(log, 7, 100) == (b"gh", 7, 9, 0)
    assert read_log(log, 9, 100) == (b"", 9, 9, 0)
    assert read_log(log, None, 100) == (b"gh", 7, 9, 0)
    assert read_log(tmp_path / "absent.log", 0, 100) == (b"", 0, 0, 0)


def test_a_log_rotated_more_than_nine_times_is_read_whole_by_offset(tmp_path: Path) -> None:
    log = tmp_path / "trial.log"
    # Ten lines fill the first piece, the rotation notice and four lines each later one:
    # eleven rotations, none dropped.
    write_lines(log, 52, max_bytes=100, keep=12)
    assert (tmp_path / "trial.log.11").exists() and not (tmp_path / "trial.log.12").exists()
    followed, offset = b"", 0
    while True:
        data, start, size, skipped = read_log(log, offset, 64)
        assert (start, skipped) == (offset, 0), "nothing was dropped, nothing is skipped"
        followed += data
        offset = start + len(data)
        if offset >= size:
            break
    assert followed == pieces_oldest_first(log)
    assert numbers(followed) == list(range(52))


def test_tail_lines_reaches_back_through_the_rotated_pieces(tmp_path: Path) -> None:
    log = tmp_path / "trial.log"
    # Pieces of one line each after their rotation notice: ten lines span five pieces.
    write_lines(log, 12, max_bytes=30, keep=6)
    written = pieces_oldest_first(log).decode().splitlines()
    tail = tail_lines(log, 10)
    assert tail.splitlines() == written[-10:]
    assert numbers(tail) == [7, 8, 9, 10, 11]
    assert tail_lines(log, 1000).splitlines() == written, "everything kept, and no more"


def test_tail_lines_of_a_missing_log_is_empty(tmp_path: Path) -> None:
    assert tail_lines(None, 5) == ""
    assert tail_lines(tmp_path / "absent.log", 5) == ""


def test_the_log_says_how_much_was_lost_once_the_disk_has_room_again(tmp_path: Path) -> None:
    log = RotatingLog(str(tmp_path / "trial.log"), max_bytes=10**9, keep=1)
    disk_fd, log.fd = log.fd, os.open("/dev/full", os.O_WRONLY)
    log.write(b"lost line\n")
    os.close(log.fd)
    log.fd = disk_fd
    log.write(b"back\n")
    log.close()
    assert (tmp_path / "trial.log").read_text() == (
        "[gpumux: 10 bytes of output lost: no space left on device]\nback\n"
    )


def test_a_rotation_that_cannot_open_a_new_piece_keeps_writing_to_the_old_one(
    tmp_path: Path,
) -> None:
    log = RotatingLog(str(tmp_path / "trial.log"), max_bytes=10, keep=1)
    (tmp_path / "trial.log.new").mkdir()  # where the new piece would be opened: EISDIR
    log.write(b"0123456789abcdef\n")
    log.write(b"more\n")
    log.close()
    assert (tmp_path / "trial.log").read_bytes() == b"0123456789abcdef\nmore\n"
    assert not (tmp_path / "trial.log.1").exists()


def test_a_follower_caught_in_a_rotation_neither_rereads_nor_skips(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A follower, as `gpumux logs -f` follows (from where each answer says it ends), reads all
    # there is after each line; at each rotation it also asks at two of its steps: once the
    # current piece is linked as .1, and once the new piece has taken its name but the count of
    # what came before it is not yet written.
    path = tmp_path / "trial.log"
    log = RotatingLog(str(path), max_bytes=120, keep=1)
    follower = Follower(path, limit=1000)
    rotation_steps = 0
    real_link, real_record = os.link, logfiles.write_json_atomically

    def link(source: str, target: str) -> None:
        nonlocal rotation_steps
        real_link(source, target)
        rotation_steps += 1
        follower.ask()

    def record(where: str, content: dict[str, int]) -> None:
        nonlocal rotation_steps
        rotation_steps += 1
        follower.ask()
        real_record(where, content)

    monkeypatch.setattr(logfiles.os, "link", link)
    monkeypatch.setattr(logfiles, "write_json_atomically", record)
    for number in range(40):
        log.write(f"line {number:04d}\n".encode())
        follower.read_all()
    monkeypatch.undo()
    log.close()
    assert rotation_steps >= 4, "two rotations at least, the first and one after it"
    assert numbers(follower.read) == list(range(40)), "every line once, in order"


@pytest.mark.parametrize("after", ["read_base", "_look"])
def test_a_rotation_between_the_look_and_the_read_hands_no_other_pieces_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, after: str
) -> None:
    # After each line a follower asks once with a whole rotation after the reader has read the
    # count of what came before the current piece (`read_base`), or after it has looked at every
    # piece (`_look`), so that the piece its offset falls in has been renamed by the open; then
    # it asks on until it has all there is. Nothing is dropped (keep is large), so what it read
    # must be the whole output, byte for byte.
    path = tmp_path / "trial.log"
    log = RotatingLog(str(path), max_bytes=10**6, keep=100)
    follower = Follower(path, limit=1000)
    real = getattr(logfiles, after)
    rotate_now = False

    def then_rotate(log_path: str) -> object:
        nonlocal rotate_now
        found = real(log_path)
        if rotate_now:
            rotate_now = False
            log.rotate()
        return found

    monkeypatch.setattr(logfiles, after, then_rotate)
    for number in range(20):
        log.write(f"line {number:04d}\n".encode())
        rotate_now = True
        follower.ask()
        follower.read_all()
    log.close()
    assert numbers(follower.read) == list(range(20))
    assert follower.read == pieces_oldest_first(path)


def test_a_follower_behind_reads_each_byte_once_at_every_step_of_a_rotation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A follower reading 7 bytes an ask, asked after each line and at each step of each
    # rotation (each rotated piece renamed to the next number; the current piece linked as
    # .1; the new piece in its place, its count not yet written), so that it is behind, in an
    # older piece, when a rotation is halfway.
    path = tmp_path / "trial.log"
    log = RotatingLog(str(path), max_bytes=120, keep=100)
    follower = Follower(path, limit=7)
    real_replace, real_link = os.replace, os.link
    real_record = logfiles.write_json_atomically

    def rename(source: str, target: str) -> None:
        real_replace(source, target)
        follower.ask()

    def link(source: str, target: str) -> None:
        real_link(source, target)
        follower.ask()

    def record(where: str, content: dict[str, int]) -> None:
        follower.ask()
        real_record(where, content)

    monkeypatch.setattr(logfiles.os, "replace", rename)
    monkeypatch.setattr(logfiles.os, "link", link)
    monkeypatch.setattr(logfiles, "write_json_atomically", record)
    for number in range(60):
        log.write(f"line {number:04d}\n".encode())
        follower.ask()
    monkeypatch.undo()
    log.close()
    assert_read_whole(follower)


def test_a_count_that_could_not_be_written_is_written_again_with_the_next_output(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The disk is full for the counts of two rotations in a row, so that the count on disk
    # names a piece keep=1 has dropped since, and then has room again. A follower reading
    # after each line reads every line once, in order, and the log's size (what the daemon
    # takes as an ended attempt's end) is what was written.
    path = tmp_path / "trial.log"
    log = RotatingLog(str(path), max_bytes=120, keep=1)
    real_record = logfiles.write_json_atomically
    full = False
    failed = 0
    follower = Follower(path, limit=1000)

    def record(where: str, content: dict[str, int]) -> None:
        nonlocal failed
        if full:
            failed += 1
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real_record(where, content)

    monkeypatch.setattr(logfiles, "write_json_atomically", record)
    for number in range(40):
        full = 20 <= number < 34
        log.write(f"line {number:04d}\n".encode())
        follower.read_all()
    assert failed >= 2, "two counts at least could not be written"
    assert numbers(follower.read) == list(range(40))
    assert read_log(path, None, 0)[2] == log.base + log.size
    log.close()


class HeldSteps:
    """`os` as logfiles sees it: while `holding`, a rotation's renames, link and unlink are held,
    and one held step (or the count's write) is done before each look at a piece's name."""

    def __init__(self) -> None:
        self.steps: list[Callable[[], None]] = []
        self.holding = False

    def __getattr__(self, name: str) -> object:
        return getattr(os, name)

    def hold(self, step: Callable[..., None], *args: object) -> None:
        def done_later() -> None:
            # As the writer does them: a piece not there is not renamed.
            with contextlib.suppress(FileNotFoundError):
                step(*args)

        if self.holding:
            self.steps.append(done_later)
        else:
            step(*args)

    def replace(self, source: str, target: str) -> None:
        self.hold(os.replace, source, target)

    def link(self, source: str, target: str) -> None:
        self.hold(os.link, source, target)

    def unlink(self, name: str) -> None:
        self.hold(os.unlink, name)

    def stat(self, name: str) -> os.stat_result:
        if self.steps:
            self.steps.pop(0)()
        return os.stat(name)


def test_a_rename_between_two_looks_at_the_pieces_reads_each_byte_at_its_offset(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Each step of each rotation (each rename, the unlink and link of .1, the swap, the count)
    # is done while a reader is halfway through a look: one step before each of its looks at a
    # name. The reader falls behind, into the older pieces (7 bytes an ask, one ask a line and
    # one a step at most). What it read must be the whole output, byte for byte.
    path = tmp_path / "trial.log"
    log = RotatingLog(str(path), max_bytes=120, keep=10)
    held = HeldSteps()
    real_record = logfiles.write_json_atomically
    follower = Follower(path, limit=7)
    monkeypatch.setattr(logfiles, "os", held)
    monkeypatch.setattr(logfiles, "write_json_atomically", lambda *a: held.hold(real_record, *a))
    for number in range(40):
        held.holding = True
        log.write(f"line {number:04d}\n".encode())
        held.holding = False
        follower.ask()
        while held.steps:
            follower.ask()
    monkeypatch.undo()
    log.close()
    assert_read_whole(follower)


def test_a_piece_renamed_up_between_two_looks_at_names_counts_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # keep=3: .1, .2 and .3 are pieces A, B and C. A rotation has renamed .2 to .3 (C is
    # dropped) and renames .1 to .2 between the reader's look at .1 and its look at .2, so it
    # finds A under both names: B's bytes must still be read at B's offsets.
    path = tmp_path / "trial.log"
    write_lines(path, 40, max_bytes=120, keep=3)
    a, b = (Path(piece_path(path, n)).read_bytes() for n in (1, 2))
    b_start = logfiles.read_base(path)[0] - len(a) - len(b)
    os.replace(piece_path(path, 2), piece_path(path, 3))
    held = HeldSteps()
    real_stat = held.stat

    def stat(name: str) -> os.stat_result:
        found = real_stat(name)
        if name == piece_path(path, 1):
            os.replace(piece_path(path, 1), piece_path(path, 2))
        return found

    held.stat = stat  # type: ignore[method-assign]
    monkeypatch.setattr(logfiles, "os", held)
    data, start, _, skipped = read_log(path, b_start + 5, 1000)
    assert (start, skipped) == (b_start + 5, 0)
    assert data == b[5:]


def test_a_rotation_after_the_count_is_read_with_no_piece_kept_is_looked_at_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # keep=0: a rotation drops the current piece whole. A follower at the log's end reads the
    # count; then the log rotates and 8 more lines come, longer than the piece it replaced.
    # What the follower gets must be the new piece's bytes from its start (or nothing yet).
    path = tmp_path / "trial.log"
    log = open_log(path, 14, keep=0)
    end = read_log(path, None, 0)[2]
    assert end == log.base + log.size > log.base > 0, "rotated once at least, with a count"
    real_read_base = logfiles.read_base
    rotated = False

    def read_base_then_rotate(log_path: str) -> tuple[int, int | None]:
        nonlocal rotated
        found = real_read_base(log_path)
        if not rotated:
            rotated = True
            log.max_bytes = 10**6  # one rotation only
            log.rotate()
            for number in range(14, 22):
                log.write(f"line {number:04d}\n".encode())
        return found

    monkeypatch.setattr(logfiles, "read_base", read_base_then_rotate)
    data, start, _, skipped = read_log(path, end, 1000)
    log.close()
    assert (start, skipped) == (end, 0)
    assert data == path.read_bytes()[: len(data)]
    assert numbers(data) == list(range(14, 22))


def test_a_tail_request_caught_in_a_rotation_on_every_look_answers_where_the_log_is_at_least(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "trial.log"
    log = open_log(path, 20, keep=2)
    real_read_base = logfiles.read_base

    def read_base_then_rotate(log_path: str) -> tuple[int, int | None]:
        found = real_read_base(log_path)
        log.write(b"more\n")
        log.rotate()
        return found

    monkeypatch.setattr(logfiles, "read_base", read_base_then_rotate)
    data, start, size, skipped = read_log(path, None, 1000)
    monkeypatch.undo()
    log.close()
    # Not 0 (the web page would then follow from the oldest piece): a place to follow from.
    assert data == b"" and skipped == 0
    assert 0 < start == size <= log.base + log.size


def test_a_count_that_could_not_be_written_at_the_last_rotation_is_written_at_close(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # keep=0: with no piece kept, only the count can say where the current piece starts.
    path = tmp_path / "trial.log"
    log = open_log(path, 10, keep=0)
    real_record = logfiles.write_json_atomically

    def full(where: str, content: dict[str, int]) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(logfiles, "write_json_atomically", full)
    log.rotate()
    monkeypatch.setattr(logfiles, "write_json_atomically", real_record)
    log.close()
    assert read_log(path, None, 0)[2] == log.base + log.size
