"""`--log-format json`: one JSON object per line, with the fields an RPC's line carries."""

from __future__ import annotations

import json
import logging

from gpufair.cli import build_parser
from gpufair.cli.logs import JsonFormatter


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


def test_serve_takes_the_log_format() -> None:
    args = build_parser().parse_args(["serve", "--log-format", "json"])
    assert args.log_format == "json"
    assert build_parser().parse_args(["serve"]).log_format == "text"
