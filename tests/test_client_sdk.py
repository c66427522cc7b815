"""The Python client as an SDK: a method for every RPC of the service descriptors (streaming
included), in the blocking and the asyncio client alike; event builders; retries by gRPC's own
retry policy (jittered backoff, the same request id on every attempt, bounded by the deadline)."""

from __future__ import annotations

import asyncio
import re
import threading
import time
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest

from gpufair import client as sdk
from gpufair.api.server import RunningServer
from gpufair.client import GpufairClient
from gpufair.client_aio import AsyncGpufairClient
from gpufair.config_file import load_config_file
from gpufair.v1 import cluster_pb2, ledger_pb2, scheduler_pb2

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "clusters"
SERVICES = [
    cluster_pb2.DESCRIPTOR.services_by_name["ClusterAdmin"],
    scheduler_pb2.DESCRIPTOR.services_by_name["Scheduler"],
    ledger_pb2.DESCRIPTOR.services_by_name["Ledger"],
]
# Method names that are not the RPC's name in snake case.
RENAMED = {"ExplainWorkload": "explain"}


def method_name(rpc: str) -> str:
    return RENAMED.get(rpc) or re.sub(r"(?<!^)([A-Z])", r"_\1", rpc).lower()


def every_rpc() -> list[tuple[str, str, bool]]:
    return [
        (s.full_name, m.name, m.client_streaming) for s in SERVICES for m in s.methods
    ]  # fmt: skip


def test_the_client_has_a_method_for_every_rpc() -> None:
    rpcs = every_rpc()
    assert len(rpcs) == 15 and ("gpufair.v1.Ledger", "StreamEvents", True) in rpcs
    assert tuple(s.full_name for s in SERVICES) == sdk.SERVICES
    for _, rpc, streaming in rpcs:
        name = method_name(rpc)
        assert not streaming or name == "stream_events"
        assert callable(getattr(GpufairClient, name, None)), f"GpufairClient.{name} ({rpc})"
        coroutine = getattr(AsyncGpufairClient, name, None)
        assert coroutine is not None and asyncio.iscoroutinefunction(coroutine), name


def bind_and_start(client: GpufairClient) -> scheduler_pb2.ScheduleResponse:
    client.apply_config(load_config_file(EXAMPLES / "llm-vs-vision.yaml"))
    client.submit_workloads(
        [scheduler_pb2.Workload(uid="j-1", queue="llm", pool="default", pods=2, gpus_per_pod=4)]
    )
    return client.schedule("default")


def test_streaming_history_and_the_event_builders(client: GpufairClient) -> None:
    (bind,) = bind_and_start(client).binds
    t0 = time.time() - 60
    start = sdk.started("j-1", bind.pods, at=t0)
    assert [p.node for p in start.pods] == [p.node for p in bind.pods]
    assert start.kind == ledger_pb2.EVENT_KIND_STARTED and len(start.event_id) == 36
    batches = [[start], [sdk.heartbeat("j-1", at=t0 + 30)], [sdk.stopped("j-1", at=t0 + 45)]]
    reply = client.stream_events(batches)
    assert [r.status for r in reply.results] == [ledger_pb2.EVENT_STATUS_STORED] * 3
    # The same facts again are duplicates, whatever the call.
    again = client.report_events([e for batch in batches for e in batch])
    assert {r.status for r in again.results} == {ledger_pb2.EVENT_STATUS_DUPLICATE}

    usage = client.get_usage(include_open_hour=True)
    partial = [r for r in usage.rows if r.partial]
    # 45 s of 8 GPUs, unless the run straddles the hour's start.
    if time.gmtime(t0).tm_hour == time.gmtime().tm_hour:
        assert len(partial) == 1 and partial[0].gpu_hours == pytest.approx(8 * 45 / 3600)
    history = client.get_fair_share_history("default")
    assert history.points and {p.share.queue for p in history.points} == {"llm", "vision"}
    node = sdk.node_capacity("gpu-01", 3, at=t0)
    assert (node.node, node.gpu_count, node.workload_uid) == ("gpu-01", 3, "")
    assert sdk.preempted("x").kind == ledger_pb2.EVENT_KIND_PREEMPTED
    assert sdk.failed("x").kind == ledger_pb2.EVENT_KIND_FAILED


def test_the_asyncio_client(client: GpufairClient, server: RunningServer) -> None:
    (bind,) = bind_and_start(client).binds

    async def scenario() -> tuple[object, ...]:
        async with AsyncGpufairClient(f"127.0.0.1:{server.port}", timeout_s=20) as aio:
            config = await aio.get_config()
            listed = await aio.list_workloads(states=["bound"])
            explained = await aio.explain("j-1")

            async def batches() -> object:
                yield [sdk.started("j-1", bind.pods)]

            streamed = await aio.stream_events(batches())  # type: ignore[arg-type]
            share = await aio.get_fair_share("default")
            history = await aio.get_fair_share_history("default", queue="llm")
            usage = await aio.get_usage(include_open_hour=True)
            return config, listed, explained, streamed, share, history, usage

    config, listed, explained, streamed, share, history, usage = asyncio.run(scenario())
    assert config.config_version == 1  # type: ignore[attr-defined]
    assert [w.workload.uid for w in listed] == ["j-1"]  # type: ignore[attr-defined]
    assert explained.state == "bound"  # type: ignore[attr-defined]
    assert streamed.results[0].status == ledger_pb2.EVENT_STATUS_STORED  # type: ignore[attr-defined]
    assert share.capacity_cu == 100  # type: ignore[attr-defined]
    assert {p.share.queue for p in history.points} == {"llm"}  # type: ignore[attr-defined]
    assert usage.HasField("as_of")  # type: ignore[attr-defined]


class Flaky:
    """A stand-in ClusterAdmin: the first `failures` calls of each request id are UNAVAILABLE."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.calls: list[tuple[float, str]] = []
        self.lock = threading.Lock()

    def apply(
        self, request: cluster_pb2.ApplyConfigRequest, context: grpc.ServicerContext
    ) -> cluster_pb2.ApplyConfigResponse:
        with self.lock:
            self.calls.append((time.monotonic(), request.request_id))
            seen = sum(1 for _, rid in self.calls if rid == request.request_id)
        if seen <= self.failures:
            context.abort(grpc.StatusCode.UNAVAILABLE, "database restarting")
        return cluster_pb2.ApplyConfigResponse(config_version=7)


@pytest.fixture
def flaky() -> Iterator[tuple[Flaky, str]]:
    stand_in = Flaky(failures=2)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    handler = grpc.unary_unary_rpc_method_handler(
        stand_in.apply,
        request_deserializer=cluster_pb2.ApplyConfigRequest.FromString,
        response_serializer=cluster_pb2.ApplyConfigResponse.SerializeToString,
    )
    server.add_generic_rpc_handlers(
        [grpc.method_handlers_generic_handler("gpufair.v1.ClusterAdmin", {"ApplyConfig": handler})]
    )
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield stand_in, f"127.0.0.1:{port}"
    server.stop(0)


def test_unavailable_is_retried_with_the_same_request_id(flaky: tuple[Flaky, str]) -> None:
    stand_in, address = flaky
    with GpufairClient(address, attempts=3, backoff_s=0.05, timeout_s=10) as client:
        assert client.apply_config(cluster_pb2.ClusterConfig()).config_version == 7
    assert len(stand_in.calls) == 3 and len({rid for _, rid in stand_in.calls}) == 1
    with (
        GpufairClient(address, attempts=1, timeout_s=10) as client,
        pytest.raises(grpc.RpcError) as caught,
    ):
        client.apply_config(cluster_pb2.ClusterConfig())
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE  # type: ignore[attr-defined]


def test_backoff_is_jittered(flaky: tuple[Flaky, str]) -> None:
    """gRPC waits a random time up to the current backoff: the gaps before a retry differ from
    call to call and sit within their bound (0.2 s, then 0.4 s), allowing 0.1 s for scheduling.
    A busy machine can make a retry's timer fire late (never early), so one gap in six may run
    over; a fixed or larger backoff would put most of them over."""
    stand_in, address = flaky
    with GpufairClient(address, attempts=3, backoff_s=0.2, timeout_s=10) as client:
        for _ in range(6):
            client.apply_config(cluster_pb2.ClusterConfig())
    by_id: dict[str, list[float]] = {}
    for at, rid in stand_in.calls:
        by_id.setdefault(rid, []).append(at)
    first_gaps = [times[1] - times[0] for times in by_id.values()]
    second_gaps = [times[2] - times[1] for times in by_id.values()]
    assert len(first_gaps) == 6
    assert sum(gap < 0.2 + 0.1 for gap in first_gaps) >= 5, first_gaps
    assert sum(gap < 0.4 + 0.1 for gap in second_gaps) >= 5, second_gaps
    assert max(first_gaps) - min(first_gaps) > 0.01  # not one fixed delay


def test_the_deadline_bounds_every_attempt_together(flaky: tuple[Flaky, str]) -> None:
    stand_in, address = flaky
    stand_in.failures = 100
    with GpufairClient(address, attempts=5, backoff_s=2.0, timeout_s=0.5) as client:
        began = time.monotonic()
        with pytest.raises(grpc.RpcError) as caught:
            client.apply_config(cluster_pb2.ClusterConfig())
        took = time.monotonic() - began
    assert took < 1.5
    code = caught.value.code()  # type: ignore[attr-defined]
    assert code in (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.UNAVAILABLE)
    assert len(stand_in.calls) < 5


def test_service_config_states_the_policy() -> None:
    import json

    policy = json.loads(sdk.service_config(attempts=9, backoff_s=0.3))["methodConfig"][0]
    assert [n["service"] for n in policy["name"]] == list(sdk.SERVICES)
    assert policy["retryPolicy"] == {
        "maxAttempts": 5,  # gRPC's ceiling
        "initialBackoff": "0.300s",
        "maxBackoff": "5.000s",
        "backoffMultiplier": 2,
        "retryableStatusCodes": ["UNAVAILABLE"],
    }
    assert "retryPolicy" not in json.loads(sdk.service_config(attempts=1))["methodConfig"][0]
