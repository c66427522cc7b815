"""Forcing two transactions into one order in a test: one side is parked on a lock (a lock the
test holds, or the other side's), and the test goes on only once PostgreSQL shows it waiting."""

from __future__ import annotations

import time
from collections.abc import Callable

from sqlalchemy import Engine, text


def waiting_on_locks(db: Engine, event: str | None = None) -> int:
    """Backends of this test's database waiting for a lock another transaction holds (of kind
    `event`, if given: 'advisory' for an advisory key, 'tuple' or 'transactionid' for a row)."""
    with db.connect() as conn:
        return conn.execute(
            text(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND wait_event_type = 'Lock' AND (CAST(:event AS text) IS NULL "
                "OR wait_event = :event)"
            ),
            {"event": event},
        ).scalar_one()


def until(check: Callable[[], bool], what: str, timeout_s: float = 20.0) -> None:
    """Poll `check` every 20 ms; fail with `what` if it is still false after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)
