"""Per-engine counts of the commits this process has finished, for two readers:

- `commit_count`: every commit. `Schedule`'s gate (`api/cycle_gate.py`) lets a caller join a
  running cycle only when no commit of this process came between that cycle's first read and
  the caller's arrival, so a write the caller made (events, submissions) is never missed.
- `key_commit_count`: only commits that moved a read cache's key, for the read caches
  (`api/read_cache.py`): a reply checked before one of this process's own writes committed is
  not served after it, so a caller reads its own writes on the replica that took them at once.
  A key moves with a fair-share run or a config version (`store/read_versions.py`); their
  writers call `wrote_read_key` in the transaction. Other commits (events reported, workloads
  submitted, cycles recorded: hundreds a second under load) leave the cached replies current,
  and counting them made nearly every read after them check the database, one caller at a time
  per entry.

A commit is counted when its connection goes back to the pool, which is after the database
confirmed it and before the writing RPC replies. Commits made on the raw driver connection are
not seen; the caches' staleness bound covers them as it covers other replicas.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

from sqlalchemy import Connection, Engine, event


class CommitCount:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._count = 0

    @property
    def value(self) -> int:
        return self._count

    def bump(self) -> None:
        with self._lock:
            self._count += 1


_COUNTS: weakref.WeakKeyDictionary[Engine, tuple[CommitCount, CommitCount]] = (
    weakref.WeakKeyDictionary()
)
_GUARD = threading.Lock()
_COMMITTED = "gpufair_committed"
_KEY_COMMITTED = "gpufair_read_key_committed"
_KEY_WRITTEN = "gpufair_read_key_written"


def wrote_read_key(conn: Connection) -> None:
    """Mark `conn`'s transaction as one that moves a read cache's key: its commit is counted."""
    conn.info[_KEY_WRITTEN] = True


def commit_count(engine: Engine) -> CommitCount:
    """The engine's count of all commits, watched from the first call on."""
    return _counts(engine)[0]


def key_commit_count(engine: Engine) -> CommitCount:
    """The engine's count of commits that moved a read cache's key (`wrote_read_key`)."""
    return _counts(engine)[1]


def _counts(engine: Engine) -> tuple[CommitCount, CommitCount]:
    """Both counts of `engine` (one set of listeners per engine)."""
    with _GUARD:
        counts = _COUNTS.get(engine)
        if counts is not None:
            return counts
        counts = _COUNTS[engine] = (CommitCount(), CommitCount())
    every, keys = counts

    def committed(conn: Connection) -> None:
        conn.info[_COMMITTED] = True
        if conn.info.pop(_KEY_WRITTEN, False):
            conn.info[_KEY_COMMITTED] = True

    def rolled_back(conn: Connection) -> None:
        conn.info.pop(_KEY_WRITTEN, None)

    def checked_in(_dbapi_conn: Any, record: Any) -> None:
        if record is None:
            return
        if record.info.pop(_COMMITTED, False):
            every.bump()
        if record.info.pop(_KEY_COMMITTED, False):
            keys.bump()

    event.listen(engine, "commit", committed)
    event.listen(engine, "rollback", rolled_back)
    event.listen(engine.pool, "checkin", checked_in)
    return counts
