"""Readiness that tells the truth: gRPC health follows whether the database answers.

Every RPC but health itself needs PostgreSQL, so a replica that cannot reach it is not ready:
a probe runs `SELECT 1` every `interval_s` (and once before the server reports anything) and
sets every service's health status, the overall one (`""`) included, to `SERVING` when it
answered and `NOT_SERVING` when it did not. Load balancers and Kubernetes readiness probes
(`grpc` probe, or `grpc_health_probe`) take the replica out of rotation while the database is
away and back when it returns; the process itself stays up, so a liveness probe should not use
this status (a restart cannot bring the database back).

Graceful shutdown wins: once the server entered it, grpc's health servicer ignores later
updates, so a probe cannot turn a draining replica back to `SERVING`.

A probe that gets no answer within `timeout_s` is a failure, whatever the database does. A
refused or broken connection raises at once; a database that stops answering without refusing
(a hung host, a network path that drops packets) raises nothing, and a server-side statement
timeout never fires because the server never sees the statement. So the probe runs on a thread
of its own while the prober waits `timeout_s` for it: past that, the status is `NOT_SERVING`
and the probe's connection is shut, which ends its wait. The probe keeps one connection of its
own, outside the engine's pool: a connection waiting on a silent database cannot be told apart
from a slow one, so it must be one the prober may break (a pooled one may be another thread's
next checkout), and a pool busy with long calls is not a database that is away. While a probe
still runs (its connection attempt has its own timeout, `connect_timeout`), no second one
starts: the status stays `NOT_SERVING` until one answers.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
from collections.abc import Iterable
from typing import Any

from grpc_health.v1 import health, health_pb2
from sqlalchemy import Engine

from gpufair.store import database

log = logging.getLogger(__name__)

DEFAULT_INTERVAL_S = 5.0
DEFAULT_TIMEOUT_S = 3.0


class _Probe:
    """One `SELECT 1` on the prober's connection, on a thread of its own."""

    def __init__(self, health: DatabaseHealth) -> None:
        self.done = threading.Event()
        self.error: Exception | None = None
        self._health = health
        threading.Thread(target=self._run, name="db-health-probe", daemon=True).start()

    def _run(self) -> None:
        try:
            self._health._select_one()
        except Exception as exc:
            self.error = exc
            self._health._drop_connection()
        finally:
            self.done.set()


class DatabaseHealth:
    """Probes the database and mirrors the answer into the gRPC health statuses."""

    def __init__(
        self,
        engine: Engine,
        servicer: health.HealthServicer,
        services: Iterable[str],
        *,
        interval_s: float = DEFAULT_INTERVAL_S,
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> None:
        self.engine = engine
        self.servicer = servicer
        self.services = (*services, "")
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self._up: bool | None = None
        self._checked_at_s = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="db-health", daemon=True)
        self._probing: _Probe | None = None
        self._lock = threading.Lock()  # guards `_connection`
        self._connection: Any = None  # the probe's own psycopg connection, or None

    @property
    def up(self) -> bool:
        """Whether the database answered the last probe."""
        return bool(self._up)

    @property
    def checked_at_s(self) -> float:
        return self._checked_at_s

    def probe(self) -> bool:
        """One probe; updates the health statuses and returns whether the database answered
        within `timeout_s`."""
        probing = self._probing
        if probing is None or probing.done.is_set():
            probing = self._probing = _Probe(self)
        if probing.done.wait(self.timeout_s):
            error = probing.error
        else:
            error = TimeoutError(f"no answer within {self.timeout_s:g} s")
            self._shut_connection()
        up = error is None
        if error is not None and self._up is not False:
            log.warning("database unreachable, health NOT_SERVING: %s", _first_line(error))
        if up and self._up is False:
            log.info("database reachable again, health SERVING")
        self._up = up
        self._checked_at_s = time.time()
        status = (
            health_pb2.HealthCheckResponse.SERVING
            if up
            else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        for name in self.services:
            self.servicer.set(name, status)
        return up

    def start(self) -> None:
        self.probe()
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=self.timeout_s + 5.0)
        self._shut_connection()
        probing = self._probing
        if probing is not None:
            probing.done.wait(self.timeout_s)
        self._drop_connection()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.probe()

    def _select_one(self) -> None:
        with self._lock:
            conn = self._connection
        if conn is None:
            conn = self._connect()
            with self._lock:
                self._connection = conn
        database.ping(conn)

    def _connect(self) -> Any:
        return database.probe_connection(self.engine, self.timeout_s)

    def _shut_connection(self) -> None:
        """Wake a probe waiting on the connection: shut its socket (the descriptor stays the
        probe's to close), so the wait ends with an error instead of after TCP's own timeouts."""
        with self._lock:
            conn = self._connection
            if conn is None:
                return
            with contextlib.suppress(Exception):
                fd = conn.pgconn.socket
                with socket.socket(fileno=socket.dup(fd)) as dup:
                    dup.shutdown(socket.SHUT_RDWR)

    def _drop_connection(self) -> None:
        with self._lock:
            conn, self._connection = self._connection, None
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()


def _first_line(exc: Exception) -> str:
    return (str(exc).strip().splitlines() or [exc.__class__.__name__])[0]
