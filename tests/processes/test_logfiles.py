"""The trial log's rotation format: RotatingLog writes it, read_log and tail_lines read it."""

from __future__ import annotations

import os
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


def pieces_oldest_first(path: Path) -> bytes:
    """What the pieces on disk hold, in the order it was written."""
    pieces = []
    piece = 0
    while os.path.exists(piece_path(path, piece)):
        pieces.append(Path(piece_path(path, piece)).read_bytes())
        piece += 1
    return b"".join(reversed(pieces))


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
    offset, followed = 0, b""
    rotation_steps = 0
    real_link, real_record = os.link, logfiles.write_json_atomically

    def ask() -> bytes:
        nonlocal offset, followed
        data, start, _, _ = read_log(path, offset, 1000)
        followed += data
        offset = start + len(data)
        return data

    def link(source: str, target: str) -> None:
        nonlocal rotation_steps
        real_link(source, target)
        rotation_steps += 1
        ask()

    def record(where: str, content: dict[str, int]) -> None:
        nonlocal rotation_steps
        rotation_steps += 1
        ask()
        real_record(where, content)

    monkeypatch.setattr(logfiles.os, "link", link)
    monkeypatch.setattr(logfiles, "write_json_atomically", record)
    for number in range(40):
        log.write(f"line {number:04d}\n".encode())
        while ask():
            pass
    monkeypatch.undo()
    log.close()
    assert rotation_steps >= 4, "two rotations at least, the first and one after it"
    assert numbers(followed) == list(range(40)), "every line once, in order"


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
    offset, followed = 0, b""
    real = getattr(logfiles, after)
    rotate_now = False

    def then_rotate(log_path: str) -> object:
        nonlocal rotate_now
        found = real(log_path)
        if rotate_now:
            rotate_now = False
            log.rotate()
        return found

    def ask() -> bytes:
        nonlocal offset, followed
        data, start, _, _ = read_log(path, offset, 1000)
        followed += data
        offset = start + len(data)
        return data

    monkeypatch.setattr(logfiles, after, then_rotate)
    for number in range(20):
        log.write(f"line {number:04d}\n".encode())
        rotate_now = True
        ask()
        while ask():
            pass
    log.close()
    assert numbers(followed) == list(range(20))
    assert followed == pieces_oldest_first(path)


def test_a_follower_behind_reads_each_byte_once_at_every_step_of_a_rotation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A follower reading 7 bytes an ask, asked after each line and at each step of each
    # rotation (each rotated piece renamed to the next number; the current piece linked as
    # .1; the new piece in its place, its count not yet written), so that it is behind, in an
    # older piece, when a rotation is halfway.
    path = tmp_path / "trial.log"
    log = RotatingLog(str(path), max_bytes=120, keep=100)
    offset, followed = 0, b""
    real_replace, real_link = os.replace, os.link
    real_record = logfiles.write_json_atomically

    def ask() -> None:
        nonlocal offset, followed
        data, start, _, skipped = read_log(path, offset, 7)
        assert skipped == 0, "nothing was dropped"
        followed += data
        offset = start + len(data)

    def rename(source: str, target: str) -> None:
        real_replace(source, target)
        ask()

    def link(source: str, target: str) -> None:
        real_link(source, target)
        ask()

    def record(where: str, content: dict[str, int]) -> None:
        ask()
        real_record(where, content)

    monkeypatch.setattr(logfiles.os, "replace", rename)
    monkeypatch.setattr(logfiles.os, "link", link)
    monkeypatch.setattr(logfiles, "write_json_atomically", record)
    for number in range(60):
        log.write(f"line {number:04d}\n".encode())
        ask()
    monkeypatch.undo()
    log.close()
    while data := read_log(path, offset, 7)[0]:
        followed += data
        offset += len(data)
    assert (path.parent / "trial.log.4").exists(), "four rotations at least"
    assert followed == pieces_oldest_first(path)
