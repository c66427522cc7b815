"""Health tells the truth: NOT_SERVING while the database cannot be reached, SERVING again when
it can, and `gpufair_database_up` says the same."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from outage_support import database_unreachable, wait_for
from prometheus_client import CollectorRegistry
from sqlalchemy import Engine

from gpufair.api.server import SERVICE_NAMES, RunningServer, build_server
from gpufair.client import GpufairClient
from gpufair.store import migrate
from gpufair.store.database import Database, make_engine
from gpufair.store.scratch import scratch_database

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


@pytest.fixture
def own_database(pg_server: Database) -> Iterator[tuple[str, Engine]]:
    """A database of this test's own, so an outage of it touches no other test."""
    with scratch_database(pg_server.url) as url:
        migrate.upgrade(url)
        engine = make_engine(url, pool_size=2)
        yield url, engine
        engine.dispose()


def test_health_follows_the_database(own_database: tuple[str, Engine]) -> None:
    url, engine = own_database
    registry = CollectorRegistry()
    running: RunningServer = build_server(
        engine, "127.0.0.1:0", max_workers=4, metrics_registry=registry, health_interval_s=0.2
    )
    try:
        with grpc.insecure_channel(f"127.0.0.1:{running.port}") as channel:
            stub = health_pb2_grpc.HealthStub(channel)

            def statuses() -> set[int]:
                return {
                    stub.Check(health_pb2.HealthCheckRequest(service=name), timeout=5).status
                    for name in ("", *SERVICE_NAMES)
                }

            def database_up() -> float | None:
                return registry.get_sample_value("gpufair_database_up", {})

            assert statuses() == {SERVING} and database_up() == 1.0
            with database_unreachable(url):
                wait_for(lambda: statuses() == {NOT_SERVING}, what="NOT_SERVING")
                assert database_up() == 0.0
                # No state gauge is exported from a database that cannot be read.
                assert [m.name for m in registry.collect()] == ["gpufair_database_up"]
                address = f"127.0.0.1:{running.port}"
                with (
                    GpufairClient(address, attempts=1, timeout_s=10) as c,
                    pytest.raises(grpc.RpcError) as refused,
                ):
                    c.get_config()
                assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
            wait_for(lambda: statuses() == {SERVING}, what="SERVING again")
            assert database_up() == 1.0
    finally:
        running.stop(1.0)
