"""Health, reflection and the database-outage path of the server."""

from __future__ import annotations

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from gpufair.api.server import build_server
from gpufair.client import GpufairClient
from gpufair.store.database import make_engine


def test_health_reports_serving_for_each_service(client: GpufairClient) -> None:
    stub = health_pb2_grpc.HealthStub(client._channel)
    for service in ("", "gpufair.v1.ClusterAdmin", "gpufair.v1.Scheduler", "gpufair.v1.Ledger"):
        reply = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING, service


def test_reflection_lists_the_api(client: GpufairClient) -> None:
    stub = reflection_pb2_grpc.ServerReflectionStub(client._channel)
    request = reflection_pb2.ServerReflectionRequest(list_services="")
    reply = next(stub.ServerReflectionInfo(iter([request]), timeout=5))
    names = {s.name for s in reply.list_services_response.service}
    assert {"gpufair.v1.ClusterAdmin", "gpufair.v1.Scheduler", "gpufair.v1.Ledger"} <= names


def test_database_outage_is_unavailable_not_unknown() -> None:
    # Nothing listens on port 1: every query fails to connect.
    engine = make_engine("postgresql://postgres@127.0.0.1:1/nowhere", pool_size=1)
    running = build_server(engine, "127.0.0.1:0", max_workers=2)
    try:
        with GpufairClient(f"127.0.0.1:{running.port}", attempts=1, timeout_s=20) as c:
            with pytest.raises(grpc.RpcError) as err:
                c.get_config()
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE
            assert "database is unavailable" in (err.value.details() or "")
    finally:
        running.stop(0.5)
        engine.dispose()


def test_shutdown_reports_not_serving_before_stopping(engine: object) -> None:
    from sqlalchemy import Engine

    assert isinstance(engine, Engine)
    running = build_server(engine, "127.0.0.1:0", max_workers=2)
    running.health.enter_graceful_shutdown()
    with grpc.insecure_channel(f"127.0.0.1:{running.port}") as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        reply = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=5)
        assert reply.status == health_pb2.HealthCheckResponse.NOT_SERVING
    running.stop(0.5)
