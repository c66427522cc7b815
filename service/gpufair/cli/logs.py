"""Logging of `gpufair serve`: text for people, or JSON for log pipelines (`--log-format json`).

JSON is one object per line with `time` (RFC 3339, UTC), `level`, `logger` and `message`, plus the
fields a record carries: an RPC's line (`gpufair.rpc`, from `api/interceptors.py`) has `method`,
`code`, `duration_s`, and `request_id` and `pool` when its request has them; an exception adds
`exception` (the traceback as one string), so a record is never spread over several lines.
"""

from __future__ import annotations

import atexit
import json
import logging
import logging.handlers
import queue
from datetime import UTC, datetime

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


class _InProcessQueueHandler(logging.handlers.QueueHandler):
    """Hands records to the writing thread as they are: the message is rendered now (its
    arguments may change later), the traceback stays for the formatter (JSON's `exception`)."""

    def prepare(self, record: logging.LogRecord) -> logging.LogRecord:
        record.msg = record.getMessage()
        record.args = None
        return record


# The running writer thread of queued logging, if any.
_listeners: list[logging.handlers.QueueListener] = []


def setup_logging(level: str, log_format: str = "text", *, queued: bool = False) -> None:
    """With `queued` (the server), the calling thread only queues a record and one thread of
    its own formats and writes them, so RPC threads never wait on the stream or on each other
    for the line each call logs; `stop_logging` writes what is queued."""
    stop_logging()
    handler: logging.Handler = logging.StreamHandler()
    handler.setFormatter(
        JsonFormatter() if log_format == "json" else logging.Formatter(TEXT_FORMAT)
    )
    if queued:
        records: queue.SimpleQueue[logging.LogRecord] = queue.SimpleQueue()
        listener = logging.handlers.QueueListener(records, handler)
        listener.start()
        _listeners.append(listener)
        atexit.register(stop_logging)  # a return from main, not only `gpufair serve`'s own exit
        handler = _InProcessQueueHandler(records)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(getattr(logging, level.upper(), logging.INFO))
    # One line per job tick at INFO would drown the service's own lines.
    logging.getLogger("apscheduler").setLevel(logging.WARNING)
    # Python warnings (a dependency's deprecation, say) go through the same handler and format.
    logging.captureWarnings(True)


def stop_logging() -> None:
    """Write what is queued and stop the writing thread (nothing when logging is not queued)."""
    while _listeners:
        _listeners.pop().stop()
