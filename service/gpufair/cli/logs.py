"""Logging of `gpufair serve`: text for people, or JSON for log pipelines (`--log-format json`).

JSON is one object per line with `time` (RFC 3339, UTC), `level`, `logger` and `message`, plus the
fields a record carries: an RPC's line (`gpufair.rpc`, from `api/interceptors.py`) has `method`,
`code`, `duration_s`, and `request_id` and `pool` when its request has them; an exception adds
`exception` (the traceback as one string), so a record is never spread over several lines.
"""

from __future__ import annotations

import json
import logging
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


def setup_logging(level: str, log_format: str = "text") -> None:
    handler = logging.StreamHandler()
    handler.setFormatter(
        JsonFormatter() if log_format == "json" else logging.Formatter(TEXT_FORMAT)
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(getattr(logging, level.upper(), logging.INFO))
    # One line per job tick at INFO would drown the service's own lines.
    logging.getLogger("apscheduler").setLevel(logging.WARNING)
    # Python warnings (a dependency's deprecation, say) go through the same handler and format.
    logging.captureWarnings(True)
