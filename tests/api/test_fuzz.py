"""Hostile and malformed input to every RPC: always a clear status, never UNKNOWN or INTERNAL,
every INVALID_ARGUMENT names its fields, and the server keeps answering with its state intact.

Typed values go through the generated stubs: NaN, infinities, 1e308, 5e-324, negatives, huge
strings, NUL and control characters, deep queue trees, timestamps far outside 1970-9999. Raw
bytes go to every method of the three services on a channel without serializers."""

from __future__ import annotations

import math
import uuid
from collections.abc import Callable, Iterator

import grpc
import pytest
import sqlalchemy
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import Engine

from gpufair.api.server import SERVICE_NAMES, build_server
from gpufair.client import GpufairClient, field_violations
from gpufair.store.schema import metadata
from gpufair.v1 import cluster_pb2, ledger_pb2, scheduler_pb2

FORBIDDEN = {grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL}

text = st.one_of(
    st.text(max_size=30),
    st.sampled_from(
        [
            "",
            "main",
            "a100",
            "q",
            "../../etc",
            "名前",
            "x" * 10_000,
            "y" * 1_048_576,
            "\x00",
            "a\x00b",
            "tab\there",
            "line\nbreak",
            "\x7f\x9f",
            "DROP TABLE",
        ]
    ),
)
far_seconds = st.one_of(st.integers(-62135596800, 253402300799), st.integers(-(2**63), 2**63 - 1))
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
    """A server of its own for the module; what the fuzzing stored is emptied afterwards, so the
    tests that follow start from an empty database as they expect."""
    running = build_server(engine, "127.0.0.1:0", max_workers=4)
    try:
        with GpufairClient(f"127.0.0.1:{running.port}", attempts=1, timeout_s=30) as c:
            yield c
    finally:
        running.stop(0.5)
        names = ", ".join(f'"{t.name}"' for t in metadata.sorted_tables)
        with engine.begin() as conn:
            conn.execute(sqlalchemy.text(f"TRUNCATE {names} RESTART IDENTITY CASCADE"))


def expect_clear_status(call: object) -> None:
    """No UNKNOWN or INTERNAL; an INVALID_ARGUMENT names a field for every violation, and its
    status stays short."""
    try:
        call()  # type: ignore[operator]
    except grpc.RpcError as exc:
        assert isinstance(exc, grpc.Call)
        assert exc.code() not in FORBIDDEN, (exc.code(), exc.details())
        assert len(exc.details() or "") <= 1_000
        if exc.code() == grpc.StatusCode.INVALID_ARGUMENT:
            violations = field_violations(exc)
            assert violations, exc.details()
            assert all(field for field, _ in violations), violations
            # The database's refusal is the last resort: the limits must name the field first.
            assert not (exc.details() or "").startswith("a value cannot be stored"), violations


@st.composite
def configs(draw: st.DrawFn) -> cluster_pb2.ClusterConfig:
    msg = cluster_pb2.ClusterConfig()
    for _ in range(draw(st.integers(0, 3))):
        gpu = msg.gpu_types.add(
            name=draw(text), memory_gib=draw(number), compute_weight=draw(number)
        )
        if draw(st.booleans()):
            gpu.partition_profiles.add(
                name=draw(text), gpu_fraction=draw(number), memory_gib=draw(number)
            )
    for _ in range(draw(st.integers(0, 2))):
        pool = msg.pools.add(name=draw(text), placement=draw(enum_value))  # type: ignore[arg-type]
        pool.policy.window_kind = draw(enum_value)  # type: ignore[assignment]
        if draw(st.booleans()):
            pool.policy.half_life_s = draw(number)
        if draw(st.booleans()):
            pool.policy.k = draw(number)
        pool.policy.window_s = draw(number)
        pool.policy.recompute_interval_s = draw(number)
        pool.policy.dead_band = draw(number)
        pool.policy.window_anchor_unix_s = draw(number)
        pool.gang_reservation_after_s = draw(number)
        if draw(st.booleans()):
            pool.gang_entitlement = draw(st.booleans())
    for _ in range(draw(st.integers(0, 3))):
        msg.nodes.add(
            name=draw(text),
            pool=draw(text),
            gpu_type=draw(text),
            gpu_count=draw(small_int),
            cpu_millicores=draw(st.integers(-(2**63), 2**63 - 1)),
            memory_mib=draw(st.integers(-(2**63), 2**63 - 1)),
            labels=draw(st.dictionaries(text, text, max_size=2)),
        )
    if draw(st.integers(0, 9)) == 0:  # now and then a deep chain
        depth = draw(st.integers(10, 2_000))
        for i in range(depth):
            msg.queues.add(name=f"d{i}", parent=f"d{i - 1}" if i else "")
    names = draw(st.lists(text, max_size=6))
    for name in names:
        queue = msg.queues.add(name=name, parent=draw(st.sampled_from([*names, "", "ghost"])))
        if draw(st.booleans()):
            quota = queue.quotas.add(
                pool=draw(text),
                deserved_cu=draw(number),
                over_quota_weight=draw(number),
                priority=draw(small_int),
                deserved_gpus_by_type=draw(st.dictionaries(text, number, max_size=2)),
                limit_gpus_by_type=draw(st.dictionaries(text, number, max_size=2)),
            )
            if draw(st.booleans()):
                quota.limit_cu = draw(number)
    for _ in range(draw(st.integers(0, 2))):
        msg.budgets.add(queue=draw(text), period=draw(enum_value), cu_hours=draw(number))  # type: ignore[arg-type]
    return msg


@settings_fuzz
@given(
    config=configs(),
    dry_run=st.booleans(),
    request_id=text,
    kinds=st.lists(text, max_size=3),
    expected_version=st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1)),
)
def test_apply_config_fuzz(
    fuzz_client: GpufairClient,
    config: cluster_pb2.ClusterConfig,
    dry_run: bool,
    request_id: str,
    kinds: list[str],
    expected_version: int | None,
) -> None:
    request = cluster_pb2.ApplyConfigRequest(
        config=config, dry_run=dry_run, request_id=request_id, kinds=kinds
    )
    if expected_version is not None:
        request.expected_version = expected_version
    expect_clear_status(lambda: fuzz_client.cluster.ApplyConfig(request, timeout=30))
    assert fuzz_client.get_config().config_version >= 0


@settings_fuzz
@given(
    config=configs(),
    prune_pools=st.lists(text, max_size=3),
    names=st.lists(text, max_size=4),
    ready=st.booleans(),
    dry_run=st.booleans(),
    request_id=text,
)
def test_node_rpcs_fuzz(
    fuzz_client: GpufairClient,
    config: cluster_pb2.ClusterConfig,
    prune_pools: list[str],
    names: list[str],
    ready: bool,
    dry_run: bool,
    request_id: str,
) -> None:
    upsert = cluster_pb2.UpsertNodesRequest(
        nodes=config.nodes, prune_pools=prune_pools, dry_run=dry_run, request_id=request_id
    )
    drain = cluster_pb2.SetNodesReadyRequest(
        names=names, ready=ready, dry_run=dry_run, request_id=request_id
    )
    expect_clear_status(lambda: fuzz_client.cluster.UpsertNodes(upsert, timeout=30))
    expect_clear_status(lambda: fuzz_client.cluster.SetNodesReady(drain, timeout=30))
    expect_clear_status(
        lambda: fuzz_client.cluster.GetConfig(cluster_pb2.GetConfigRequest(), timeout=30)
    )


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
        memory_mib_per_pod=draw(st.integers(-(2**63), 2**63 - 1)),
    )
    if draw(st.booleans()):
        msg.min_pods = draw(small_int)
    if draw(st.booleans()):
        msg.submit_time.seconds = draw(far_seconds)
        msg.submit_time.nanos = draw(small_int)
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
        msg.occurred_at.seconds = draw(far_seconds)
        msg.occurred_at.nanos = draw(small_int)
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
    since=far_seconds,
    until=far_seconds,
    nanos=small_int,
    dry_run=st.booleans(),
    uid=text,
    request_id=text,
    states=st.lists(text, max_size=6),
    page_size=small_int,
)
def test_read_and_schedule_rpcs_fuzz(
    fuzz_client: GpufairClient,
    pool: str,
    queue: str,
    period: int,
    since: int,
    until: int,
    nanos: int,
    dry_run: bool,
    uid: str,
    request_id: str,
    states: list[str],
    page_size: int,
) -> None:
    usage = ledger_pb2.GetUsageRequest(pool=pool, queue=queue, period=period)  # type: ignore[arg-type]
    usage.since.seconds = since
    usage.until.seconds, usage.until.nanos = until, nanos
    history = ledger_pb2.GetFairShareHistoryRequest(pool=pool, queue=queue)
    history.since.seconds = since
    history.until.seconds, history.until.nanos = until, nanos
    listing = scheduler_pb2.ListWorkloadsRequest(
        pool=pool, queue=queue, states=states, page_size=page_size, page_token=uid
    )
    calls = [
        lambda: fuzz_client.ledger.GetUsage(usage, timeout=30),
        lambda: fuzz_client.ledger.GetFairShare(
            ledger_pb2.GetFairShareRequest(pool=pool), timeout=30
        ),
        lambda: fuzz_client.ledger.GetFairShareHistory(history, timeout=30),
        lambda: fuzz_client.scheduler.Schedule(
            scheduler_pb2.ScheduleRequest(pool=pool, dry_run=dry_run, request_id=request_id),
            timeout=30,
        ),
        lambda: fuzz_client.scheduler.ListWorkloads(listing, timeout=30),
        lambda: fuzz_client.scheduler.ExplainWorkload(
            scheduler_pb2.ExplainWorkloadRequest(uid=uid), timeout=30
        ),
        lambda: fuzz_client.scheduler.CancelWorkload(
            scheduler_pb2.CancelWorkloadRequest(uid=uid, request_id=request_id), timeout=30
        ),
        lambda: fuzz_client.cluster.DeleteObjects(
            cluster_pb2.DeleteObjectsRequest(
                kind=queue, names=[uid, pool], dry_run=True, request_id=request_id
            ),
            timeout=30,
        ),
    ]
    for call in calls:
        expect_clear_status(call)


def _methods() -> list[tuple[str, bool]]:
    """Every method of the three services as (path, client-streaming)."""
    out = []
    for module in (cluster_pb2, scheduler_pb2, ledger_pb2):
        for service in module.DESCRIPTOR.services_by_name.values():
            assert service.full_name in SERVICE_NAMES
            for method in service.methods:
                out.append((f"/{service.full_name}/{method.name}", method.client_streaming))
    return out


METHODS = _methods()
malformed = st.one_of(
    st.binary(max_size=64),
    st.sampled_from(
        [
            b"\xff\xff\xff\xff\x0f garbage",  # a varint tag that never ends well
            b"\x0a\x05\xff\xfe\xfd\xfc\xfb",  # field 1 as a string that is not UTF-8
            b"\x0a\xff\xff\xff\xff\x07",  # a length far beyond the message
            b"\x0a",  # truncated
            b"\x0b\x0c",  # groups where none are declared
        ]
    ),
)


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(payload=malformed)
def test_malformed_bytes_to_every_method_are_a_clear_status(
    fuzz_client: GpufairClient, payload: bytes
) -> None:
    channel = fuzz_client._channel
    for path, streaming in METHODS:
        if streaming:
            stream = channel.stream_unary(path, request_serializer=None, response_deserializer=None)
            expect_clear_status(lambda call=stream: call(iter([payload]), timeout=30))
        else:
            unary = channel.unary_unary(path, request_serializer=None, response_deserializer=None)
            expect_clear_status(lambda call=unary: call(payload, timeout=30))


def test_garbage_bytes_are_invalid_argument_on_every_method(fuzz_client: GpufairClient) -> None:
    assert len(METHODS) >= 15
    for path, streaming in METHODS:
        if streaming:
            call = fuzz_client._channel.stream_unary(path)
            with pytest.raises(grpc.RpcError) as err:
                call(iter([b"\xff\xff\xff\xff\x0f garbage"]), timeout=10)
            expected = "messages[0]"
        else:
            call = fuzz_client._channel.unary_unary(path)
            with pytest.raises(grpc.RpcError) as err:
                call(b"\xff\xff\xff\xff\x0f garbage", timeout=10)
            expected = "request"
        assert isinstance(err.value, grpc.Call)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, path
        assert [field for field, _ in field_violations(err.value)] == [expected], path


hostile_number = st.sampled_from(
    [math.nan, math.inf, -math.inf, 1e308, -1e308, 5e-324, -5e-324, -1.0, 1e19, 2.0**63]
)
hostile_text = st.sampled_from(
    ["", "\x00", "a\x00", "x\x1b[31m", "\x7f", "z" * 1_048_576, "名" * 300, "\ud7ff\x85"]
)
hostile_seconds = st.sampled_from([-1, -62135596800, 253402300800, 10**15, 2**63 - 1, -(2**63)])
WORKLOAD_NUMBERS = ("gpus_per_pod", "min_gpu_memory_gib", "min_runtime_s")
WORKLOAD_TEXTS = ("uid", "queue", "pool")


def base_config() -> cluster_pb2.ClusterConfig:
    config = cluster_pb2.ClusterConfig()
    gpu = config.gpu_types.add(name="a100", memory_gib=80, compute_weight=10)
    gpu.partition_profiles.add(name="1g", gpu_fraction=0.125, memory_gib=10)
    pool = config.pools.add(name="main", gang_reservation_after_s=600)
    pool.policy.half_life_s = 3600
    config.nodes.add(name="n1", pool="main", gpu_type="a100", gpu_count=8, labels={"rack": "r"})
    team = config.queues.add(name="team")
    team.quotas.add(pool="main", deserved_cu=40, limit_cu=80, deserved_gpus_by_type={"a100": 1})
    config.budgets.add(queue="team", period=cluster_pb2.BUDGET_PERIOD_DAY, cu_hours=100)
    return config


CONFIG_NUMBERS: dict[str, Callable[[cluster_pb2.ClusterConfig, float], None]] = {
    "compute_weight": lambda c, v: setattr(c.gpu_types[0], "compute_weight", v),
    "memory_gib": lambda c, v: setattr(c.gpu_types[0], "memory_gib", v),
    "gpu_fraction": lambda c, v: setattr(c.gpu_types[0].partition_profiles[0], "gpu_fraction", v),
    "half_life_s": lambda c, v: setattr(c.pools[0].policy, "half_life_s", v),
    "window_s": lambda c, v: setattr(c.pools[0].policy, "window_s", v),
    "k": lambda c, v: setattr(c.pools[0].policy, "k", v),
    "window_anchor_unix_s": lambda c, v: setattr(c.pools[0].policy, "window_anchor_unix_s", v),
    "recompute_interval_s": lambda c, v: setattr(c.pools[0].policy, "recompute_interval_s", v),
    "dead_band": lambda c, v: setattr(c.pools[0].policy, "dead_band", v),
    "gang_reservation_after_s": lambda c, v: setattr(c.pools[0], "gang_reservation_after_s", v),
    "deserved_cu": lambda c, v: setattr(c.queues[0].quotas[0], "deserved_cu", v),
    "limit_cu": lambda c, v: setattr(c.queues[0].quotas[0], "limit_cu", v),
    "over_quota_weight": lambda c, v: setattr(c.queues[0].quotas[0], "over_quota_weight", v),
    "deserved_gpus_by_type": lambda c, v: (
        c.queues[0].quotas[0].deserved_gpus_by_type.update({"a100": v})
    ),
    "cu_hours": lambda c, v: setattr(c.budgets[0], "cu_hours", v),
}
CONFIG_TEXTS: dict[str, Callable[[cluster_pb2.ClusterConfig, str], None]] = {
    "label value": lambda c, v: c.nodes[0].labels.update({"rack": v}),
    "label key": lambda c, v: c.nodes[0].labels.update({v: "r"}),
    "node name": lambda c, v: setattr(c.nodes[0], "name", v),
    "queue parent": lambda c, v: setattr(c.queues[0], "parent", v),
    "budget pool": lambda c, v: setattr(c.budgets[0], "pool", v),
}


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    field=st.sampled_from([*CONFIG_NUMBERS, *CONFIG_TEXTS]),
    number_value=hostile_number,
    text_value=hostile_text,
    dry_run=st.booleans(),
)
def test_one_hostile_field_in_a_valid_config(
    fuzz_client: GpufairClient, field: str, number_value: float, text_value: str, dry_run: bool
) -> None:
    """A valid config with one field made hostile: refused with that field named, or (for the
    few hostile values a field may hold) applied; never a database error."""
    config = base_config()
    if field in CONFIG_NUMBERS:
        CONFIG_NUMBERS[field](config, number_value)
    else:
        CONFIG_TEXTS[field](config, text_value)
    request = cluster_pb2.ApplyConfigRequest(config=config, dry_run=dry_run)
    expect_clear_status(lambda: fuzz_client.cluster.ApplyConfig(request, timeout=30))


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    field=st.sampled_from([*WORKLOAD_NUMBERS, *WORKLOAD_TEXTS, "submit_time", "level", "types"]),
    number_value=hostile_number,
    text_value=hostile_text,
    seconds=hostile_seconds,
)
def test_one_hostile_field_in_a_valid_workload(
    fuzz_client: GpufairClient, field: str, number_value: float, text_value: str, seconds: int
) -> None:
    fuzz_client.cluster.ApplyConfig(
        cluster_pb2.ApplyConfigRequest(config=base_config()), timeout=30
    )
    w = scheduler_pb2.Workload(
        uid=f"w-{uuid.uuid4()}", queue="team", pool="main", pods=1, gpus_per_pod=1
    )
    if field in WORKLOAD_NUMBERS:
        setattr(w, field, number_value)
    elif field in WORKLOAD_TEXTS:
        setattr(w, field, text_value)
    elif field == "submit_time":
        w.submit_time.seconds = seconds
    elif field == "level":
        w.topology.level = text_value
    else:
        w.allowed_gpu_types.append(text_value)
    request = scheduler_pb2.SubmitWorkloadsRequest(workloads=[w])
    expect_clear_status(lambda: fuzz_client.scheduler.SubmitWorkloads(request, timeout=30))
