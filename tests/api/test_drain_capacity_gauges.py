"""The capacity gauges and the fair share's capacity while a node is drained under work, through a
server (`capacity_repo.counted_now`, `capacity_repo.division_capacity`).

Pool `main`, four nodes of 8 `unit` GPUs (1 CU each, so CU read as GPUs). Queue a runs 8 GPUs on
w, b 8 on y and 8 on z, c 4 on x; c's 2-GPU job is bound on x by a Schedule (the only free GPUs)
and the batch system has not started it yet when the operator drains x.

`gpufair_pool_capacity_*` counted ready nodes only: 24 GPUs after the drain against 28 allocated
(utilisation 1.17). The division counted x's running GPUs, not the bound ones: 28 CU, while the
cycle counts c's binding in c's allocation. Both now count what work holds on x, running or bound
(30), and agree with each other; each end on x gives its GPUs back to no one.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry
from sqlalchemy import Engine

from gpufair.api.server import build_server
from gpufair.api.state_metrics import StateCollector
from gpufair.client import GpufairClient
from gpufair.config_file import parse_config
from gpufair.v1 import ledger_pb2, scheduler_pb2

CONFIG = {
    "gpu_types": [{"name": "unit", "memory_gib": 40, "compute_weight": 1}],
    "pools": [{"name": "main", "policy": {"window_s": "7d", "k": 1, "recompute_interval_s": 60}}],
    "nodes": [
        {
            "name": name,
            "pool": "main",
            "gpu_type": "unit",
            "gpu_count": 8,
            "cpu_millicores": 64000,
            "memory_mib": 524288,
        }
        for name in ("w", "x", "y", "z")
    ],
    "queues": [
        {"name": "a", "quotas": [{"pool": "main", "deserved_cu": 12}]},
        {"name": "b", "quotas": [{"pool": "main", "deserved_cu": 0}]},
        {"name": "c", "quotas": [{"pool": "main", "deserved_cu": 8}]},
    ],
}

# uid: (queue, GPUs of its one pod, node, first GPU index)
RUNNING = {
    "a-w": ("a", 8, "w", 0),
    "b-y": ("b", 8, "y", 0),
    "b-z": ("b", 8, "z", 0),
    "c-x": ("c", 4, "x", 0),
}
LABELS = {"pool": "main", "gpu_type": "unit"}


class Clock:
    def __init__(self, now_s: float) -> None:
        self.now_s = now_s

    def __call__(self) -> float:
        return self.now_s


@pytest.fixture
def clock() -> Clock:
    return Clock(time.time())


@pytest.fixture
def gpufair(db: Engine, clock: Clock) -> Iterator[GpufairClient]:
    server = build_server(db, "127.0.0.1:0", max_workers=4, clock=clock)
    try:
        with GpufairClient(f"127.0.0.1:{server.port}", attempts=1, timeout_s=60) as c:
            yield c
    finally:
        server.stop(0.5)


@pytest.fixture
def registry(db: Engine) -> CollectorRegistry:
    registry = CollectorRegistry()
    registry.register(StateCollector(db, cache_s=0.0))
    return registry


def _event(
    kind: int, uid: str, at_s: float, pod: tuple[str, list[int]] | None = None
) -> ledger_pb2.LedgerEvent:
    msg = ledger_pb2.LedgerEvent(event_id=str(uuid.uuid4()), workload_uid=uid, kind=kind)  # type: ignore[arg-type]
    msg.occurred_at.FromNanoseconds(round(at_s * 1e9))
    if pod is not None:
        msg.pods.add(node=pod[0], gpu_indices=pod[1], gpu_fraction=1.0)
    return msg


def _report(c: GpufairClient, *events: ledger_pb2.LedgerEvent) -> None:
    reply = c.ledger.ReportEvents(ledger_pb2.ReportEventsRequest(events=events), timeout=30)
    assert all(r.status == ledger_pb2.EVENT_STATUS_STORED for r in reply.results), reply


def _schedule(c: GpufairClient) -> scheduler_pb2.ScheduleResponse:
    return c.scheduler.Schedule(scheduler_pb2.ScheduleRequest(pool="main"), timeout=60)


def _gauges(registry: CollectorRegistry) -> tuple[float | None, ...]:
    """Capacity GPUs and CU, allocated GPUs, and the capacity the latest recompute divided."""
    return (
        registry.get_sample_value("gpufair_pool_capacity_gpus", LABELS),
        registry.get_sample_value("gpufair_pool_capacity_cu", LABELS),
        registry.get_sample_value("gpufair_pool_allocated_gpus", LABELS),
        registry.get_sample_value("gpufair_pool_fair_share_capacity_cu", {"pool": "main"}),
    )


def test_capacity_gauges_and_the_division_count_what_work_holds_on_a_drained_node(
    gpufair: GpufairClient, clock: Clock, registry: CollectorRegistry
) -> None:
    gpufair.apply_config(parse_config(CONFIG))
    workloads = [
        scheduler_pb2.Workload(uid=uid, queue=q, pool="main", pods=1, gpus_per_pod=gpus)
        for uid, (q, gpus, _node, _first) in RUNNING.items()
    ]
    workloads.append(
        scheduler_pb2.Workload(uid="c-two", queue="c", pool="main", pods=1, gpus_per_pod=2)
    )
    reply = gpufair.scheduler.SubmitWorkloads(
        scheduler_pb2.SubmitWorkloadsRequest(workloads=workloads), timeout=30
    )
    assert all(r.accepted for r in reply.results), [r.error for r in reply.results]
    _report(
        gpufair,
        *(
            _event(ledger_pb2.EVENT_KIND_STARTED, uid, clock.now_s, (node, list(range(f, f + n))))
            for uid, (_q, n, node, f) in RUNNING.items()
        ),
    )
    clock.now_s += 1
    first = _schedule(gpufair)
    assert [(b.uid, [p.node for p in b.pods]) for b in first.binds] == [("c-two", ["x"])]
    assert _gauges(registry) == (32.0, 32.0, 28.0, 32.0)

    assert gpufair.set_nodes_ready(["x"], False).applied
    # x's 2 free GPUs leave; its 4 running and 2 bound stay: 30 (before: 24 against 28
    # allocated, utilisation 1.17).
    assert _gauges(registry)[:3] == (30.0, 30.0, 28.0)
    clock.now_s += 61  # past the recompute interval: the next cycle recomputes the shares
    after = _schedule(gpufair)
    assert list(after.binds) == [] and list(after.evicts) == []
    # The division counts the binding too (before: 28 CU), as the gauges do.
    assert gpufair.get_fair_share("main").capacity_cu == 30.0
    assert _gauges(registry) == (30.0, 30.0, 28.0, 30.0)

    # The batch system starts c-two on x after all: nothing changes but the allocation.
    _report(gpufair, _event(ledger_pb2.EVENT_KIND_STARTED, "c-two", clock.now_s, ("x", [4, 5])))
    assert _gauges(registry)[:3] == (30.0, 30.0, 30.0)
    # c-x stops: its 4 GPUs on x leave the capacity with it.
    _report(gpufair, _event(ledger_pb2.EVENT_KIND_STOPPED, "c-x", clock.now_s + 1))
    assert _gauges(registry)[:3] == (26.0, 26.0, 26.0)
    clock.now_s += 61
    _schedule(gpufair)
    assert gpufair.get_fair_share("main").capacity_cu == 26.0
    assert _gauges(registry) == (26.0, 26.0, 26.0, 26.0)


def test_a_binding_released_on_a_drained_node_leaves_the_capacity(
    gpufair: GpufairClient, clock: Clock, registry: CollectorRegistry
) -> None:
    """c-two bound on x, x drained, and the batch system never starts it: at the first cycle
    past the bind timeout (300 s) its binding is released, and its 2 GPUs leave the capacity
    (x's free GPUs take no new work); it waits again, counted as pending demand."""
    gpufair.apply_config(parse_config(CONFIG))
    workloads = [
        scheduler_pb2.Workload(uid=uid, queue=q, pool="main", pods=1, gpus_per_pod=gpus)
        for uid, (q, gpus, _node, _first) in RUNNING.items()
    ]
    workloads.append(
        scheduler_pb2.Workload(uid="c-two", queue="c", pool="main", pods=1, gpus_per_pod=2)
    )
    gpufair.scheduler.SubmitWorkloads(
        scheduler_pb2.SubmitWorkloadsRequest(workloads=workloads), timeout=30
    )
    _report(
        gpufair,
        *(
            _event(ledger_pb2.EVENT_KIND_STARTED, uid, clock.now_s, (node, list(range(f, f + n))))
            for uid, (_q, n, node, f) in RUNNING.items()
        ),
    )
    clock.now_s += 1
    assert [b.uid for b in _schedule(gpufair).binds] == ["c-two"]
    assert gpufair.set_nodes_ready(["x"], False).applied
    assert _gauges(registry)[:3] == (30.0, 30.0, 28.0)
    clock.now_s += 301
    released = _schedule(gpufair)
    assert [p.uid for p in released.pending] == ["c-two"]
    assert _gauges(registry) == (28.0, 28.0, 28.0, 28.0)
