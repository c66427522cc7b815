"""A gRPC call's deadline carried down to PostgreSQL, so a client that gave up does not leave
the database working for it.

The call's deadline lives in a context variable for as long as its handler runs (set by
`gpufair.api.interceptors.DeadlineInterceptor`). Engines made by `make_engine` read it before
each statement they send:

- on a transaction's first statement: `SET LOCAL statement_timeout` to the time left, less a
  margin (10 %, at most 1 s) and never more than the engine's own default. PostgreSQL then
  cancels a statement, or a lock wait, that would outlive the caller; the setting ends with the
  transaction. A time left within 10 % of the default is left to the default, which saves the
  round trip on most calls of clients with the usual 30 s deadline;
- on every statement: once the deadline has passed, the statement is not sent at all
  (`DeadlineExceeded`), so a transaction of many statements stops at the next one rather than
  each of them running up to the timeout.

Work with no call around it (the periodic jobs, the command line) has no deadline and keeps the
engine's default statement timeout, at no cost. Both failures reach the caller as
DEADLINE_EXCEEDED (`gpufair.api.errors`), and the transaction is rolled back: nothing of the call
is stored.
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
# Above this share of the engine's default, the default is close enough: no SET LOCAL.
KEEP_DEFAULT_ABOVE = 0.9

_deadline: ContextVar[float | None] = ContextVar("gpufair_call_deadline", default=None)
# Set on a connection when a transaction begins within a call: its first statement sets the
# timeout (then, not at BEGIN, which psycopg sends only with that first statement anyway).
_PENDING = "gpufair_deadline_pending"


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


def remaining_s() -> float | None:
    """The seconds left to the call's deadline (below 0 once past); None with no deadline."""
    deadline = _deadline.get()
    return None if deadline is None else deadline - time.monotonic()


def statement_timeout_ms(cap_ms: int) -> int | None:
    """The statement timeout for a transaction starting now: the time left less the margin,
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
    def _mark_transaction(conn: Connection) -> None:
        if _deadline.get() is not None:
            conn.info[_PENDING] = True

    @event.listens_for(engine, "before_cursor_execute")
    def _limit_statement(
        conn: Connection,
        cursor: Any,
        statement: str,
        parameters: Any,
        context: Any,
        executemany: bool,
    ) -> None:
        deadline = _deadline.get()
        if deadline is None:
            return
        if time.monotonic() >= deadline:
            raise DeadlineExceeded("the call's deadline passed; its database work was stopped")
        if not conn.info.pop(_PENDING, False):
            return
        timeout_ms = statement_timeout_ms(cap_ms)
        if timeout_ms is not None and timeout_ms < KEEP_DEFAULT_ABOVE * cap_ms:
            # Sent on the transaction's first statement's own cursor, inside SQLAlchemy's error
            # handling: a connection found dead here is invalidated like any other.
            cursor.execute(f"SET LOCAL statement_timeout = {int(timeout_ms)}")
