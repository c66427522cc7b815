"""The stale sweeper against heartbeats that arrive while it works, on PostgreSQL.

Workload `late` runs on 8 A100 (80 CU) since NOW - 1 h, its last stored heartbeat at NOW - 20
min: silent for a sweeper at NOW (stale after 10 min), which would close the run at NOW - 20 min,
80 CU x 40 min = 53.3 CU-hours in all. A heartbeat at NOW - 1 min that the batch system has been
told is stored before the sweep's commit must keep the run open. The sweeper and every ingest of
heartbeats take `locks.SWEEP` (exclusive, shared) first; each case below parks one of the two on
it and checks in `pg_stat_activity` that it waits there before letting the other go on.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable

from sqlalchemy import Connection, Engine, text

from gpufair.domain.ledger import EventKind, EventPod, LedgerEvent
from gpufair.domain.model import Workload
from gpufair.services.sweep import sweep
from gpufair.store import ingest_pipeline, workload_repo
from gpufair.store.ingest_pipeline import EventStatus
from tests.lock_waits import until, waiting_on_locks
from tests.store.test_rollups import HOUR, NOW, _first_rollup_race_setup


def _late_running(db: Engine, *, beat: bool = True) -> None:
    """`late` started on node a1's 8 GPUs at NOW - 1 h, a heartbeat at NOW - 20 min (`beat`);
    workload `other` (queue c, pool p) submitted, not started."""
    _first_rollup_race_setup(db)
    pods = (EventPod("a1", tuple(range(8))),)
    events = [LedgerEvent(str(uuid.uuid4()), EventKind.STARTED, NOW - HOUR, "late", pods)]
    if beat:
        events.append(LedgerEvent(str(uuid.uuid4()), EventKind.HEARTBEAT, NOW - 1200, "late"))
    with db.begin() as conn:
        workload_repo.submit(conn, [Workload("other", "c", "p", 1, 1, NOW - 600)])
        stored = ingest_pipeline.ingest(conn, events, NOW)
        assert [o.status for o in stored] == [EventStatus.STORED] * len(events)


def _in_thread(db: Engine, work: Callable[..., object], results: list[object]) -> threading.Thread:
    """`work(conn)` in a transaction of its own on another thread; its result (or the exception
    it raised) goes into `results` once committed."""

    def run() -> None:
        try:
            with db.begin() as conn:
                result = work(conn)
            results.append(result)
        except BaseException as exc:
            results.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def _sweep(conn: Connection) -> int:
    return sweep(conn, NOW, stale_after_s=600).closed


def _late_run(db: Engine) -> tuple[float | None, float, str, float]:
    """`late`'s run: its end, its CU, the workload's state, its CU-hours up to NOW."""
    with db.connect() as conn:
        row = conn.execute(
            text(
                "SELECT extract(epoch FROM i.ended_at)::float8, i.cu, w.state, "
                "i.cu * (COALESCE(extract(epoch FROM i.ended_at)::float8, :now) "
                "- extract(epoch FROM i.started_at)::float8) / 3600 "
                "FROM allocation_intervals i JOIN workloads w ON w.uid = i.workload_uid "
                "WHERE i.workload_uid = 'late'"
            ),
            {"now": NOW},
        ).one()
    return row[0], row[1], row[2], row[3]


def _beat() -> LedgerEvent:
    return LedgerEvent(str(uuid.uuid4()), EventKind.HEARTBEAT, NOW - 60, "late")


def test_heartbeat_acknowledged_while_the_sweeper_works_keeps_its_run_open(
    db: Engine,
) -> None:
    """The heartbeat's batch also starts `other`, whose row a cycle holds: the batch is parked in
    its read, past its first lock, when the sweeper starts. The sweeper waits for it; the batch
    is acknowledged while the sweeper still waits, and the sweeper then reads its heartbeat and
    closes nothing: the run stays open, 80 CU, `late` running (80 CU-hours up to NOW). At BASE,
    where the sweeper read without waiting, it closed the run at NOW - 20 min (53.3 CU-hours)."""
    _late_running(db)
    started = LedgerEvent(
        str(uuid.uuid4()), EventKind.STARTED, NOW - 30, "other", (EventPod("a2", (0, 1)),)
    )
    batch: list[object] = []
    closed: list[object] = []
    with db.connect() as cycle:
        cycle.execute(text("SELECT 1 FROM workloads WHERE uid = 'other' FOR UPDATE"))
        beating = _in_thread(
            db, lambda c: ingest_pipeline.ingest(c, [_beat(), started], NOW), batch
        )
        until(lambda: waiting_on_locks(db) == 1, "the heartbeat's batch never reached the row")
        sweeping = _in_thread(db, _sweep, closed)
        until(
            lambda: waiting_on_locks(db, "advisory") == 1, "the sweeper never waited for the batch"
        )
        cycle.rollback()
    beating.join(timeout=30)
    outcomes = batch[0]
    assert isinstance(outcomes, list)
    assert [o.status for o in outcomes] == [EventStatus.STORED] * 2
    # The sweeper was seen waiting before the batch could go on, so the batch committed while it
    # waited; once it has, the sweeper may finish at any moment (no check of `closed` here).
    sweeping.join(timeout=30)
    assert closed == [0]
    assert _late_run(db) == (None, 80.0, "running", 80.0)


def test_heartbeat_in_flight_when_the_sweep_starts_keeps_its_run_open(db: Engine) -> None:
    """The heartbeat is stored but not committed (its caller has not acknowledged it yet) when
    the sweep starts: the sweeper waits for the commit, then sees it and closes nothing. The
    run stays open, 80 CU, `late` running (80 CU-hours up to NOW)."""
    _late_running(db)
    closed: list[object] = []
    with db.begin() as conn:
        assert ingest_pipeline.ingest(conn, [_beat()], NOW)[0].status is EventStatus.STORED
        sweeping = _in_thread(db, _sweep, closed)
        until(
            lambda: waiting_on_locks(db, "advisory") == 1, "the sweeper never waited for the batch"
        )
        assert closed == []
    sweeping.join(timeout=30)
    assert closed == [0]
    assert _late_run(db) == (None, 80.0, "running", 80.0)


def test_heartbeat_arriving_during_a_sweep_is_acknowledged_after_it(db: Engine) -> None:
    """The sweeper has read the silent runs and waits for `late`'s row (a cycle holds it) when a
    heartbeat at NOW - 1 min comes: its batch waits for the sweeper's commit, which closes the run
    at NOW - 20 min (80 CU, 53.3 CU-hours, `late` finished); only then is the heartbeat stored and
    acknowledged. It does not reopen the run there: the next sweep does (the heartbeat voids the
    close), and `late` is running again, 80 CU-hours up to NOW (`test_sweep_revive.py`)."""
    _late_running(db)
    closed: list[object] = []
    batch: list[object] = []
    with db.connect() as cycle:
        cycle.execute(text("SELECT 1 FROM workloads WHERE uid = 'late' FOR UPDATE"))
        sweeping = _in_thread(db, _sweep, closed)
        until(lambda: waiting_on_locks(db) == 1, "the sweeper never reached the workload")
        beating = _in_thread(db, lambda c: ingest_pipeline.ingest(c, [_beat()], NOW), batch)
        until(
            lambda: waiting_on_locks(db, "advisory") == 1,
            "the heartbeat never waited for the sweep",
        )
        assert batch == []
        cycle.rollback()
    sweeping.join(timeout=30)
    beating.join(timeout=30)
    assert closed == [1]
    outcomes = batch[0]
    assert isinstance(outcomes, list) and outcomes[0].status is EventStatus.STORED
    ended, cu, state, cu_hours = _late_run(db)
    assert (ended, cu, state) == (NOW - 1200, 80.0, "finished")
    assert round(cu_hours, 1) == 53.3
    with db.begin() as conn:
        assert _sweep(conn) == 0
    assert _late_run(db) == (None, 80.0, "running", 80.0)


def test_silent_run_without_heartbeats_is_closed_at_its_start(db: Engine) -> None:
    """`late` started at NOW - 1 h and never sent a heartbeat, while heartbeats of `other`
    (unstarted) keep coming: the sweep closes `late`'s run at its start (1 run, 0 CU-hours),
    and a second sweep closes nothing."""
    _late_running(db, beat=False)
    with db.begin() as conn:
        ingest_pipeline.ingest(
            conn, [LedgerEvent(str(uuid.uuid4()), EventKind.HEARTBEAT, NOW - 5, "other")], NOW
        )
    with db.begin() as conn:
        assert sweep(conn, NOW, stale_after_s=600) == (1, 0)
    with db.begin() as conn:
        assert sweep(conn, NOW, stale_after_s=600) == (0, 0)
    assert _late_run(db) == (NOW - HOUR, 80.0, "finished", 0.0)
