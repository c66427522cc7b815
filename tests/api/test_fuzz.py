"""Hostile and malformed input to every RPC: always a clear status, never UNKNOWN or INTERNAL,
and the server keeps answering with its state intact."""

from __future__ import annotations

import math
from collections.abc import Iterator

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import Engine

from gpufair.api.server import build_server
from gpufair.client import GpufairClient
from gpufair.v1 import cluster_pb2, ledger_pb2, scheduler_pb2

FORBIDDEN = {grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL}

text = st.one_of(
    st.text(max_size=30),
    st.sampled_from(
        ["", "main", "a100", "q", "../../etc", "名前", "x" * 10_000, "\x00", "DROP TABLE"]
    ),
)
number = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0.0, -1.0, 1e308, -1e308, math.nan, math.inf, 5e-324]),
)
small_int = st.integers(min_value=-(2**31), max_value=2**31 - 1)
enum_value = st.integers(min_value=-5, max_value=20)
settings_fuzz = settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@pytest.fixture(scope="module")
def fuzz_client(engine: Engine) -> Iterator[GpufairClient]:
    running = build_server(engine, "127.0.0.1:0", max_workers=4)
    try:
        with GpufairClient(f"127.0.0.1:{running.port}", attempts=1, timeout_s=30) as c:
            yield c
    finally:
        running.stop(0.5)


def expect_clear_status(call: object) -> None:
    try:
        call()  # type: ignore[operator]
    except grpc.RpcError as exc:
        assert isinstance(exc, grpc.Call)
        assert exc.code() not in FORBIDDEN, (exc.code(), exc.details())


@st.composite
def configs(draw: st.DrawFn) -> cluster_pb2.ClusterConfig:
    msg = cluster_pb2.ClusterConfig()
    for _ in range(draw(st.integers(0, 3))):
        msg.gpu_types.add(name=draw(text), memory_gib=draw(number), compute_weight=draw(number))
    for _ in range(draw(st.integers(0, 2))):
        pool = msg.pools.add(name=draw(text), placement=draw(enum_value))  # type: ignore[arg-type]
        pool.policy.window_kind = draw(enum_value)  # type: ignore[assignment]
        if draw(st.booleans()):
            pool.policy.half_life_s = draw(number)
        if draw(st.booleans()):
            pool.policy.k = draw(number)
        pool.policy.window_s = draw(number)
    for _ in range(draw(st.integers(0, 3))):
        msg.nodes.add(
            name=draw(text),
            pool=draw(text),
            gpu_type=draw(text),
            gpu_count=draw(small_int),
            cpu_millicores=draw(st.integers(-(2**63), 2**63 - 1)),
            labels=draw(st.dictionaries(text, text, max_size=2)),
        )
    names = draw(st.lists(text, max_size=6))
    for name in names:
        queue = msg.queues.add(name=name, parent=draw(st.sampled_from([*names, "", "ghost"])))
        if draw(st.booleans()):
            queue.quotas.add(
                pool=draw(text),
                deserved_cu=draw(number),
                over_quota_weight=draw(number),
                priority=draw(small_int),
                deserved_gpus_by_type=draw(st.dictionaries(text, number, max_size=2)),
            )
    for _ in range(draw(st.integers(0, 2))):
        msg.budgets.add(queue=draw(text), period=draw(enum_value), cu_hours=draw(number))  # type: ignore[arg-type]
    return msg


@settings_fuzz
@given(config=configs(), dry_run=st.booleans(), request_id=text)
def test_apply_config_fuzz(
    fuzz_client: GpufairClient, config: cluster_pb2.ClusterConfig, dry_run: bool, request_id: str
) -> None:
    expect_clear_status(
        lambda: fuzz_client.cluster.ApplyConfig(
            cluster_pb2.ApplyConfigRequest(config=config, dry_run=dry_run, request_id=request_id),
            timeout=30,
        )
    )
    assert fuzz_client.get_config().config_version >= 0


@st.composite
def workloads(draw: st.DrawFn) -> scheduler_pb2.Workload:
    msg = scheduler_pb2.Workload(
        uid=draw(text),
        queue=draw(text),
        pool=draw(text),
        pods=draw(small_int),
        gpus_per_pod=draw(number),
        allowed_gpu_types=draw(st.lists(text, max_size=3)),
        min_gpu_memory_gib=draw(number),
        cpu_millicores_per_pod=draw(st.integers(-(2**63), 2**63 - 1)),
        priority_class=draw(small_int),
        min_runtime_s=draw(number),
    )
    if draw(st.booleans()):
        msg.min_pods = draw(small_int)
    if draw(st.booleans()):
        msg.submit_time.seconds = draw(st.integers(-62135596800, 253402300799))
    if draw(st.booleans()):
        msg.topology.level = draw(text)
    return msg


@settings_fuzz
@given(batch=st.lists(workloads(), max_size=5), request_id=text)
def test_submit_workloads_fuzz(
    fuzz_client: GpufairClient, batch: list[scheduler_pb2.Workload], request_id: str
) -> None:
    expect_clear_status(
        lambda: fuzz_client.scheduler.SubmitWorkloads(
            scheduler_pb2.SubmitWorkloadsRequest(workloads=batch, request_id=request_id), timeout=30
        )
    )


@st.composite
def events(draw: st.DrawFn) -> ledger_pb2.LedgerEvent:
    msg = ledger_pb2.LedgerEvent(
        event_id=draw(st.one_of(text, st.uuids().map(str))),
        workload_uid=draw(text),
        kind=draw(enum_value),  # type: ignore[arg-type]
        node=draw(text),
        gpu_count=draw(small_int),
    )
    if draw(st.booleans()):
        msg.occurred_at.seconds = draw(st.integers(-62135596800, 253402300799))
        msg.occurred_at.nanos = draw(st.integers(0, 999_999_999))
    for _ in range(draw(st.integers(0, 2))):
        msg.pods.add(
            node=draw(text),
            gpu_indices=draw(st.lists(small_int, max_size=3)),
            gpu_fraction=draw(number),
        )
    return msg


@settings_fuzz
@given(batch=st.lists(events(), max_size=6))
def test_report_events_fuzz(
    fuzz_client: GpufairClient, batch: list[ledger_pb2.LedgerEvent]
) -> None:
    expect_clear_status(
        lambda: fuzz_client.ledger.ReportEvents(
            ledger_pb2.ReportEventsRequest(events=batch), timeout=30
        )
    )
    expect_clear_status(
        lambda: fuzz_client.ledger.StreamEvents(
            iter([ledger_pb2.ReportEventsRequest(events=batch)]), timeout=30
        )
    )


@settings_fuzz
@given(
    pool=text,
    queue=text,
    period=enum_value,
    since=st.integers(-62135596800, 253402300799),
    dry_run=st.booleans(),
    uid=text,
)
def test_read_and_schedule_rpcs_fuzz(
    fuzz_client: GpufairClient,
    pool: str,
    queue: str,
    period: int,
    since: int,
    dry_run: bool,
    uid: str,
) -> None:
    usage = ledger_pb2.GetUsageRequest(pool=pool, queue=queue, period=period)  # type: ignore[arg-type]
    usage.since.seconds = since
    history = ledger_pb2.GetFairShareHistoryRequest(pool=pool, queue=queue)
    history.since.seconds = since
    calls = [
        lambda: fuzz_client.ledger.GetUsage(usage, timeout=30),
        lambda: fuzz_client.ledger.GetFairShare(
            ledger_pb2.GetFairShareRequest(pool=pool), timeout=30
        ),
        lambda: fuzz_client.ledger.GetFairShareHistory(history, timeout=30),
        lambda: fuzz_client.scheduler.Schedule(
            scheduler_pb2.ScheduleRequest(pool=pool, dry_run=dry_run), timeout=30
        ),
        lambda: fuzz_client.scheduler.ExplainWorkload(
            scheduler_pb2.ExplainWorkloadRequest(uid=uid), timeout=30
        ),
        lambda: fuzz_client.scheduler.CancelWorkload(
            scheduler_pb2.CancelWorkloadRequest(uid=uid), timeout=30
        ),
        lambda: fuzz_client.cluster.DeleteObjects(
            cluster_pb2.DeleteObjectsRequest(kind=queue, names=[uid], dry_run=True), timeout=30
        ),
    ]
    for call in calls:
        expect_clear_status(call)


def test_garbage_bytes_are_a_clear_error(fuzz_client: GpufairClient) -> None:
    raw = fuzz_client._channel.unary_unary(
        "/gpufair.v1.ClusterAdmin/ApplyConfig",
        request_serializer=lambda b: b,
        response_deserializer=lambda b: b,
    )
    with pytest.raises(grpc.RpcError) as err:
        raw(b"\xff\xff\xff\xff\x0f garbage", timeout=10)
    assert err.value.code() not in {grpc.StatusCode.UNKNOWN}
