"""The stale sweeper against a heartbeat that arrives while it works, on PostgreSQL."""

from __future__ import annotations

import threading
import uuid

import pytest
from sqlalchemy import Engine, text

from gpufair.domain.ledger import EventKind, EventPod, LedgerEvent
from gpufair.services.sweep import sweep
from gpufair.store import ingest_pipeline
from gpufair.store.ingest_pipeline import EventStatus
from tests.store.test_rollups import (
    HOUR,
    NOW,
    _first_rollup_race_setup,
    _until,
    _waiting_on_locks,
)


@pytest.mark.xfail(
    strict=True,
    reason=(
        "open: a heartbeat takes no lock and changes no run (it is only stored, for the sweeper "
        "to read), so one committed after the sweeper read the silent runs cannot stop the "
        "stale event, and a heartbeat after a stale event does not reopen the run. A fix needs "
        "a design decision: heartbeats that re-derive a stale-closed run (the stale instant "
        "moved to the latest sign of life), or a lock every heartbeat batch would take"
    ),
)
def test_heartbeat_acknowledged_while_the_sweeper_works_keeps_its_run_open(
    db: Engine,
) -> None:
    """Workload `late` runs on 8 A100 (80 CU) since NOW - 1 h, its last heartbeat at NOW - 20
    min: silent for the sweeper at NOW (stale after 10 min). The sweeper has read the silent
    runs and waits for the workload's row (locked here) when a heartbeat at NOW - 1 min is
    acknowledged. The run must stay open, its 80 CU still counted. At BASE the sweeper closes it
    at NOW - 20 min: 53.3 CU-hours in all, and the running workload shows as finished."""
    _first_rollup_race_setup(db)
    pods = (EventPod("a1", tuple(range(8))),)
    with db.begin() as conn:
        stored = ingest_pipeline.ingest(
            conn,
            [
                LedgerEvent(str(uuid.uuid4()), EventKind.STARTED, NOW - HOUR, "late", pods),
                LedgerEvent(str(uuid.uuid4()), EventKind.HEARTBEAT, NOW - 1200, "late"),
            ],
            NOW,
        )
        assert [o.status for o in stored] == [EventStatus.STORED] * 2
    closed: list[int] = []
    errors: list[BaseException] = []

    def sweeper() -> None:
        try:
            with db.begin() as conn:
                closed.append(sweep(conn, NOW, stale_after_s=600))
        except BaseException as exc:
            errors.append(exc)

    with db.connect() as holder:
        holder.execute(text("SELECT 1 FROM workloads WHERE uid = 'late' FOR UPDATE"))
        sweeping = threading.Thread(target=sweeper)
        sweeping.start()
        _until(lambda: _waiting_on_locks(db) == 1, "the sweeper never reached the workload")
        with db.begin() as conn:  # a heartbeat waits for nothing
            beat = LedgerEvent(str(uuid.uuid4()), EventKind.HEARTBEAT, NOW - 60, "late")
            assert ingest_pipeline.ingest(conn, [beat], NOW)[0].status is EventStatus.STORED
        holder.rollback()
    sweeping.join(timeout=30)
    assert errors == []
    with db.connect() as conn:
        ended, cu = conn.execute(
            text(
                "SELECT extract(epoch FROM ended_at)::float8, cu FROM allocation_intervals "
                "WHERE workload_uid = 'late'"
            )
        ).one()
        state = conn.execute(text("SELECT state FROM workloads WHERE uid = 'late'")).scalar_one()
    assert (ended, cu, state) == (None, 80.0, "running")
    assert closed == [0]
