"""`--log-format json`: one JSON object per line, with the fields an RPC's line carries."""

from __future__ import annotations

import copy
import json
import logging
import sys

import grpc
import pytest

from gpufair.api.interceptors import Layers, MetricsInterceptor, RpcLine, RpcLines, RpcRecord
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


def _lines() -> list[RpcLine]:
    """RPC lines across the edges their rendering has: a change of second, a fraction just
    under a whole millisecond, request fields absent, empty, not strings, longer than 200
    characters, and with quotes, a newline and characters beyond ASCII."""
    lines: list[RpcLine] = []
    for n, now in enumerate((1_764_633_600.0, 1_764_633_600.9999, 1_764_633_601.0005)):
        for request_id, pool in (
            ("r-1", "gpu"),
            (None, None),
            ("", "a100"),
            (7, "x" * 300),
            ('say "hi"\nthen ünïcode ✓', "\\pool"),
        ):
            lines.append((now, "GetFairShare", "OK", 0.00123 * (n + 1), request_id, pool))
    lines.append((1_764_633_602.25, "Schedule", "DEADLINE_EXCEEDED", 12.5, "r", None))
    return lines


def test_an_rpc_line_renders_as_its_record_in_both_formats() -> None:
    """The writing thread renders an RPC line from its tuple (`format_rpc_line`); the text is
    what `logging.Formatter(TEXT_FORMAT)` makes of the line's `RpcRecord`, and the JSON is what
    `JsonFormatter` makes of it, character for character."""
    text, as_json, standard = TextFormatter(), JsonFormatter(), logging.Formatter(TEXT_FORMAT)
    for line in _lines():
        assert text.format_rpc_line(line) == standard.format(RpcRecord(line))
        assert as_json.format_rpc_line(line) == as_json.format(RpcRecord(line))
    entry = json.loads(as_json.format_rpc_line(_lines()[4]))
    assert entry["request_id"] == 'say "hi"\nthen ünïcode ✓' and entry["pool"] == "\\pool"
    assert entry["message"] == "GetFairShare OK 1.2 ms" and entry["duration_s"] == 0.00123
    long_pool = json.loads(as_json.format_rpc_line(_lines()[3]))
    assert "request_id" not in long_pool and len(long_pool["pool"]) == 200
    assert text.format_rpc_line(_lines()[5]).endswith(
        ",999 INFO gpufair.rpc: GetFairShare OK 2.5 ms"
    )


class _Request:
    request_id, pool = "r-9", "gpu"


class _Details:
    method = "/gpufair.v1.Ledger/GetFairShare"
    invocation_metadata = ()


@pytest.mark.parametrize("log_format", ["text", "json"])
def test_the_servers_rpc_lines_are_written_from_tuples_in_order_with_other_lines(
    log_format: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """With the server's logging, an RPC's line reaches the writing thread as a tuple
    (`RpcLines`), in one queue with the other lines: 3,000 calls and a line logged after every
    1,000th come out whole and in order, each RPC line as its record would render; while
    `gpufair.rpc` has a handler of its own, the line is a record again, seen by that handler
    and still written."""
    root = logging.getLogger()
    saved = (root.handlers[:], root.level, logging._srcfile)
    handler = grpc.unary_unary_rpc_method_handler(lambda request, context: "reply")
    call = Layers([MetricsInterceptor()]).intercept_service(lambda d: handler, _Details())
    queued: list[RpcLine] = []
    seen: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record)

    try:
        setup_logging("info", log_format, queued=True)
        put = RpcLines.put
        assert put is not None

        def keep_and_put(line: RpcLine) -> None:
            queued.append(line)
            put(line)

        RpcLines.put = keep_and_put
        for n in range(3000):
            assert call.unary_unary(_Request(), None) == "reply"
            if n % 1000 == 999:
                logging.getLogger("gpufair.jobs").info("after call %d", n)
        keep = Keep()
        rpc_log = logging.getLogger("gpufair.rpc")
        rpc_log.addHandler(keep)
        try:
            call.unary_unary(_Request(), None)
        finally:
            rpc_log.removeHandler(keep)
        stop_logging()
        assert RpcLines.put is None
        written = capsys.readouterr().err.splitlines()
    finally:
        stop_logging()
        root.handlers[:], logging._srcfile = saved[0], saved[2]
        root.setLevel(saved[1])
    assert len(queued) == 3000 and {line[1:3] + line[4:] for line in queued} == {
        ("GetFairShare", "OK", "r-9", "gpu")
    }
    formatter = JsonFormatter() if log_format == "json" else TextFormatter()
    expected = [formatter.format(RpcRecord(line)) for line in queued]
    for n in (2, 1, 0):
        expected.insert(1000 * (n + 1), f"after call {n * 1000 + 999}")
    [record] = seen
    assert isinstance(record, RpcRecord) and record.pool == "gpu"
    assert len(written) == 3004
    for got, want in zip(written[:3003], expected, strict=True):
        if want.startswith("after call"):
            assert want in got and "gpufair.jobs" in got
        else:
            assert got == want
    assert written[3003] == formatter.format(record)
