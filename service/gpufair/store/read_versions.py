"""What the in-memory read caches (`api/read_cache.py`) compare to know they are current.

A key names the latest committed row that a read depends on, by its id and the id of the
transaction that wrote it (`xmin`): ids restart after a TRUNCATE or a restore, transaction ids do
not, so a key never matches an older state by chance. Each key is read by one indexed lookup
(a pool's latest run is its last stored, the highest id: index on pool and id).

The checks run often (every few milliseconds under load), so `KeyReader` makes each one a single
round trip on a connection of its own, in autocommit: no pool checkout, no liveness ping, no
transaction to open and close. In a busy process every round trip costs a wait for the
interpreter lock, so their number is what makes a check quick or slow.
"""

from __future__ import annotations

import threading
from typing import Any

from sqlalchemy import Connection, Engine, text

_FAIR_SHARE_KEY = """
SELECT
  (SELECT id::text || '@' || xmin::text FROM fair_share_runs
    WHERE pool = %(pool)s ORDER BY id DESC LIMIT 1),
  (SELECT version::text || '@' || xmin::text FROM config_versions ORDER BY version DESC LIMIT 1)
"""
_RUN_KEY = """
SELECT id::text || '@' || xmin::text FROM fair_share_runs
 WHERE pool = :pool ORDER BY id DESC LIMIT 1
"""
_CONFIG_KEY = (
    "SELECT version::text || '@' || xmin::text FROM config_versions ORDER BY version DESC LIMIT 1"
)


def config_key(conn: Connection) -> str | None:
    """The latest config version's key, read in the caller's transaction (the scheduling cycle
    reads it under the pool's lock, in the statement order of its snapshot)."""
    value = conn.execute(text(_CONFIG_KEY)).scalar_one_or_none()
    return None if value is None else str(value)


def fair_share_run_key(conn: Connection, pool: str) -> str | None:
    """The key of `pool`'s latest fair-share run (a run's shares are written once, with it),
    read in the caller's transaction; None before the first."""
    value = conn.execute(text(_RUN_KEY), {"pool": pool}).scalar_one_or_none()
    return None if value is None else str(value)


class KeyReader:
    """Reads the keys on a connection of its own (taken from `engine`'s pool and detached from
    it, so it has the engine's settings); one check at a time, a new connection after an error."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._lock = threading.Lock()
        self._conn: Any = None
        self.checks = 0  # how many keys it has read

    def fair_share_key(self, pool: str) -> tuple[str | None, str | None]:
        """The latest fair-share run of `pool` (the last stored, as `fairshare_repo.latest_run`)
        and the latest config version; None where there is none."""
        row = self._one(_FAIR_SHARE_KEY, {"pool": pool})
        return row[0], row[1]

    def config_key(self) -> str | None:
        """The latest config version; None before the first apply."""
        value = self._one(_CONFIG_KEY, {})
        return None if value is None else str(value[0])

    def _one(self, sql: str, params: dict[str, Any]) -> Any:
        with self._lock:
            if self._conn is None:
                proxy = self._engine.raw_connection()
                conn: Any = proxy.driver_connection
                proxy.detach()
                conn.rollback()  # the engine's connect hook may have left a transaction open
                conn.autocommit = True
                self._conn = conn
            self.checks += 1
            try:
                with self._conn.cursor() as cur:
                    cur.execute(sql, params)
                    return cur.fetchone()
            except Exception:
                self.close_locked()
                raise

    def close_locked(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()

    def close(self) -> None:
        with self._lock:
            self.close_locked()
