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

A probe that does not finish within `timeout_s` counts as a failure: the connection attempt has
its own timeout (`store/database.py`), and the statement runs under a statement timeout.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable

from grpc_health.v1 import health, health_pb2
from sqlalchemy import Engine

from gpufair.store import database

log = logging.getLogger(__name__)

DEFAULT_INTERVAL_S = 5.0
DEFAULT_TIMEOUT_S = 3.0


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

    @property
    def up(self) -> bool:
        """Whether the database answered the last probe."""
        return bool(self._up)

    @property
    def checked_at_s(self) -> float:
        return self._checked_at_s

    def probe(self) -> bool:
        """One probe; updates the health statuses and returns whether the database answered."""
        try:
            with self.engine.connect() as conn:
                database.ping(conn, self.timeout_s)
                conn.rollback()
            up = True
        except Exception as exc:
            if self._up is not False:
                log.warning("database unreachable, health NOT_SERVING: %s", _first_line(exc))
            up = False
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

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.probe()


def _first_line(exc: Exception) -> str:
    return (str(exc).strip().splitlines() or [exc.__class__.__name__])[0]
