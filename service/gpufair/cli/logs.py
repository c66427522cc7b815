"""Logging of `gpufair serve`: text for people, or JSON for log pipelines (`--log-format json`).

JSON is one object per line with `time` (RFC 3339, UTC), `level`, `logger` and `message`, plus the
fields a record carries: an RPC's line (`gpufair.rpc`, from `api/interceptors.py`) has `method`,
`code`, `duration_s`, and `request_id` and `pool` when its request has them; an exception adds
`exception` (the traceback as one string), so a record is never spread over several lines.

The server's RPC lines skip the logging module on the RPC's thread: a line is a tuple of its
fields put on the queue the writing thread reads (`RpcLines` in `api/interceptors.py`), and each
formatter renders such a tuple (`format_rpc_line`) as it renders the line's record.
"""

from __future__ import annotations

import atexit
import json
import logging
import logging.handlers
import queue
import time
from datetime import UTC, datetime
from json.encoder import encode_basestring as _quoted
from typing import Any

from gpufair.api.interceptors import RpcLine, RpcLines, RpcRecord, rpc_line_fields, rpc_line_message

LOG_FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
# The attributes every LogRecord has; anything else on a record came from `extra=`.
_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_"):
                entry[key] = value if isinstance(value, int | float | bool | None) else str(value)
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            entry["exception"] = record.exc_text
        return json.dumps(entry, ensure_ascii=False)

    def format_rpc_line(self, line: RpcLine) -> str:
        """What `format` makes of the line's `RpcRecord`, without making the record: the object
        written out as `json.dumps` writes it (its separators, `encode_basestring` for strings,
        `float.__repr__` for numbers), without its general path."""
        when = datetime.fromtimestamp(line[0], UTC).isoformat(timespec="milliseconds")
        parts = [
            f'{{"time": "{when}", "level": "info", "logger": "{RPC_LOGGER}", '
            f'"message": {_quoted(rpc_line_message(line))}'
        ]
        for key, value in rpc_line_fields(line).items():
            parts.append(f', "{key}": {_quoted(value) if isinstance(value, str) else repr(value)}')
        parts.append("}")
        return "".join(parts)


class TextFormatter(logging.Formatter):
    """`TEXT_FORMAT`, line for line what `logging.Formatter(TEXT_FORMAT)` writes, with the date
    and time of day rendered once per second rather than once per line: the writing thread of
    a server renders one line per RPC, and `time.localtime` with `strftime` per line was the
    larger part of that (`bench/results/serving.md`)."""

    def __init__(self) -> None:
        super().__init__(TEXT_FORMAT)
        # (second, its rendering); replaced whole, so a reader on any thread sees a pair.
        self._second: tuple[int, str] = (-1, "")

    def format(self, record: logging.LogRecord) -> str:
        """What `logging.Formatter.format` makes of `TEXT_FORMAT`, without its general path
        (a style object's checks and a `%` over the record's whole dict)."""
        record.message = record.getMessage()
        record.asctime = self.formatTime(record)
        line = f"{record.asctime} {record.levelname} {record.name}: {record.message}"
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            line = f"{line}\n{record.exc_text}" if line[-1:] != "\n" else line + record.exc_text
        if record.stack_info:
            line = f"{line}\n{self.formatStack(record.stack_info)}"
        return line

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:  # noqa: N802
        if datefmt is not None:
            return super().formatTime(record, datefmt)
        second = int(record.created)
        cached = self._second
        if cached[0] != second:
            cached = (second, time.strftime(self.default_time_format, self.converter(second)))
            self._second = cached
        return f"{cached[1]},{int(record.msecs):03d}"  # the default msec format, %s,%03d

    def format_rpc_line(self, line: RpcLine) -> str:
        """What `format` makes of the line's `RpcRecord`, without making the record."""
        now = line[0]
        second = int(now)
        cached = self._second
        if cached[0] != second:
            cached = (second, time.strftime(self.default_time_format, self.converter(second)))
            self._second = cached
        msecs = int((now - second) * 1000)
        return f"{cached[1]},{msecs:03d} INFO {RPC_LOGGER}: {line[1]} {line[2]} {line[3] * 1000:.1f} ms"


RPC_LOGGER = "gpufair.rpc"
_IMMUTABLE = (str, int, float, bool, type(None))


class _InProcessQueueHandler(logging.handlers.QueueHandler):
    """Hands records to the writing thread as they are: the message is rendered now when its
    arguments could change later, and left to the writing thread when they cannot (an RPC's
    line: strings and numbers); the traceback stays for the formatter (JSON's `exception`)."""

    def prepare(self, record: logging.LogRecord) -> logging.LogRecord:
        args = record.args
        if isinstance(args, tuple) and all(isinstance(a, _IMMUTABLE) for a in args):
            return record
        record.msg = record.getMessage()
        record.args = None
        return record


class _BatchWriter(logging.handlers.QueueListener):
    """The writing thread: it takes every record and RPC line waiting (up to `BATCH` at a time,
    gathered for `GATHER_S`), formats them and writes them with one write and one flush. Under load the
    RPC threads queue lines faster than one write each could keep up with, and each write lets
    go of the interpreter lock and waits to take it back, with a line's worth of work in
    between."""

    BATCH = 2048
    # Once a record arrives, how long the thread lets more gather before it writes: it then
    # wakes at most 20 times a second rather than about once per RPC, and each wake takes the
    # interpreter lock from the RPC threads and hands it back (two switches of threads, on a
    # machine whose cores are busy). A line shows at most this much later.
    GATHER_S = 0.05

    def __init__(
        self, records: queue.SimpleQueue[logging.LogRecord | RpcLine], handler: Any
    ) -> None:
        super().__init__(records, handler)
        self.records = records
        self.stream_handler = handler

    def _monitor(self) -> None:
        records, handler = self.records, self.stream_handler
        terminator = handler.terminator
        format_rpc_line = getattr(handler.formatter, "format_rpc_line", None)
        if format_rpc_line is None:  # another formatter: the line's record, formatted

            def format_rpc_line(line: RpcLine) -> str:
                return str(handler.format(RpcRecord(line)))

        full = False
        while True:
            batch = [records.get()]
            if batch[0] is not None and not full:  # more are waiting already after a full one
                time.sleep(self.GATHER_S)
            while len(batch) < self.BATCH:
                try:
                    batch.append(records.get_nowait())
                except queue.Empty:
                    break
            full = len(batch) == self.BATCH
            stop = any(r is None for r in batch)  # the sentinel `stop()` queues
            lines = []
            for record in batch:
                if record is None:
                    continue
                try:
                    if type(record) is tuple:
                        lines.append(format_rpc_line(record) + terminator)
                    else:
                        lines.append(handler.format(record) + terminator)
                except Exception:
                    handler.handleError(RpcRecord(record) if type(record) is tuple else record)
            if lines:
                try:
                    with handler.lock:
                        handler.stream.write("".join(lines))
                        handler.flush()
                except Exception:
                    last = next(r for r in reversed(batch) if r is not None)
                    handler.handleError(RpcRecord(last) if type(last) is tuple else last)
            if stop:
                return


# The running writer thread of queued logging, if any.
_listeners: list[logging.handlers.QueueListener] = []


def setup_logging(level: str, log_format: str = "text", *, queued: bool = False) -> None:
    """With `queued` (the server), the calling thread only queues a record and one thread of
    its own formats and writes them, as many as are waiting at once (`_BatchWriter`), so RPC
    threads never wait on the stream or on each other for the line each call logs;
    RPC lines reach that queue as tuples, not records (`RpcLines`); `stop_logging` writes what
    is queued."""
    stop_logging()
    handler: logging.Handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter() if log_format == "json" else TextFormatter())
    if queued:
        records: queue.SimpleQueue[logging.LogRecord | RpcLine] = queue.SimpleQueue()
        listener = _BatchWriter(records, handler)
        listener.start()
        # Neither format shows where a line was logged from, nor the thread or process that
        # logged it: no walk up the stack per record, and no lookup of the thread's and the
        # process's names (a server makes a record per RPC, on the RPC's thread).
        logging._srcfile = None
        logging.logThreads = logging.logProcesses = logging.logMultiprocessing = False
        _listeners.append(listener)
        atexit.register(stop_logging)  # a return from main, not only `gpufair serve`'s own exit
        handler = _InProcessQueueHandler(records)
        RpcLines.put, RpcLines.handlers = records.put, [handler]
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(getattr(logging, level.upper(), logging.INFO))
    # One line per job tick at INFO would drown the service's own lines.
    logging.getLogger("apscheduler").setLevel(logging.WARNING)
    # Python warnings (a dependency's deprecation, say) go through the same handler and format.
    logging.captureWarnings(True)


def stop_logging() -> None:
    """Write what is queued and stop the writing thread (nothing when logging is not queued)."""
    RpcLines.put, RpcLines.handlers = None, []
    while _listeners:
        _listeners.pop().stop()
