"""Every wait of an engine's connections on the database is bounded, also when the database stops
answering without refusing anything.

A database host that hangs, or a network path that drops packets, sends no error: a connection
waiting for its answer waits on its socket until TCP gives up (many minutes; never, when the
host's kernel still acknowledges the bytes). The server-side timeouts (`statement_timeout`, the
call's deadline as `SET LOCAL`, `store/deadline.py`) cannot fire, because the server never sees
the statement. So an RPC handler waited for minutes with its thread and its pooled connection,
while health, on a connection of its own, said NOT_SERVING within 3 s (`api/health.py`).

`install` wraps the engine's dialect where it waits on the database: statements (`do_execute`,
`do_executemany`, `do_execute_no_params`), commits and rollbacks (the pool's reset on return
included), and the pool's pre-ping (`do_ping`). Each wait is registered with one watchdog thread
and a due time; past the due time, a wait still in progress has its connection's socket shut (as
health does to its probe's): the wait ends with `psycopg.OperationalError` ("the database did not
answer within ..."), the connection is broken and the pool drops it, and the call answers
UNAVAILABLE (`api/errors.py`). The due time:

- a statement, commit or rollback: the engine's statement timeout plus `GRACE_S` (a server that
  answers cancels the statement itself before then), or, within a gRPC call with a deadline, the
  deadline plus `GRACE_S`, whichever comes first;
- a pre-ping (`SELECT 1` on a pooled connection before its checkout): `PING_S`, or the call's
  deadline plus `GRACE_S` if sooner. The fresh connection the pool then makes is bounded by
  libpq's `connect_timeout` (`database.make_engine`);
- a wait the code means to be long (a periodic recompute waiting for another process's rollup,
  `jobs/runner.py`) raises the bound for its thread with `allow`.

The kernel's own means serve beside it where packets are really dropped: the engine's
connections use TCP keepalives and `tcp_user_timeout` (`database.make_engine`; libpq ignores
both on a Unix socket). Reads of a server-side cursor after its statement are not bounded here
(gpufair uses none).
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from typing import Any

import psycopg
from sqlalchemy import Engine

from gpufair.store import deadline

log = logging.getLogger(__name__)

GRACE_S = 2.0  # past a server-side timeout, or the call's deadline, before the socket is shut
PING_S = 5.0  # a pre-ping's `SELECT 1`
POLL_S = 0.5  # how often the watchdog looks (a wait ends at most this much past its bound)

_allowed_s: ContextVar[float | None] = ContextVar("gpufair_stall_allowed_s", default=None)


@contextlib.contextmanager
def allow(seconds: float) -> Iterator[None]:
    """Within this block, this thread's waits on the database may last `seconds` (plus
    `GRACE_S`) before they count as a database that stopped answering."""
    token = _allowed_s.set(seconds)
    try:
        yield
    finally:
        _allowed_s.reset(token)


class _Wait:
    __slots__ = ("bound_s", "dbapi_conn", "fired")

    def __init__(self, dbapi_conn: Any, bound_s: float) -> None:
        self.dbapi_conn = dbapi_conn
        self.bound_s = bound_s
        self.fired = False


class _Watchdog:
    """One thread for the process: every `POLL_S` it shuts the socket of each wait still in
    progress past its due time. The waits in progress are few (one per connection in use), and
    registering one is a dict entry under a lock: no wake-up per statement."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._due: dict[_Wait, float] = {}
        self._thread: threading.Thread | None = None

    def begin(self, dbapi_conn: Any, bound_s: float) -> _Wait:
        wait = _Wait(dbapi_conn, bound_s)
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="db-stall", daemon=True)
                self._thread.start()
            self._due[wait] = time.monotonic() + bound_s
        return wait

    def end(self, wait: _Wait) -> None:
        with self._lock:  # after this, the watchdog no longer touches the connection
            self._due.pop(wait, None)

    @contextlib.contextmanager
    def watch(self, dbapi_conn: Any, bound_s: float) -> Iterator[_Wait]:
        wait = self.begin(dbapi_conn, bound_s)
        try:
            yield wait
        finally:
            self.end(wait)

    def _run(self) -> None:
        while True:
            time.sleep(POLL_S)
            now_s = time.monotonic()
            with self._lock:
                late = [wait for wait, due_s in self._due.items() if due_s <= now_s]
                for wait in late:
                    del self._due[wait]
                    wait.fired = True
                    _shut(wait.dbapi_conn)
            for wait in late:
                log.warning(
                    "the database did not answer within %.1f s: connection dropped", wait.bound_s
                )


_watchdog = _Watchdog()


def _shut(dbapi_conn: Any) -> None:
    """Shut the connection's socket (the descriptor stays the connection's to close): its wait
    ends with an error instead of after TCP's own timeouts."""
    with (
        contextlib.suppress(Exception),
        socket.socket(fileno=socket.dup(dbapi_conn.pgconn.socket)) as dup,
    ):
        dup.shutdown(socket.SHUT_RDWR)


def bound_s(default_s: float) -> float:
    """How long a wait starting now may last: `default_s` (or what `allow` gives this thread),
    cut to the call's deadline plus `GRACE_S` within a call that has one."""
    allowed = _allowed_s.get()
    limit = default_s if allowed is None else max(default_s, allowed + GRACE_S)
    left = deadline.remaining_s()
    if left is not None:
        limit = min(limit, max(0.0, left) + GRACE_S)
    return limit


def _guarded(method: Callable[..., Any], default_s: float, conn_of: Callable[..., Any]) -> Any:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        dbapi_conn = conn_of(*args)
        wait = _watchdog.begin(dbapi_conn, bound_s(default_s))
        try:
            return method(*args, **kwargs)
        except psycopg.Error as error:
            if not wait.fired:
                raise
            with contextlib.suppress(Exception):
                dbapi_conn.close()  # broken: the pool's invalidation finds it so
            raise psycopg.OperationalError(
                f"the database did not answer within {wait.bound_s:.1f} s "
                "(no error, no answer: a hung host or a lost network path); "
                "the connection was dropped"
            ) from error
        finally:
            _watchdog.end(wait)

    return wrapper


def install(engine: Engine, statement_timeout_ms: int) -> None:
    """Bound the waits of `engine`'s connections (this engine's dialect only)."""
    dialect = engine.dialect
    statement_s = statement_timeout_ms / 1000 + GRACE_S

    def of_cursor(cursor: Any, *_: Any) -> Any:
        return cursor.connection

    def of_conn(conn: Any, *_: Any) -> Any:
        # The pool's reset on return passes its proxy of the connection.
        return getattr(conn, "dbapi_connection", conn)

    for name in ("do_execute", "do_executemany", "do_execute_no_params"):
        setattr(dialect, name, _guarded(getattr(dialect, name), statement_s, of_cursor))
    for name in ("do_commit", "do_rollback"):
        setattr(dialect, name, _guarded(getattr(dialect, name), statement_s, of_conn))
    dialect.do_ping = _guarded(dialect.do_ping, PING_S, of_conn)  # type: ignore[method-assign]


def watch_connect(dbapi_conn: Any) -> contextlib.AbstractContextManager[_Wait]:
    """Bound a new connection's own set-up statements as a pre-ping is bounded."""
    return _watchdog.watch(dbapi_conn, bound_s(PING_S))
