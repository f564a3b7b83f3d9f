"""GPUMUX_REPORT lines found in a trial's log as it grows, whatever the chunks, refused clearly."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from gpumux import fields
from gpumux.processes import reportlines
from gpumux.processes.reportlines import (
    MAX_LINE_BYTES,
    LineReport,
    RejectedLine,
    ReportLines,
)
from gpumux.schemas.reports import ReportIn

LOG = (
    b"Epoch 1/3\n"
    b'GPUMUX_REPORT {"step": 0, "samples": 512, "val_loss": 0.5, "note": "first"}\n'
    b"caf\xc3\xa9 \xe2\x9c\x93 loss=0.4\n"
    b'GPUMUX_REPORT {"step": 1, "val_loss": 0.41, "lr": 1e-3}\r\n'
    b'GPUMUX_REPORT {"val_\xc3\xa9": 2}\n'
    b"tail without a newline"
)
EXPECTED = [
    LineReport(step=0, samples=512.0, metrics={"val_loss": 0.5}),
    LineReport(step=1, samples=None, metrics={"val_loss": 0.41, "lr": 1e-3}),
    LineReport(step=None, samples=None, metrics={"val_é": 2.0}),
]
COMPLETE = len(LOG) - len(b"tail without a newline")


def one(line: bytes) -> LineReport | RejectedLine:
    """The single item one complete line gives."""
    fed = ReportLines().feed(line + b"\n")
    assert fed.consumed == len(line) + 1
    assert len(fed.items) == 1, fed.items
    return fed.items[0]


def reason(line: bytes) -> str:
    item = one(line)
    assert isinstance(item, RejectedLine), item
    return item.reason


def test_a_whole_log_at_once() -> None:
    lines = ReportLines()

    fed = lines.feed(LOG)

    assert fed.items == EXPECTED
    assert (fed.consumed, lines.pending) == (COMPLETE, len(LOG) - COMPLETE)


@pytest.mark.parametrize("size", [1, 2, 3, 7, 13, 14, 15, 64])
def test_any_chunking_gives_the_same_reports_and_offsets(size: int) -> None:
    # Size 1 splits every line, the prefix and each multi-byte character (é, ✓) in every place.
    lines = ReportLines()
    items = []
    consumed = 0

    for start in range(0, len(LOG), size):
        fed = lines.feed(LOG[start : start + size])
        items += fed.items
        consumed += fed.consumed
        assert consumed + lines.pending == min(start + size, len(LOG))

    assert items == EXPECTED
    assert consumed == COMPLETE


def test_a_new_parser_resumes_at_the_consumed_offset_without_reading_a_line_twice() -> None:
    first = ReportLines()
    cut = LOG.index(b"loss=0.4")  # the daemon stops in the middle of a line
    consumed = first.feed(LOG[:cut]).consumed

    resumed = ReportLines().feed(LOG[consumed:])

    assert resumed.items == EXPECTED[1:]
    assert consumed + resumed.consumed == COMPLETE


@pytest.mark.parametrize("chunk", [4096, 10**6])
def test_a_line_over_the_cap_is_skipped_to_its_end_and_said_once(chunk: int) -> None:
    lines = ReportLines()
    huge = b'GPUMUX_REPORT {"step": 1, "pad": "' + b"x" * MAX_LINE_BYTES + b'"}'
    log = b"start\n" + huge + b'\nGPUMUX_REPORT {"step": 2}\n'
    items = []
    consumed = 0

    for start in range(0, len(log), chunk):
        fed = lines.feed(log[start : start + chunk])
        items += fed.items
        consumed += fed.consumed
        assert len(lines._line) <= MAX_LINE_BYTES + 1, "never held beyond the cap"

    assert len(items) == 2 and isinstance(items[0], RejectedLine)
    assert f"longer than {MAX_LINE_BYTES} bytes; skipped to its end" in items[0].reason
    assert 'GPUMUX_REPORT {"step": 1, "pad": "xxx' in items[0].reason
    assert len(items[0].reason) < 400
    assert items[1] == LineReport(step=2, samples=None, metrics={})
    assert consumed == len(log)


def test_a_line_of_exactly_the_cap_is_read() -> None:
    head = b'GPUMUX_REPORT {"step": 4, "pad": "'
    line = head + b"x" * (MAX_LINE_BYTES - len(head) - 2) + b'"}'
    assert len(line) == MAX_LINE_BYTES

    assert one(line) == LineReport(step=4, samples=None, metrics={})


def test_other_lines_are_never_held() -> None:
    lines = ReportLines()

    fed = lines.feed(b"GPUMUX_REPORTS are fine\n" + b"progress " * 100_000)

    assert fed.items == [] and fed.consumed == len(b"GPUMUX_REPORTS are fine\n")
    assert len(lines._line) == 0 and lines.pending == len(b"progress ") * 100_000


@pytest.mark.parametrize(
    "line",
    [
        b"GPUMUX_REPORT",
        b'GPUMUX_REPORT{"step": 1}',
        b' GPUMUX_REPORT {"step": 1}',
        b'gpumux_report {"step": 1}',
        b'loss=1 GPUMUX_REPORT {"step": 1}',
    ],
)
def test_a_line_that_does_not_start_with_the_prefix_is_output_only(line: bytes) -> None:
    fed = ReportLines().feed(line + b"\n")

    assert (fed.items, fed.consumed) == ([], len(line) + 1)


@pytest.mark.parametrize(
    ("line", "why"),
    [
        (b"GPUMUX_REPORT step=3 loss=0.4", "not JSON: Expecting value"),
        (b'GPUMUX_REPORT {"step": 3', "not JSON: Expecting ',' delimiter"),
        (b"GPUMUX_REPORT ", "not JSON: Expecting value"),
        (b"GPUMUX_REPORT " + b"[" * 60_000, "not JSON: maximum recursion depth exceeded"),
        (b'GPUMUX_REPORT {"step": ' + b"9" * 5000 + b"}", "not JSON: Exceeds the limit"),
        (b"GPUMUX_REPORT [1, 2]", "a JSON list, not an object"),
        (b'GPUMUX_REPORT "loss"', "a JSON str, not an object"),
        (b"GPUMUX_REPORT 0.4", "a JSON float, not an object"),
        (b'GPUMUX_REPORT {"step": true}', '"step" must be an integer from 0 to 2147483647'),
        (b'GPUMUX_REPORT {"step": 1.0}', '"step" must be an integer'),
        (b'GPUMUX_REPORT {"step": -1}', '"step" must be an integer'),
        (b'GPUMUX_REPORT {"step": 2147483648}', '"step" must be an integer'),
        (b'GPUMUX_REPORT {"step": "3"}', '"step" must be an integer'),
        (b'GPUMUX_REPORT {"step": NaN}', '"step" must be an integer'),
        (b'GPUMUX_REPORT {"samples": -5}', '"samples" must be a finite number from 0'),
        (b'GPUMUX_REPORT {"samples": Infinity}', '"samples" must be a finite number from 0'),
        (b'GPUMUX_REPORT {"samples": NaN}', '"samples" must be a finite number from 0'),
        (b'GPUMUX_REPORT {"samples": false}', '"samples" must be a finite number from 0'),
        (b'GPUMUX_REPORT {"samples": "512"}', '"samples" must be a finite number from 0'),
        (b'GPUMUX_REPORT {"samples": 1e308}', '"samples" must be a finite number from 0 to 1e+12'),
        (b'GPUMUX_REPORT {"pool_mb": 1.5}', '"pool_mb" must be an integer from 0 to 2147483647'),
        (b'GPUMUX_REPORT {"pool_mb": -1}', '"pool_mb" must be an integer'),
        (b'GPUMUX_REPORT {"pool_mb": true}', '"pool_mb" must be an integer'),
        (b'GPUMUX_REPORT {"pool_mb": 2147483648}', '"pool_mb" must be an integer'),
        (
            b"GPUMUX_REPORT {" + b", ".join(b'"m%d": 1' % i for i in range(300)) + b"}",
            "300 metrics, over the limit of 256",
        ),
        (b'GPUMUX_REPORT {"' + b"m" * 201 + b'": 1}', "a metric's name is over 200 characters"),
        (b'GPUMUX_REPORT {"": 1}', "a metric's name is empty"),
        (b'GPUMUX_REPORT {"loss\\u0000": 1}', "a metric's name holds a NUL character"),
        (b'GPUMUX_REPORT {"loss\\ud800": 1}', "a metric's name holds a lone surrogate"),
        (b'GPUMUX_REPORT {"ok": 1, "\\udfff": "x"}', "a metric's name holds a lone surrogate"),
    ],
)
def test_a_malformed_report_line_is_rejected_with_its_reason(line: bytes, why: str) -> None:
    text = reason(line)

    assert text.startswith(f"ignored a report line ({why}")
    assert text.endswith(
        "; a report line is GPUMUX_REPORT and one JSON object on one line, "
        'e.g. GPUMUX_REPORT {"step": 3, "val_loss": 0.41}'
    )
    assert "\n" not in text and len(text) < 400


def test_the_rejection_quotes_the_line_on_one_line() -> None:
    text = reason(b'GPUMUX_REPORT {"loss": 1,\x00\t"\xff"}\r')

    # Control characters escaped, an invalid byte replaced, the carriage return left out.
    assert """: 'GPUMUX_REPORT {"loss": 1,\\x00\\t"\ufffd"}'; """ in text


def test_metrics_keep_finite_numbers_only() -> None:
    line = (
        b'GPUMUX_REPORT {"loss": 0.25, "top5": 1, "nan": NaN, "inf": -Infinity, '
        b'"big": 1e999, "huge": ' + b"9" * 400 + b', "ok": true, "opt": "adam", '
        b'"hist": [1, 2], "none": null, "nested": {"a": 1}}'
    )

    assert one(line) == LineReport(step=None, samples=None, metrics={"loss": 0.25, "top5": 1.0})


def test_step_and_samples_are_not_metrics() -> None:
    assert one(b'GPUMUX_REPORT {"step": 0, "samples": 0, "acc": 0.9}') == LineReport(
        step=0, samples=0.0, metrics={"acc": 0.9}
    )
    assert one(b'GPUMUX_REPORT {"step": null, "samples": 1.5e3}') == LineReport(
        step=None, samples=1500.0, metrics={}
    )


def test_the_frameworks_pool_is_not_a_metric() -> None:
    assert one(b'GPUMUX_REPORT {"step": 2, "pool_mb": 4096, "acc": 0.9}') == LineReport(
        step=2, samples=None, metrics={"acc": 0.9}, pool_mb=4096
    )


def test_the_bounds_of_a_line_are_those_of_a_report() -> None:
    assert (
        reportlines.MAX_STEP
        == ReportIn.model_json_schema()["properties"]["step"]["anyOf"][0]["maximum"]
    )
    assert reportlines.MAX_SAMPLES == fields.MAX_SAMPLES
    pool = ReportIn.model_json_schema()["properties"]["pool_mb"]["anyOf"][0]
    assert reportlines.MAX_POOL_MB == pool["maximum"]
    assert reportlines.MAX_METRICS == fields.MAX_METRICS
    assert reportlines.MAX_METRIC_CHARS == fields.MAX_NAME_CHARS


@pytest.mark.parametrize("name", ["", "m" * 201, "loss\ud800", "\udc00"])
def test_a_metric_name_a_report_may_not_hold_rejects_the_line(name: str) -> None:
    with pytest.raises(ValidationError):
        ReportIn(trial_id=1, attempt=1, kind="line", metrics={name: 1.0})
    line = b"GPUMUX_REPORT " + json.dumps({name: 1.0}).encode()

    assert isinstance(reportlines.parse(line), RejectedLine)
