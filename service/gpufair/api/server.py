"""The gRPC server: services, health (following the database, `api/health.py`), reflection,
error mapping, graceful shutdown, and the state gauges for a metrics registry."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from concurrent import futures
from dataclasses import dataclass
from typing import Any, cast

import grpc
from grpc_health.v1 import health, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from prometheus_client import CollectorRegistry
from sqlalchemy import Engine

from gpufair.api.cluster_admin import ClusterAdminServicer
from gpufair.api.health import DEFAULT_INTERVAL_S, DatabaseHealth
from gpufair.api.interceptors import (
    DeadlineInterceptor,
    ErrorMappingInterceptor,
    Layer,
    Layers,
    MetricsInterceptor,
    SharedReplyInterceptor,
    WorkSlotInterceptor,
)
from gpufair.api.ledger import LedgerServicer, add_ledger_to_server
from gpufair.api.read_cache import DEFAULT_STALENESS_S, ReadCache
from gpufair.api.rpc_threads import RpcThreads
from gpufair.api.scheduler import SchedulerServicer
from gpufair.api.state_metrics import StateCollector
from gpufair.api.work_slots import DEFAULT_WAITERS, WorkSlots
from gpufair.domain.limits import MAX_MESSAGE_BYTES
from gpufair.store.commit_watch import KeyNotices, key_commit_count, key_notices
from gpufair.store.read_versions import KeyReader
from gpufair.store.schedule_repo import DEFAULT_BIND_TIMEOUT_S
from gpufair.v1 import (
    cluster_pb2,
    cluster_pb2_grpc,
    ledger_pb2,
    scheduler_pb2,
    scheduler_pb2_grpc,
)

log = logging.getLogger(__name__)

SERVICE_NAMES = (
    cluster_pb2.DESCRIPTOR.services_by_name["ClusterAdmin"].full_name,
    scheduler_pb2.DESCRIPTOR.services_by_name["Scheduler"].full_name,
    ledger_pb2.DESCRIPTOR.services_by_name["Ledger"].full_name,
)
DEFAULT_GRACE_S = 10.0
# Methods whose reply object is shared by many calls, encoded once (`SharedReplyInterceptor`): a
# coalesced cycle's, and the read caches' (`api/read_cache.py`) until the entry is rebuilt.
SHARED_REPLIES = frozenset(
    {
        "/gpufair.v1.Scheduler/Schedule",
        "/gpufair.v1.Ledger/GetFairShare",
        "/gpufair.v1.ClusterAdmin/GetConfig",
    }
)
# How long past the grace period `stop` waits for grpc to finish cancelling calls.
SHUTDOWN_MARGIN_S = 5.0


@dataclass
class RunningServer:
    server: grpc.Server
    port: int
    health: health.HealthServicer
    database_health: DatabaseHealth
    keys: KeyReader
    notices: KeyNotices | None = None
    caches: tuple[ReadCache[Any, Any], ...] = ()
    slots: WorkSlots | None = None  # what the RPCs that work hold (`api/work_slots.py`)
    threads: RpcThreads | None = None  # what the calls run on (`api/rpc_threads.py`)

    def stop(self, grace_s: float = DEFAULT_GRACE_S) -> bool:
        """Report NOT_SERVING first, so load balancers drain, then finish in-flight calls; calls
        still running after `grace_s` are cancelled.

        Bounded: returns False when grpc has not finished within `grace_s + SHUTDOWN_MARGIN_S`.
        That happens: after a client stream sent a message grpc could not deserialize, grpc's
        shutdown was seen never to complete. Nothing acknowledged depends on it (a reply is sent
        only after its commit), so the process exits anyway (`gpufair serve`)."""
        self.health.enter_graceful_shutdown()
        self.database_health.stop()
        done = self.server.stop(grace_s).wait(timeout=grace_s + SHUTDOWN_MARGIN_S)
        if self.threads is not None:
            self.threads.shutdown()
        for cache in self.caches:
            cache.close()
        self.keys.close()
        if self.notices is not None:
            self.notices.close()
        return done


def build_server(
    engine: Engine,
    address: str = "127.0.0.1:50051",
    *,
    max_workers: int = 32,
    schedule_waiters: int = DEFAULT_WAITERS,
    clock: Callable[[], float] = time.time,
    interceptors_extra: Sequence[grpc.ServerInterceptor[Any, Any]] = (),
    credentials: grpc.ServerCredentials | None = None,
    metrics_registry: CollectorRegistry | None = None,
    health_interval_s: float = DEFAULT_INTERVAL_S,
    read_staleness_s: float = DEFAULT_STALENESS_S,
    reuse_port: bool = False,
    bind_timeout_s: float = DEFAULT_BIND_TIMEOUT_S,
) -> RunningServer:
    """Start serving; `clock` is the one instant source of every servicer (tests pin it).

    Health is `SERVING` only while the database answers its probe, every `health_interval_s`
    (`api/health.py`). With `metrics_registry`, the state gauges read from the database at scrape
    time (`api/state_metrics.py`) are registered there; one registry per process holds them once.

    GetFairShare and GetConfig answer from memory (`api/read_cache.py`): what this process
    commits shows here at once, what another process commits when its notification arrives
    (`store/commit_watch.py`), and within `read_staleness_s` even if notifications stop. With
    `reuse_port`, several processes listen on one port (SO_REUSEPORT; `gpufair serve
    --processes`), and the kernel spreads connections over them.

    `max_workers` RPCs work at once; `schedule_waiters` more threads let `Schedule` callers wait
    for a shared cycle without a work slot (`api/work_slots.py`). The calls run on
    `api/rpc_threads.py`'s threads, started as calls arrive.

    A placement `Schedule` hands out is released when no `started` event confirmed it within
    `bind_timeout_s` (`store/schedule_repo.py`; `gpufair serve --bind-timeout-s`).

    `interceptors_extra` run between metrics and the call's deadline (outside) and error mapping
    (inside), e.g. the auth interceptor; with `credentials` the port speaks TLS, else plaintext.
    When every interceptor is a `Layer` (gpufair's own are), they run as one (`Layers`)."""
    slots = WorkSlots(max_workers)
    interceptors = [
        MetricsInterceptor(),
        DeadlineInterceptor(),
        *interceptors_extra,
        ErrorMappingInterceptor(),
        SharedReplyInterceptor(SHARED_REPLIES),
        WorkSlotInterceptor(slots),
    ]
    if all(isinstance(i, Layer) for i in interceptors):
        interceptors = [Layers([i for i in interceptors if isinstance(i, Layer)])]
    threads = RpcThreads(max_workers + schedule_waiters, name="rpc")
    server = grpc.server(
        # grpc asks of its pool `submit` and the result's `add_done_callback` only.
        cast(futures.ThreadPoolExecutor, threads),
        interceptors=interceptors,
        options=[
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            ("grpc.so_reuseport", 1 if reuse_port else 0),
        ],
    )
    commits = key_commit_count(engine)
    keys = KeyReader(engine)  # the read caches' checks, on one connection of their own
    notices = key_notices(engine)  # other processes' key commits; one listener per engine
    cluster_admin = ClusterAdminServicer(
        engine,
        clock,
        configs=ReadCache(commits, staleness_s=read_staleness_s, slots=slots, notices=notices),
        keys=keys,
    )
    cluster_pb2_grpc.add_ClusterAdminServicer_to_server(cluster_admin, server)
    scheduler = SchedulerServicer(engine, clock, bind_timeout_s=bind_timeout_s, slots=slots)
    ledger = LedgerServicer(
        engine,
        clock,
        fair_shares=ReadCache(commits, staleness_s=read_staleness_s, slots=slots, notices=notices),
        keys=keys,
    )
    scheduler_pb2_grpc.add_SchedulerServicer_to_server(scheduler, server)
    add_ledger_to_server(ledger, server)

    health_servicer = health.HealthServicer(experimental_non_blocking=True)
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection(
        (*SERVICE_NAMES, health.SERVICE_NAME, reflection.SERVICE_NAME), server
    )

    if credentials is None:
        port = server.add_insecure_port(address)
    else:
        port = server.add_secure_port(address, credentials)
    if port == 0:
        raise OSError(f"cannot listen on {address}")
    database_health = DatabaseHealth(
        engine, health_servicer, (*SERVICE_NAMES,), interval_s=health_interval_s
    )
    database_health.start()
    if metrics_registry is not None:
        metrics_registry.register(StateCollector(engine, database_health, clock=clock))
    server.start()
    return RunningServer(
        server=server,
        port=port,
        health=health_servicer,
        database_health=database_health,
        keys=keys,
        notices=notices,
        caches=(cluster_admin.configs, ledger.fair_shares),
        slots=slots,
        threads=threads,
    )
