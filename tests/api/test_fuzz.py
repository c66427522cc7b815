"""Hostile and malformed input to every RPC: always a clear status, never UNKNOWN or INTERNAL,
every INVALID_ARGUMENT names its fields, and the server keeps answering with its state intact.

Typed values go through the generated stubs: NaN, infinities, 1e308, 5e-324, negatives, huge
strings, NUL and control characters, deep queue trees, timestamps far outside 1970-9999. Raw
bytes go to every method of the three services on a channel without serializers."""

from __future__ import annotations

import math
import re
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

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


def expect_clear_status(call: Callable[[], object]) -> object:
    """No UNKNOWN or INTERNAL; an INVALID_ARGUMENT names a field for every violation, and its
    status stays short. Returns the reply, or the error the call was refused with."""
    try:
        return call()
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
        return exc


def refused(outcome: object) -> bool:
    return isinstance(outcome, grpc.RpcError)


def stored_rows(engine: Engine) -> dict[str, list[tuple[object, ...]]]:
    """Every row of every table, in a stable order: what a refused call leaves as it found it."""
    with engine.connect() as conn:
        return {
            table.name: sorted((tuple(row) for row in conn.execute(table.select())), key=repr)
            for table in metadata.sorted_tables
        }


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
    engine: Engine,
    config: cluster_pb2.ClusterConfig,
    dry_run: bool,
    request_id: str,
    kinds: list[str],
    expected_version: int | None,
) -> None:
    """A refused apply leaves every stored row as it was; a dry run leaves the config and its
    version; an apply that went through moves the version by one exactly when the config
    changed."""
    request = cluster_pb2.ApplyConfigRequest(
        config=config, dry_run=dry_run, request_id=request_id, kinds=kinds
    )
    if expected_version is not None:
        request.expected_version = expected_version
    fuzz_client.apply_config(base_config())  # something a refusal could lose
    rows, before = stored_rows(engine), fuzz_client.get_config()
    outcome = expect_clear_status(lambda: fuzz_client.cluster.ApplyConfig(request, timeout=30))
    after = fuzz_client.get_config()
    if refused(outcome):
        assert stored_rows(engine) == rows
    if refused(outcome) or dry_run:
        assert after == before
    else:
        changed = after.config != before.config
        assert after.config_version == before.config_version + changed


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
    engine: Engine,
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
    fuzz_client.apply_config(base_config())  # something a refusal could lose
    for call in (
        lambda: fuzz_client.cluster.UpsertNodes(upsert, timeout=30),
        lambda: fuzz_client.cluster.SetNodesReady(drain, timeout=30),
    ):
        rows = stored_rows(engine)
        if refused(expect_clear_status(call)):
            assert stored_rows(engine) == rows
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
    fuzz_client: GpufairClient,
    engine: Engine,
    batch: list[scheduler_pb2.Workload],
    request_id: str,
) -> None:
    fuzz_client.apply_config(base_config())  # something a refusal could lose
    rows = stored_rows(engine)
    outcome = expect_clear_status(
        lambda: fuzz_client.scheduler.SubmitWorkloads(
            scheduler_pb2.SubmitWorkloadsRequest(workloads=batch, request_id=request_id), timeout=30
        )
    )
    if refused(outcome):
        assert stored_rows(engine) == rows


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
    fuzz_client: GpufairClient, engine: Engine, batch: list[ledger_pb2.LedgerEvent]
) -> None:
    fuzz_client.apply_config(base_config())  # something a refusal could lose
    for call in (
        lambda: fuzz_client.ledger.ReportEvents(
            ledger_pb2.ReportEventsRequest(events=batch), timeout=30
        ),
        lambda: fuzz_client.ledger.StreamEvents(
            iter([ledger_pb2.ReportEventsRequest(events=batch)]), timeout=30
        ),
    ):
        rows = stored_rows(engine)
        if refused(expect_clear_status(call)):
            assert stored_rows(engine) == rows


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


# One field of a valid request made hostile: every field, with every hostile value of its kind.
HOSTILE_NUMBERS = (
    math.nan,
    math.inf,
    -math.inf,
    1e308,
    -1e308,
    5e-324,
    -5e-324,
    -1.0,
    1e19,
    2.0**63,
)
HOSTILE_TEXTS = (
    "",
    "\x00",
    "a\x00",
    "x\x1b[31m",
    "\x7f",
    "z" * 1_048_576,
    "名" * 300,
    "\ud7ff\x85",
)
HOSTILE_SECONDS = (-1, -62135596800, 253402300800, 10**15, 2**63 - 1, -(2**63))
# The smallest positive double: the only hostile number inside a range that starts at 0.
TINY = 5e-324
_PART = re.compile(r"(\w+)(?:\[(.+)\])?$")


@dataclass(frozen=True)
class Hostile:
    """A field of a valid request and the hostile values it is tried with. `path` is where it
    sits in its message, as a field violation names it (`config.` or `workloads[0].` before
    it); `holds` are the values among them the field may hold, within its limits
    (domain/limits.py): those are accepted and stored as sent, every other one is refused.
    `add` puts a value where a plain assignment cannot (a new map key, a list entry), and
    `named` gives the violation's path when the value is part of it."""

    path: str
    values: tuple[Any, ...]
    holds: tuple[Any, ...] = ()
    add: Callable[[Any, Any], None] | None = None
    named: Callable[[Any], str] | None = None

    def _last(self, msg: Any) -> tuple[Any, str, str | None]:
        *parents, last = self.path.split(".")
        for part in parents:
            name, key = _PART.fullmatch(part).groups()  # type: ignore[union-attr]
            msg = getattr(msg, name)
            if key is not None:
                msg = msg[int(key)]
        name, key = _PART.fullmatch(last).groups()  # type: ignore[union-attr]
        return msg, name, key

    def put(self, msg: Any, value: Any) -> None:
        if self.add is not None:
            self.add(msg, value)
            return
        parent, name, key = self._last(msg)
        if key is None:
            setattr(parent, name, value)
        else:
            getattr(parent, name)[key] = value  # a map's entry

    def read(self, msg: Any) -> Any:
        parent, name, key = self._last(msg)
        return getattr(parent, name) if key is None else getattr(parent, name).get(key)

    def violation_path(self, value: Any) -> str:
        return self.named(value) if self.named is not None else self.path


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


# What `base_config` may hold of the hostile values: TINY where the range is [0, max] (k,
# dead_band, the anchor, the reservation delay, deserved quotas, limits, weights) or (0, max] (a
# budget); "" where a string is optional (a label's value, a top-level queue's parent, a budget
# for every pool). Nothing else: durations and GPU sizes start at 0.001, names and label keys
# must match their patterns.
CONFIG_FIELDS = {
    hostile.path: hostile
    for hostile in (
        Hostile("gpu_types[0].compute_weight", HOSTILE_NUMBERS),
        Hostile("gpu_types[0].memory_gib", HOSTILE_NUMBERS),
        Hostile("gpu_types[0].partition_profiles[0].gpu_fraction", HOSTILE_NUMBERS),
        Hostile("pools[0].policy.half_life_s", HOSTILE_NUMBERS),
        Hostile("pools[0].policy.window_s", HOSTILE_NUMBERS),
        Hostile("pools[0].policy.k", HOSTILE_NUMBERS, (TINY,)),
        Hostile("pools[0].policy.window_anchor_unix_s", HOSTILE_NUMBERS, (TINY,)),
        Hostile("pools[0].policy.recompute_interval_s", HOSTILE_NUMBERS),
        Hostile("pools[0].policy.dead_band", HOSTILE_NUMBERS, (TINY,)),
        Hostile("pools[0].gang_reservation_after_s", HOSTILE_NUMBERS, (TINY,)),
        Hostile("queues[0].quotas[0].deserved_cu", HOSTILE_NUMBERS, (TINY,)),
        Hostile("queues[0].quotas[0].limit_cu", HOSTILE_NUMBERS, (TINY,)),
        Hostile("queues[0].quotas[0].over_quota_weight", HOSTILE_NUMBERS, (TINY,)),
        Hostile("queues[0].quotas[0].deserved_gpus_by_type[a100]", HOSTILE_NUMBERS, (TINY,)),
        Hostile("budgets[0].cu_hours", HOSTILE_NUMBERS, (TINY,)),
        Hostile("nodes[0].labels[rack]", HOSTILE_TEXTS, ("",)),
        Hostile(
            "nodes[0].labels",  # a second label, with the hostile key
            HOSTILE_TEXTS,
            add=lambda c, v: c.nodes[0].labels.update({v: "r"}),
            named=lambda v: f"nodes[0].labels[{v[:80]}]",
        ),
        Hostile("nodes[0].name", HOSTILE_TEXTS),
        Hostile("queues[0].parent", HOSTILE_TEXTS, ("",)),
        Hostile("budgets[0].pool", HOSTILE_TEXTS, ("",)),
    )
}
# What a one-GPU workload of `base_config` may hold: TINY as its GPU memory floor and its
# minimum runtime ([0, max]); nothing else (a pod takes at least 0.001 GPU, instants lie in
# 1970-9999, uid, queue, pool, topology level and GPU types are required patterns or names).
WORKLOAD_FIELDS = {
    hostile.path: hostile
    for hostile in (
        Hostile("gpus_per_pod", HOSTILE_NUMBERS),
        Hostile("min_gpu_memory_gib", HOSTILE_NUMBERS, (TINY,)),
        Hostile("min_runtime_s", HOSTILE_NUMBERS, (TINY,)),
        Hostile("uid", HOSTILE_TEXTS),
        Hostile("queue", HOSTILE_TEXTS),
        Hostile("pool", HOSTILE_TEXTS),
        Hostile(
            "submit_time", HOSTILE_SECONDS, add=lambda w, s: setattr(w.submit_time, "seconds", s)
        ),
        Hostile("topology.level", HOSTILE_TEXTS),
        Hostile(
            "allowed_gpu_types[0]", HOSTILE_TEXTS, add=lambda w, v: w.allowed_gpu_types.append(v)
        ),
    )
}


def cases(fields: dict[str, Hostile]) -> list[Any]:
    """Every field with every one of its hostile values, named by both (long strings cut)."""
    out = []
    for path, hostile in fields.items():
        for value in hostile.values:
            shown = repr(value) if len(repr(value)) <= 24 else f"{repr(value)[:12]}…({len(value)})"
            out.append(pytest.param(path, value, id=f"{path}={shown}"))
    return out


def expect_refused_naming(outcome: object, path: str) -> None:
    """Refused as bad input, with a violation for the field at `path`."""
    assert isinstance(outcome, grpc.Call), f"accepted: {outcome}"
    assert outcome.code() == grpc.StatusCode.INVALID_ARGUMENT, (outcome.code(), outcome.details())
    named = [field for field, _ in field_violations(outcome)]
    assert path in named, named


@pytest.mark.parametrize(("path", "value"), cases(CONFIG_FIELDS))
def test_one_hostile_field_in_a_valid_config(
    fuzz_client: GpufairClient, engine: Engine, path: str, value: Any
) -> None:
    """A valid config with one field made hostile: refused with INVALID_ARGUMENT naming that
    field, dry run or not, and nothing stored; or, for a value the field may hold (`holds`),
    a dry run stores nothing and the apply stores the value as sent."""
    hostile = CONFIG_FIELDS[path]
    fuzz_client.apply_config(base_config())
    before, rows = fuzz_client.get_config(), stored_rows(engine)
    config = base_config()
    hostile.put(config, value)
    for dry_run in (True, False):
        request = cluster_pb2.ApplyConfigRequest(config=config, dry_run=dry_run)
        outcome = expect_clear_status(
            lambda request=request: fuzz_client.cluster.ApplyConfig(request, timeout=30)
        )
        if value not in hostile.holds:
            expect_refused_naming(outcome, f"config.{hostile.violation_path(value)}")
            assert stored_rows(engine) == rows
        elif dry_run:
            assert isinstance(outcome, cluster_pb2.ApplyConfigResponse) and not outcome.applied
            assert stored_rows(engine) == rows
        else:
            assert isinstance(outcome, cluster_pb2.ApplyConfigResponse) and outcome.applied
            after = fuzz_client.get_config()
            assert hostile.read(after.config) == value
            changed = hostile.read(before.config) != value
            assert after.config_version == outcome.config_version
            assert after.config_version == before.config_version + changed


@pytest.mark.parametrize(("path", "value"), cases(WORKLOAD_FIELDS))
def test_one_hostile_field_in_a_valid_workload(
    fuzz_client: GpufairClient, engine: Engine, path: str, value: Any
) -> None:
    """A valid workload with one field made hostile: refused with INVALID_ARGUMENT naming that
    field and nothing stored; or, for a value the field may hold, accepted and stored as
    sent."""
    hostile = WORKLOAD_FIELDS[path]
    fuzz_client.apply_config(base_config())
    uid = f"w-{uuid.uuid4()}"
    w = scheduler_pb2.Workload(uid=uid, queue="team", pool="main", pods=1, gpus_per_pod=1)
    hostile.put(w, value)
    request = scheduler_pb2.SubmitWorkloadsRequest(workloads=[w])
    rows = stored_rows(engine)
    outcome = expect_clear_status(
        lambda: fuzz_client.scheduler.SubmitWorkloads(request, timeout=30)
    )
    if value not in hostile.holds:
        expect_refused_naming(outcome, f"workloads[0].{hostile.violation_path(value)}")
        assert stored_rows(engine) == rows
        return
    assert isinstance(outcome, scheduler_pb2.SubmitWorkloadsResponse)
    assert [(r.uid, r.accepted, r.error) for r in outcome.results] == [(uid, True, "")]
    [stored] = [s.workload for s in fuzz_client.list_workloads() if s.workload.uid == uid]
    assert hostile.read(stored) == value
