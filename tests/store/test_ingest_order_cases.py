"""Outcomes that once depended on the order events arrive in, or on how they are grouped in
messages, each the smallest case, on PostgreSQL (node capacity reports: more cases in
`test_capacity_history.py`).

Workload w0 starts at NOW - 300 on a0's GPU 0, is preempted at NOW - 200, and restarts at
NOW - 100 on GPU 1: runs [NOW - 300, NOW - 200) and [NOW - 100, open).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from sqlalchemy import Connection, Engine, text

from gpufair.domain.ledger import EventKind, EventPod, LedgerEvent, WorkloadState
from gpufair.store import ingest_pipeline, workload_repo
from tests.store.ingest_support import NOW, STORED, one_pool_connection


@pytest.fixture
def conn(db: Engine) -> Iterator[Connection]:
    yield from one_pool_connection(db, nodes=2)


def _event(kind: EventKind, at: float, gpu: int | None = None, node: str = "a0") -> LedgerEvent:
    pods = (EventPod(node, (gpu,)),) if gpu is not None else ()
    return LedgerEvent(str(uuid.uuid4()), kind, at, "w0", pods)


def _runs(conn: Connection) -> list[tuple[float, float | None, str | None]]:
    rows = conn.execute(
        text(
            "SELECT extract(epoch FROM started_at)::float8 - :now, "
            "extract(epoch FROM ended_at)::float8 - :now, end_kind FROM allocation_intervals "
            "WHERE workload_uid = 'w0' ORDER BY started_at"
        ),
        {"now": NOW},
    ).all()
    return [(s, e, k) for s, e, k in rows]


def _state(conn: Connection) -> str:
    return str(conn.execute(text("SELECT state FROM workloads WHERE uid = 'w0'")).scalar_one())


def test_a_restart_arriving_before_the_preemption_and_the_first_start(conn: Connection) -> None:
    first = _event(EventKind.STARTED, NOW - 300, gpu=0)
    preempted = _event(EventKind.PREEMPTED, NOW - 200)
    restart = _event(EventKind.STARTED, NOW - 100, gpu=1)
    for event in (restart, preempted, first):
        [outcome] = ingest_pipeline.ingest(conn, [event], NOW)
        assert (outcome.status, outcome.error) == (STORED, "")
    assert _runs(conn) == [(-300, -200, "preempted"), (-100, None, None)]


def test_a_cancelled_workload_ends_as_cancelled_whichever_messages_its_events_came_in(
    conn: Connection,
) -> None:
    """Cancelled while its start was on its way; the batch system reports it started, then
    ended. It runs while its run is open, and is cancelled again once that ends, never pending
    (to be scheduled anew) nor finished, whether the events came in one message or one each.
    A workload not cancelled goes back to pending after a preemption, as before."""
    for uid in ("w0", "w1", "w2"):
        assert workload_repo.cancel(conn, uid) is WorkloadState.PENDING

    def started(uid: str) -> LedgerEvent:
        return _event(EventKind.STARTED, NOW - 300, gpu=int(uid[1]))._replace(workload_uid=uid)

    def ended(uid: str, kind: EventKind) -> LedgerEvent:
        return _event(kind, NOW - 200)._replace(workload_uid=uid)

    ingest_pipeline.ingest(conn, [started("w1"), ended("w1", EventKind.PREEMPTED)], NOW)
    ingest_pipeline.ingest(conn, [started("w0")], NOW)
    ingest_pipeline.ingest(conn, [started("w2")], NOW)
    ingest_pipeline.ingest(conn, [started("w3")], NOW)
    assert _states(conn) == {"w0": "running", "w1": "cancelled", "w2": "running", "w3": "running"}
    ingest_pipeline.ingest(conn, [ended("w0", EventKind.PREEMPTED)], NOW)
    ingest_pipeline.ingest(conn, [ended("w2", EventKind.STOPPED)], NOW)
    ingest_pipeline.ingest(conn, [ended("w3", EventKind.PREEMPTED)], NOW)
    assert _states(conn) == {
        "w0": "cancelled",
        "w1": "cancelled",
        "w2": "cancelled",
        "w3": "pending",
    }
    # Their usage counts all the same: each ran 100 s on one GPU.
    ran = conn.execute(
        text(
            "SELECT workload_uid, extract(epoch FROM ended_at - started_at)::float8 "
            "FROM allocation_intervals ORDER BY workload_uid"
        )
    ).all()
    assert [(u, s) for u, s in ran] == [("w0", 100.0), ("w1", 100.0), ("w2", 100.0), ("w3", 100.0)]


def _states(conn: Connection) -> dict[str, str]:
    rows = conn.execute(text("SELECT uid, state FROM workloads ORDER BY uid")).all()
    return {u: s for u, s in rows}


def _capacity(conn: Connection) -> list[tuple[float, float]]:
    rows = conn.execute(
        text(
            "SELECT extract(epoch FROM changed_at)::float8 - :now, capacity_cu "
            "FROM pool_capacity_changes WHERE pool = 'p' AND source = 'node_capacity' "
            "ORDER BY changed_at"
        ),
        {"now": NOW},
    ).all()
    return [(at, cu) for at, cu in rows]


def test_node_capacity_events_of_two_nodes_in_either_order(conn: Connection) -> None:
    """a0 down to 6 GPUs at NOW - 100, a1 down to 4 at NOW - 200 (pool of 2 x 8 A100, 10 CU
    each): 120 CU from NOW - 200, 100 CU from NOW - 100, in either order."""
    a0 = LedgerEvent(str(uuid.uuid4()), EventKind.NODE_CAPACITY, NOW - 100, node="a0", gpu_count=6)
    a1 = LedgerEvent(str(uuid.uuid4()), EventKind.NODE_CAPACITY, NOW - 200, node="a1", gpu_count=4)
    for event in (a0, a1):
        [outcome] = ingest_pipeline.ingest(conn, [event], NOW)
        assert outcome.status is STORED
    assert _capacity(conn) == [(-200, 120.0), (-100, 100.0)]
