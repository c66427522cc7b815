"""A stale close against a stop the batch system reports later than it, on PostgreSQL.

Workload `late` runs on node a1's 8 A100 (80 CU) since NOW - 1 h, its last heartbeat at NOW - 20
min: a sweep at NOW (stale after 10 min) closes the run there. The batch system was cut off; back,
it reports the run preempted at NOW - 5 min. A stop is a sign of life at its instant, as a
heartbeat is: the run ends at the stop, as it would had the stop come before the sweep, and a
restart after the stop leaves that end where it is.
"""

from __future__ import annotations

import uuid

from sqlalchemy import Engine, text

from gpufair.domain.ledger import EventKind, EventPod, LedgerEvent
from gpufair.services.sweep import sweep
from gpufair.store import ingest_pipeline
from gpufair.store.ingest_pipeline import EventStatus
from tests.store.test_rollups import NOW
from tests.store.test_sweep_race import _late_running


def _ingest(db: Engine, kind: EventKind, at_s: float, pods: tuple[EventPod, ...] = ()) -> None:
    event = LedgerEvent(str(uuid.uuid4()), kind, at_s, "late", pods)
    with db.begin() as conn:
        assert ingest_pipeline.ingest(conn, [event], NOW)[0].status is EventStatus.STORED


def _runs(db: Engine) -> list[tuple[float, float | None, str | None, str]]:
    """`late`'s runs: start, end, how it ended; and the workload's state."""
    with db.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT extract(epoch FROM i.started_at)::float8, "
                "extract(epoch FROM i.ended_at)::float8, i.end_kind, w.state "
                "FROM allocation_intervals i JOIN workloads w ON w.uid = i.workload_uid "
                "WHERE i.workload_uid = 'late' ORDER BY i.started_at"
            )
        )
        return [(r[0], r[1], r[2], r[3]) for r in rows]


def _sweep(db: Engine, now_s: float = NOW) -> int:
    with db.begin() as conn:
        return sweep(conn, now_s, stale_after_s=600).closed


def test_a_stop_after_the_sweep_ends_the_run_as_before_it(db: Engine) -> None:
    _late_running(db)
    assert _sweep(db) == 1
    assert _runs(db) == [(NOW - 3600, NOW - 1200, "stale", "finished")]
    _ingest(db, EventKind.PREEMPTED, NOW - 300)
    assert _runs(db) == [(NOW - 3600, NOW - 300, "preempted", "pending")]
    assert _sweep(db, NOW + 600) == 0


def test_a_restart_leaves_the_end_of_a_revived_run_where_it_was(db: Engine) -> None:
    """Revived by a heartbeat at NOW - 10 min, preempted at NOW - 5 min: the run ends there.
    Restarted at NOW - 2 min with a heartbeat at NOW - 1 min: the first run keeps its end (the
    start between the close and the latest heartbeat does not bring the close back)."""
    _late_running(db)
    assert _sweep(db) == 1
    _ingest(db, EventKind.HEARTBEAT, NOW - 600)
    _ingest(db, EventKind.PREEMPTED, NOW - 300)
    assert _runs(db) == [(NOW - 3600, NOW - 300, "preempted", "pending")]
    _ingest(db, EventKind.STARTED, NOW - 120, (EventPod("a1", (0,)),))
    _ingest(db, EventKind.HEARTBEAT, NOW - 60)
    _ingest(db, EventKind.STOPPED, NOW - 10)
    assert _runs(db) == [
        (NOW - 3600, NOW - 300, "preempted", "finished"),
        (NOW - 120, NOW - 10, "stopped", "finished"),
    ]
