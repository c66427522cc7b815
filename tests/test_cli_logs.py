"""`--log-format json`: one JSON object per line, with the fields an RPC's line carries."""

from __future__ import annotations

import copy
import json
import logging
import sys

import pytest

from gpufair.cli import build_parser
from gpufair.cli.logs import TEXT_FORMAT, JsonFormatter, TextFormatter, setup_logging, stop_logging


def _record(**extra: object) -> logging.LogRecord:
    record = logging.LogRecord(
        "gpufair.rpc", logging.INFO, __file__, 1, "%s OK", ("Schedule",), None
    )
    record.__dict__.update(extra)
    return record


def test_an_rpc_line_is_one_object_with_its_fields() -> None:
    line = JsonFormatter().format(
        _record(method="Schedule", code="OK", duration_s=0.0123, request_id="r-1", pool="gpu")
    )
    assert "\n" not in line
    entry = json.loads(line)
    assert entry["message"] == "Schedule OK" and entry["logger"] == "gpufair.rpc"
    assert entry["level"] == "info" and entry["time"].endswith("+00:00")
    assert (entry["method"], entry["code"], entry["request_id"], entry["pool"]) == (
        "Schedule",
        "OK",
        "r-1",
        "gpu",
    )
    assert entry["duration_s"] == 0.0123


def test_a_traceback_stays_on_the_line() -> None:
    try:
        raise RuntimeError("disk full\nsecond line")
    except RuntimeError:
        record = logging.LogRecord(
            "gpufair.jobs",
            logging.ERROR,
            __file__,
            1,
            "job failed",
            (),
            __import__("sys").exc_info(),
        )
    line = JsonFormatter().format(record)
    assert "\n" not in line
    entry = json.loads(line)
    assert "RuntimeError: disk full\nsecond line" in entry["exception"]


def test_the_text_lines_are_the_standard_formatters() -> None:
    """`TextFormatter` renders the time once per second; its lines are those of
    `logging.Formatter(TEXT_FORMAT)` for the same records: plain, with a traceback, with a
    stack, and across a change of second."""
    try:
        raise RuntimeError("disk full")
    except RuntimeError:
        failure = sys.exc_info()
    records = []
    for second, msecs, exc_info, stack in (
        (1_764_633_600, 123, None, None),
        (1_764_633_600, 999, failure, None),
        (1_764_633_601, 4, None, "Stack (most recent call last):\n  here"),
        (1_764_633_599, 500, failure, "Stack"),
    ):
        record = logging.LogRecord(
            "gpufair.rpc", logging.INFO, __file__, 1, "%s %s %.1f ms", ("Schedule", "OK", 1.25),
            exc_info, sinfo=stack,
        )  # fmt: skip
        record.created, record.msecs = second + msecs / 1000, msecs
        records.append(record)
    fast, standard = TextFormatter(), logging.Formatter(TEXT_FORMAT)
    lines = [fast.format(copy.copy(r)) for r in records]
    assert lines == [standard.format(copy.copy(r)) for r in records]
    assert lines[0].endswith(",123 INFO gpufair.rpc: Schedule OK 1.2 ms")
    assert "RuntimeError: disk full" in lines[1]


def test_serve_takes_the_log_format() -> None:
    args = build_parser().parse_args(["serve", "--log-format", "json"])
    assert args.log_format == "json"
    assert build_parser().parse_args(["serve"]).log_format == "text"


def test_queued_lines_are_written_whole_in_order_with_their_arguments_as_logged(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The server's logging (`queued`): a thread of its own writes what RPC threads queued, in
    batches; every line arrives once, in order, and a mutable argument shows as it was when
    the line was logged."""
    root = logging.getLogger()
    saved = (root.handlers[:], root.level, logging._srcfile)
    try:
        setup_logging("info", "json", queued=True)
        log = logging.getLogger("gpufair.rpc")
        seen: list[str] = []
        for n in range(2000):
            log.info("call %d %s %.1f ms", n, "OK", n / 10, extra={"method": "GetFairShare"})
        log.info("seen %s", seen)
        seen.append("later")  # changed after the line was logged
        stop_logging()
        lines = [json.loads(line) for line in capsys.readouterr().err.splitlines()]
    finally:
        stop_logging()
        root.handlers[:], logging._srcfile = saved[0], saved[2]
        root.setLevel(saved[1])
    assert [e["message"] for e in lines[:2000]] == [
        f"call {n} OK {n / 10:.1f} ms" for n in range(2000)
    ]
    assert {e["method"] for e in lines[:2000]} == {"GetFairShare"}
    assert lines[2000]["message"] == "seen []"
    assert len(lines) == 2001
