"""A `started` event that commits while a Schedule cycle reads its snapshot must not make the
started workload's GPUs look free (found by bench/load.py: two workloads bound to one GPU).

The race, made deterministic: the event is committed from another connection at the moment the
cycle reads the pool's bound decisions, i.e. after anything it read before that."""

from __future__ import annotations

import time
import uuid
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import Engine, event, text

from gpufair.client import GpufairClient
from gpufair.config_file import parse_config
from gpufair.domain.ledger import EventKind, EventPod, LedgerEvent
from gpufair.store import ingest_pipeline
from gpufair.v1 import scheduler_pb2

CLUSTER = {
    "gpu_types": [{"name": "a100", "memory_gib": 80, "compute_weight": 1}],
    "pools": [{"name": "main"}],
    "nodes": [
        {
            "name": "n0",
            "pool": "main",
            "gpu_type": "a100",
            "gpu_count": 8,
            "cpu_millicores": 64000,
            "memory_mib": 524288,
        }
    ],
    "queues": [{"name": "q", "quotas": [{"pool": "main", "deserved_cu": 8}]}],
}


def whole_node(uid: str) -> scheduler_pb2.Workload:
    return scheduler_pb2.Workload(uid=uid, queue="q", pool="main", pods=1, gpus_per_pod=8)


@pytest.fixture
def start_during_next_cycle(db: Engine) -> Iterator[dict[str, Any]]:
    """Arm with `armed["event"]`: the next time a cycle reads bound decisions, that event is
    ingested and committed first, from a connection of its own."""
    armed: dict[str, Any] = {}

    def inject(conn: Any, cursor: Any, statement: str, *_: Any) -> None:
        if "extract(epoch FROM bound_at)" in statement and "event" in armed:
            started = armed.pop("event")
            with db.connect() as other:
                ingest_pipeline.ingest(other, [started], time.time())
                other.commit()
            armed["fired"] = True

    event.listen(db, "before_cursor_execute", inject)
    try:
        yield armed
    finally:
        event.remove(db, "before_cursor_execute", inject)


def test_a_start_committed_mid_cycle_is_not_double_booked(
    client: GpufairClient, db: Engine, start_during_next_cycle: dict[str, Any]
) -> None:
    client.apply_config(parse_config(CLUSTER))
    client.submit_workloads([whole_node("first")])
    first = client.schedule("main")
    assert [b.uid for b in first.binds] == ["first"]
    pods = tuple(EventPod(p.node, tuple(p.gpu_indices)) for p in first.binds[0].pods)
    client.submit_workloads([whole_node("second")])

    # The batch system starts `first` where it was bound, while the next cycle reads.
    start_during_next_cycle["event"] = LedgerEvent(
        str(uuid.uuid4()), EventKind.STARTED, time.time(), "first", pods
    )
    second = client.schedule("main")
    assert start_during_next_cycle.get("fired")

    assert second.binds == []  # the node is full: `first` runs on all of it
    with db.connect() as conn:
        holders = conn.execute(
            text(
                "SELECT binding->'pods' FROM workloads WHERE state = 'bound' UNION ALL "
                "SELECT pods FROM allocation_intervals WHERE ended_at IS NULL"
            )
        ).scalars()
        use: dict[tuple[str, int], float] = defaultdict(float)
        for held in holders:
            for pod in held:
                for index in pod["gpu_indices"]:
                    use[(pod["node"], index)] += pod["gpu_fraction"]
    assert max(use.values()) == 1.0
