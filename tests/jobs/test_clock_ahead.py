"""A replica whose clock runs ahead of the database's: its periodic jobs must not act on a future.

Pool `p` (sliding 1-day window, no decay). Workload `done` ran 8 A100 from T - 175 d to T - 170
d: its 2 events are inside the 180-day event retention. Workload `live` runs 8 A100 (80 CU) on
node a1 since T - 1 h, its latest heartbeat at T - 60 s: alive for a sweep stale after 600 s.
One replica's clock is 30 days ahead (a host whose clock jumped); its tick must leave both alone,
store the fair shares as of the database's time, and claim no period of the future.
"""

from __future__ import annotations

import time
import uuid

import pytest
from sqlalchemy import Engine, text

from gpufair.domain.ledger import EventKind, EventPod, LedgerEvent
from gpufair.domain.model import Workload
from gpufair.jobs.runner import JobSettings, PeriodicJobs
from gpufair.store import fairshare_repo, ingest_pipeline, workload_repo
from gpufair.store.ingest_pipeline import EventStatus
from tests.store.test_rollups import POLICIES, install, make_config

DAY = 86400.0


def _history(db: Engine, now_s: float) -> None:
    pods = (EventPod("a1", tuple(range(8))),)
    events = [
        LedgerEvent(str(uuid.uuid4()), EventKind.STARTED, now_s - 175 * DAY, "done", pods),
        LedgerEvent(str(uuid.uuid4()), EventKind.STOPPED, now_s - 170 * DAY, "done"),
        LedgerEvent(str(uuid.uuid4()), EventKind.STARTED, now_s - 3600, "live", pods),
        LedgerEvent(str(uuid.uuid4()), EventKind.HEARTBEAT, now_s - 60, "live"),
    ]
    with db.begin() as conn:
        install(conn, make_config(POLICIES["sliding-1d-no-decay"]), now_s - 200 * DAY)
        workload_repo.submit(
            conn,
            [
                Workload("done", "c", "p", 1, 8, now_s - 176 * DAY),
                Workload("live", "c", "p", 1, 8, now_s - 7200),
            ],
        )
        stored = ingest_pipeline.ingest(conn, events, now_s)
        assert [o.status for o in stored] == [EventStatus.STORED] * 4


def test_a_replica_ahead_of_the_database_acts_at_the_database_time(db: Engine) -> None:
    now_s = time.time()
    _history(db, now_s)
    ahead = PeriodicJobs(db, JobSettings(), clock=lambda: now_s + 30 * DAY, replica="ahead")
    ahead.tick()
    after_s = time.time()
    with db.connect() as conn:
        done_events = conn.execute(
            text("SELECT count(*) FROM ledger_events WHERE workload_uid = 'done'")
        ).scalar_one()
        live = conn.execute(
            text(
                "SELECT i.ended_at, i.end_kind, i.cu, w.state FROM allocation_intervals i "
                "JOIN workloads w ON w.uid = i.workload_uid WHERE i.workload_uid = 'live'"
            )
        ).one()
        run = fairshare_repo.latest_run(conn, "p")
        latest_claim = conn.execute(
            text("SELECT max(extract(epoch FROM period_start))::float8 FROM job_claims")
        ).scalar_one()
        outcomes = dict(conn.execute(text("SELECT job, outcome FROM job_claims")).all())
    # Retention at T + 30 d would have removed `done`'s events (200 days old by that clock).
    assert done_events == 2
    assert outcomes["retention"] == "ok: "  # nothing was old enough
    # The sweep at T + 30 d would have closed `live` at its heartbeat of T - 60 s.
    assert tuple(live) == (None, None, 80.0, "running")
    assert outcomes["sweep"] == "ok: 0 stale runs closed, 0 reopened"
    # The fair shares are stamped with the database's time, not 30 days ahead.
    assert run is not None and now_s - 1 <= run.computed_at_s <= after_s + 1
    assert {s.queue: s.allocated_cu for s in run.shares}["c"] == pytest.approx(80.0)
    assert latest_claim <= after_s
