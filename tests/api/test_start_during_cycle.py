"""A batch system may start a workload on pods of its own choosing, also while a `Schedule` cycle
of its pool is deciding (the ledger takes what really ran). When the start takes GPUs the cycle
binds elsewhere, the later decision is withdrawn: its workload waits again with the reason, and
the ledger never shows two workloads on one GPU (store/bind_overlaps.py, domain/overlap.py).

The races are made deterministic: the start is committed from another connection at a chosen
statement of the cycle, or between two cycles."""

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


def start(db: Engine, uid: str, gpus: tuple[int, ...]) -> None:
    """The batch system's `started` of `uid` on GPUs `gpus` of n0, committed on its own."""
    started = LedgerEvent(
        str(uuid.uuid4()), EventKind.STARTED, time.time(), uid, (EventPod("n0", gpus),)
    )
    with db.connect() as conn:
        [outcome] = ingest_pipeline.ingest(conn, [started], time.time())
        conn.commit()
    assert outcome.status.value == "stored", outcome.error


def gpu_use(db: Engine) -> dict[tuple[str, int], list[str]]:
    """Who holds each GPU in the ledger's view: bound decisions and open runs."""
    with db.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT uid, binding->'pods' FROM workloads WHERE state = 'bound' UNION ALL "
                "SELECT workload_uid, pods FROM allocation_intervals WHERE ended_at IS NULL"
            )
        ).all()
    use: dict[tuple[str, int], list[str]] = defaultdict(list)
    for uid, pods in rows:
        for pod in pods:
            for index in pod["gpu_indices"]:
                use[(pod["node"], index)].append(uid)
    return use


def states(db: Engine) -> dict[str, str]:
    with db.connect() as conn:
        return dict(conn.execute(text("SELECT uid, state FROM workloads")).all())  # type: ignore[arg-type]


@pytest.fixture
def at_bind_write(db: Engine) -> Iterator[dict[str, Any]]:
    """Arm with `armed["run"]`: called once, just before the next cycle writes its binds (after
    its snapshot and its decisions), from the server's thread."""
    armed: dict[str, Any] = {}

    def inject(conn: Any, cursor: Any, statement: str, *_: Any) -> None:
        if "SET state = 'bound'" in statement and "run" in armed:
            armed.pop("run")()
            armed["fired"] = True

    event.listen(db, "before_cursor_execute", inject)
    try:
        yield armed
    finally:
        event.remove(db, "before_cursor_execute", inject)


def test_a_start_committed_mid_cycle_withdraws_the_cycles_bind_onto_its_gpus(
    client: GpufairClient, db: Engine, at_bind_write: dict[str, Any]
) -> None:
    client.apply_config(parse_config(CLUSTER))
    client.submit_workloads([whole_node("planned")])

    def batch_system_starts_rogue() -> None:
        # Submitted and started on GPUs 2 and 3 by the batch system while the cycle decides.
        client.submit_workloads([whole_node("rogue")])
        start(db, "rogue", (2, 3))

    at_bind_write["run"] = batch_system_starts_rogue
    reply = client.schedule("main")
    assert at_bind_write.get("fired")

    assert list(reply.binds) == []  # the cycle had chosen n0 for `planned`: withdrawn
    pending = {p.uid: p for p in reply.pending}
    assert pending["planned"].reason_code == "gpus_taken_during_cycle"
    assert "rogue" in pending["planned"].message and "node n0" in pending["planned"].message
    assert states(db) == {"planned": "pending", "rogue": "running"}
    assert gpu_use(db) == {("n0", 2): ["rogue"], ("n0", 3): ["rogue"]}
    with db.connect() as conn:
        stored = conn.execute(text("SELECT binds FROM schedule_cycles")).scalar_one()
    assert stored == 0

    # The next cycle places `planned` nowhere (GPUs 2 and 3 are taken), and says so normally.
    again = client.schedule("main")
    assert list(again.binds) == []
    assert {p.uid: p.reason_code for p in again.pending}["planned"] != "gpus_taken_during_cycle"


def test_a_start_on_a_committed_bind_withdraws_that_bind(client: GpufairClient, db: Engine) -> None:
    client.apply_config(parse_config(CLUSTER))
    client.submit_workloads([whole_node("planned")])
    first = client.schedule("main")
    assert [b.uid for b in first.binds] == ["planned"]
    client.submit_workloads(
        [scheduler_pb2.Workload(uid="rogue", queue="q", pool="main", pods=1, gpus_per_pod=1)]
    )

    start(db, "rogue", (5,))  # the batch system's own choice, on a GPU bound to `planned`

    assert states(db) == {"planned": "pending", "rogue": "running"}
    assert gpu_use(db) == {("n0", 5): ["rogue"]}


def test_a_start_beside_a_bind_withdraws_nothing(client: GpufairClient, db: Engine) -> None:
    client.apply_config(parse_config(CLUSTER))
    client.submit_workloads(
        [scheduler_pb2.Workload(uid="planned", queue="q", pool="main", pods=1, gpus_per_pod=4)]
    )
    first = client.schedule("main")
    [bind] = first.binds
    taken = set(bind.pods[0].gpu_indices)
    free = tuple(sorted(set(range(8)) - taken))
    client.submit_workloads(
        [scheduler_pb2.Workload(uid="rogue", queue="q", pool="main", pods=1, gpus_per_pod=4)]
    )

    start(db, "rogue", free)

    assert states(db) == {"planned": "bound", "rogue": "running"}
    use = gpu_use(db)
    assert len(use) == 8 and all(len(holders) == 1 for holders in use.values())
