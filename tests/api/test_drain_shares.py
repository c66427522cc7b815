"""A node drained while work runs on it, through a server: the shares, GetFairShare and the
next cycles (`capacity_history.division_capacity`).

Pool `main`, four nodes of 8 `unit` GPUs (1 CU each, so CU read as GPUs). Queue c (deserved 8)
runs 8 GPUs on x, in quota; b (deserved 0) runs 8 on y and 4 on z; a (deserved 12) runs 2 on z
and 6 on w and waits for a 4-GPU pod the 4 free GPUs (2 on z, 2 on w) cannot hold; b waits for 4
more. The operator drains x for maintenance while c's job still runs there.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pytest
from sqlalchemy import Engine

from gpufair.api.server import build_server
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

# uid: (queue, GPUs of its one pod, node, first GPU index, preemptible)
RUNNING = {
    "c-x": ("c", 8, "x", 0, False),
    "b-y": ("b", 8, "y", 0, True),
    "b-z": ("b", 4, "z", 0, True),
    "a-z": ("a", 2, "z", 4, True),
    "a-w": ("a", 6, "w", 0, True),
}
PENDING = {"a-four": ("a", 4), "b-more": ("b", 4)}


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


def _event(kind: int, uid: str, at_s: float) -> ledger_pb2.LedgerEvent:
    msg = ledger_pb2.LedgerEvent(event_id=str(uuid.uuid4()), workload_uid=uid, kind=kind)  # type: ignore[arg-type]
    msg.occurred_at.FromNanoseconds(round(at_s * 1e9))
    if kind == ledger_pb2.EVENT_KIND_STARTED:
        _queue, gpus, node, first, _preemptible = RUNNING[uid]
        msg.pods.add(node=node, gpu_indices=list(range(first, first + gpus)), gpu_fraction=1.0)
    return msg


def _report(c: GpufairClient, *events: ledger_pb2.LedgerEvent) -> None:
    reply = c.ledger.ReportEvents(ledger_pb2.ReportEventsRequest(events=events), timeout=30)
    assert all(r.status == ledger_pb2.EVENT_STATUS_STORED for r in reply.results), reply


def _start(c: GpufairClient, clock: Clock) -> None:
    c.apply_config(parse_config(CONFIG))
    workloads = [
        scheduler_pb2.Workload(
            uid=uid, queue=q, pool="main", pods=1, gpus_per_pod=gpus, preemptible=preemptible
        )
        for uid, (q, gpus, _node, _first, preemptible) in RUNNING.items()
    ]
    workloads += [
        scheduler_pb2.Workload(uid=uid, queue=q, pool="main", pods=1, gpus_per_pod=gpus)
        for uid, (q, gpus) in PENDING.items()
    ]
    reply = c.scheduler.SubmitWorkloads(
        scheduler_pb2.SubmitWorkloadsRequest(workloads=workloads), timeout=30
    )
    assert all(r.accepted for r in reply.results), [r.error for r in reply.results]
    # The batch system started these itself (min_runtime 0: reclaim may take them at once).
    _report(c, *(_event(ledger_pb2.EVENT_KIND_STARTED, uid, clock.now_s) for uid in RUNNING))


def _schedule(c: GpufairClient) -> scheduler_pb2.ScheduleResponse:
    return c.scheduler.Schedule(scheduler_pb2.ScheduleRequest(pool="main"), timeout=60)


def _shares(c: GpufairClient) -> tuple[float, dict[str, tuple[float, float]]]:
    """The latest recompute's capacity, and (allocated, fair share) CU per queue."""
    reply = c.get_fair_share("main")
    return reply.capacity_cu, {q.queue: (q.allocated_cu, q.fair_share_cu) for q in reply.queues}


def test_drain_for_maintenance_evicts_nobody_elsewhere(
    gpufair: GpufairClient, clock: Clock
) -> None:
    _start(gpufair, clock)
    clock.now_s += 1
    first = _schedule(gpufair)
    assert list(first.binds) == [] and list(first.evicts) == []
    reasons = {p.uid: p.reason_code for p in first.pending}
    assert reasons == {"a-four": "no_capacity", "b-more": "over_fair_share"}
    before = _shares(gpufair)
    assert before == (32.0, {"a": (8.0, 12.0), "b": (12.0, 12.0), "c": (8.0, 8.0)})

    drained = gpufair.set_nodes_ready(["x"], False)
    assert drained.applied
    clock.now_s += 61  # past the recompute interval: the next cycle recomputes the shares
    after = _schedule(gpufair)
    # c's job still holds x's 8 GPUs: the division counts them, b keeps its 12 CU share and
    # nothing of b's (on y and z, untouched by the drain) is reclaimed for a.
    assert [(e.uid, e.reason) for e in after.evicts] == []
    assert list(after.binds) == []
    assert {p.uid: p.reason_code for p in after.pending} == reasons
    assert _shares(gpufair) == before
    # Why a's pod waits: as before the drain, no room on the 3 ready nodes; x is not ready.
    explained = gpufair.explain("a-four")
    assert explained.reason_code == "no_capacity"
    assert explained.queue_share.fair_share_cu == 12.0
    failed = {f.filter: f.nodes_failed for f in explained.filters if f.nodes_failed}
    assert failed == {"not_ready": 1, "free_gpus": 3}

    # c's job ends: x's GPUs leave the division (24 CU), c wants nothing, nothing moves.
    clock.now_s += 30
    _report(gpufair, _event(ledger_pb2.EVENT_KIND_STOPPED, "c-x", clock.now_s))
    clock.now_s += 61  # this clock runs ahead of the database's: the interval recomputes
    ended = _schedule(gpufair)
    assert list(ended.evicts) == [] and list(ended.binds) == []  # nothing is placed on x
    assert _shares(gpufair) == (24.0, {"a": (8.0, 12.0), "b": (12.0, 12.0), "c": (0.0, 0.0)})
