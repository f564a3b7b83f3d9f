"""The one rule for text gpumux shows of what it was given: cut short, escaped, one line."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from gpumux.text import ELLIPSIS, cut, escaped, first_line, quoted


@given(st.text(), st.integers(min_value=0, max_value=200))
def test_cut_keeps_the_start_and_says_where_it_cut(text: str, limit: int) -> None:
    shown = cut(text, limit)
    if len(text) <= limit:
        assert shown == text
    else:
        assert shown == text[:limit] + ELLIPSIS


@given(st.text(), st.integers(min_value=1, max_value=200))
def test_escaped_text_is_one_printable_line_that_reads_back_as_the_start(
    text: str, limit: int
) -> None:
    shown = escaped(text, limit)
    assert shown.isprintable()
    # Printable characters stay as they are: a name in any script reads as it was written.
    kept = cut(text, limit)
    if kept.isprintable():
        assert shown == kept


def test_a_line_break_or_an_escape_sequence_cannot_forge_a_line() -> None:
    assert escaped("ok\nERROR forged\x1b[2J", 64) == "ok\\nERROR forged\\x1b[2J"


def test_quoted_is_the_repr_of_the_cut_text() -> None:
    assert quoted("lr", 60) == "'lr'"
    assert quoted("x" * 61, 60) == repr("x" * 60 + ELLIPSIS)
    assert quoted("a'b\n", 60) == repr("a'b\n")


def test_first_line_is_what_another_program_says_first() -> None:
    assert first_line("\n  bad value for x\nTraceback ...\n", 80) == "bad value for x"
    assert first_line("", 80) == ""
    assert first_line("y" * 100, 10) == "y" * 10 + ELLIPSIS
