"""A gRPC call's deadline carried down to PostgreSQL, so a client that gave up does not leave
the database working for it.

The call's deadline lives in a context variable for as long as its handler runs (set by
`gpufair.api.interceptors.DeadlineInterceptor`). Engines made by `make_engine` read it in two
hooks:

- when a transaction begins: `SET LOCAL statement_timeout` to the time left, less a margin, and
  never more than the engine's own default; PostgreSQL then cancels a statement (or a lock wait)
  that would outlive the caller, and the setting ends with the transaction;
- before each statement: once the deadline has passed, the statement is not sent at all
  (`DeadlineExceeded`), so a transaction of many statements stops at the next one rather than
  each of them running up to the timeout.

Work with no call around it (the periodic jobs, the command line) has no deadline and keeps the
engine's default statement timeout. Both failures reach the caller as DEADLINE_EXCEEDED
(`gpufair.api.errors`), and the transaction is rolled back: nothing of the call is stored.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from contextvars import ContextVar
from typing import Any

from sqlalchemy import Connection, Engine, event

# Leave the caller some of its time to receive the reply that says why the call ended.
MARGIN_FRACTION = 0.1
MAX_MARGIN_S = 1.0

_deadline: ContextVar[float | None] = ContextVar("gpufair_call_deadline", default=None)


class DeadlineExceeded(Exception):
    """The call's deadline passed before a statement could be sent."""


@contextlib.contextmanager
def call_deadline(remaining_s: float | None) -> Iterator[None]:
    """Within this block, database work belongs to a call with `remaining_s` left (None: none)."""
    token = _deadline.set(None if remaining_s is None else time.monotonic() + remaining_s)
    try:
        yield
    finally:
        _deadline.reset(token)


def statement_timeout_ms(cap_ms: int) -> int | None:
    """The statement timeout for a transaction beginning now: the time left less the margin,
    at most `cap_ms` and at least 1 ms (0 would mean no timeout at all); None with no deadline."""
    deadline = _deadline.get()
    if deadline is None:
        return None
    left_s = deadline - time.monotonic()
    left_s -= min(MAX_MARGIN_S, max(0.0, left_s) * MARGIN_FRACTION)
    return max(1, min(cap_ms, int(left_s * 1000)))


def install(engine: Engine, cap_ms: int) -> None:
    """Make `engine`'s transactions honour the deadline of the call they run for."""

    @event.listens_for(engine, "begin")
    def _limit_transaction(conn: Connection) -> None:
        timeout_ms = statement_timeout_ms(cap_ms)
        if timeout_ms is None:
            return
        # The Connection is still beginning, so the statement goes through the driver: psycopg
        # opens the transaction with it, and SET LOCAL lasts until that transaction ends.
        driver = conn.connection.driver_connection
        assert driver is not None
        with driver.cursor() as cur:
            cur.execute(f"SET LOCAL statement_timeout = {int(timeout_ms)}")

    @event.listens_for(engine, "before_cursor_execute")
    def _refuse_when_late(
        conn: Connection,
        cursor: Any,
        statement: str,
        parameters: Any,
        context: Any,
        executemany: bool,
    ) -> None:
        deadline = _deadline.get()
        if deadline is not None and time.monotonic() >= deadline:
            raise DeadlineExceeded("the call's deadline passed; its database work was stopped")
