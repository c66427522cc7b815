"""Heartbeats that come back after a stale close reopen the run, on PostgreSQL.

Workload `late` runs on node a1's 8 A100 (80 CU) since NOW - 1 h, its last heartbeat at NOW - 20
min: a sweep at NOW (stale after 10 min) closes the run there, 80 CU x 40 min = 53.3 CU-hours.
Its batch system was cut off; it comes back with a heartbeat at NOW - 1 min. The next sweep
voids the close and reopens the run: open, 80 CU, `late` running, 80 CU-hours up to NOW.
"""

from __future__ import annotations

import json
import uuid

from sqlalchemy import Engine, text

from gpufair.domain.ledger import EventKind, LedgerEvent, stale_event_id
from gpufair.services.sweep import Swept, sweep
from gpufair.store import ingest_pipeline
from gpufair.store.ingest_pipeline import EventStatus
from tests.store.test_rollups import NOW
from tests.store.test_sweep_race import _late_run, _late_running


def _ingest(db: Engine, event: LedgerEvent) -> None:
    with db.begin() as conn:
        assert ingest_pipeline.ingest(conn, [event], NOW)[0].status is EventStatus.STORED


def _heartbeat(at_s: float) -> LedgerEvent:
    return LedgerEvent(str(uuid.uuid4()), EventKind.HEARTBEAT, at_s, "late")


def _sweep(db: Engine, now_s: float = NOW) -> Swept:
    with db.begin() as conn:
        return sweep(conn, now_s, stale_after_s=600)


def _closed_then_beat(db: Engine) -> None:
    """`late` swept stale at NOW - 20 min (53.3 CU-hours), then a heartbeat at NOW - 1 min."""
    _late_running(db)
    assert _sweep(db) == (1, 0)
    ended, cu, state, cu_hours = _late_run(db)
    assert (ended, cu, state, round(cu_hours, 1)) == (NOW - 1200, 80.0, "finished", 53.3)
    _ingest(db, _heartbeat(NOW - 60))


def _marks_at_close(db: Engine) -> int:
    """Rollup dirty marks of pool p from NOW - 20 min, the stale close's instant."""
    with db.connect() as conn:
        return conn.execute(
            text(
                "SELECT count(*) FROM rollup_dirty_marks "
                "WHERE pool = 'p' AND dirty_from = to_timestamp(:at)"
            ),
            {"at": NOW - 1200},
        ).scalar_one()


def _stale_ids(db: Engine) -> list[str]:
    with db.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT event_id::text FROM ledger_events WHERE kind = 'stale' ORDER BY occurred_at"
            )
        )
        return [r[0] for r in rows]


def _start_id(db: Engine) -> str:
    with db.connect() as conn:
        return conn.execute(
            text(
                "SELECT event_id::text FROM ledger_events "
                "WHERE workload_uid = 'late' AND kind = 'started'"
            )
        ).scalar_one()


def test_heartbeat_after_a_stale_close_reopens_the_run_at_the_next_sweep(db: Engine) -> None:
    """Until the sweep the run shows closed (the heartbeat writes only its event); the sweep
    closes nothing and reopens it: open, 80 CU, running, 80 CU x 1 h = 80 CU-hours up to NOW."""
    _closed_then_beat(db)
    assert _late_run(db)[0] == NOW - 1200  # the window: closed until the next sweep
    assert _marks_at_close(db) == 1  # the close's
    assert _sweep(db) == (0, 1)
    assert _late_run(db) == (None, 80.0, "running", 80.0)
    assert _marks_at_close(db) == 2  # usage changed from the void close on: rolled up again
    assert _sweep(db) == (0, 0)  # and it stays open
    assert _late_run(db) == (None, 80.0, "running", 80.0)


def test_stop_after_the_revival_closes_the_run_at_the_stop(db: Engine) -> None:
    """Reopened, then stopped at NOW - 30 s: one run of 59.5 min, 80 CU, 79.3 CU-hours,
    `late` finished. The stop's ingest reads the heartbeat too, or the run would end at the void
    close again."""
    _closed_then_beat(db)
    assert _sweep(db) == (0, 1)
    _ingest(db, LedgerEvent(str(uuid.uuid4()), EventKind.STOPPED, NOW - 30, "late"))
    ended, cu, state, cu_hours = _late_run(db)
    assert (ended, cu, state, round(cu_hours, 1)) == (NOW - 30, 80.0, "finished", 79.3)


def test_stop_before_the_sweep_reopens_also_ends_the_run_at_the_stop(db: Engine) -> None:
    """The stop at NOW - 30 s comes before any sweep reopened the run: its ingest derives the
    same run as a sweep then a stop would (NOW - 1 h to NOW - 30 s, 79.3 CU-hours)."""
    _closed_then_beat(db)
    _ingest(db, LedgerEvent(str(uuid.uuid4()), EventKind.STOPPED, NOW - 30, "late"))
    ended, cu, state, cu_hours = _late_run(db)
    assert (ended, cu, state, round(cu_hours, 1)) == (NOW - 30, 80.0, "finished", 79.3)
    assert _sweep(db) == (0, 0)
    assert _late_run(db)[0] == NOW - 30


def test_revived_run_silent_again_is_closed_anew_with_another_id(db: Engine) -> None:
    """Reopened at NOW, then silent: a sweep at NOW + 20 min closes it at its heartbeat,
    NOW - 1 min (80 CU x 59 min = 78.7 CU-hours), with a second stale event whose id differs
    from the first's (one per close: start and instant). A further sweep writes nothing."""
    _closed_then_beat(db)
    assert _sweep(db) == (0, 1)
    assert _sweep(db, NOW + 1200) == (1, 0)
    ended, cu, state, cu_hours = _late_run(db)
    assert (ended, cu, state, round(cu_hours, 1)) == (NOW - 60, 80.0, "finished", 78.7)
    start = _start_id(db)
    assert _stale_ids(db) == [stale_event_id(start, NOW - 1200), stale_event_id(start, NOW - 60)]
    assert _sweep(db, NOW + 1200) == (0, 0)
    assert len(_stale_ids(db)) == 2


def test_heartbeat_back_but_silent_again_moves_the_close_in_one_sweep(db: Engine) -> None:
    """No sweep between the heartbeat at NOW - 1 min and one at NOW + 20 min: that sweep moves
    the close from NOW - 20 min to NOW - 1 min (78.7 CU-hours) without reopening the run."""
    _closed_then_beat(db)
    assert _sweep(db, NOW + 1200) == (1, 0)
    ended, cu, state, cu_hours = _late_run(db)
    assert (ended, cu, state, round(cu_hours, 1)) == (NOW - 60, 80.0, "finished", 78.7)


def test_stale_run_without_a_later_heartbeat_stays_closed(db: Engine) -> None:
    """Closed at NOW - 20 min; heartbeats of other workloads only: sweeps leave it closed
    (53.3 CU-hours, finished), with its one stale event."""
    _late_running(db)
    assert _sweep(db) == (1, 0)
    _ingest(db, LedgerEvent(str(uuid.uuid4()), EventKind.HEARTBEAT, NOW - 5, "other"))
    assert _sweep(db) == (0, 0)
    assert _sweep(db, NOW + 600) == (0, 0)
    ended, cu, state, cu_hours = _late_run(db)
    assert (ended, cu, state, round(cu_hours, 1)) == (NOW - 1200, 80.0, "finished", 53.3)
    assert len(_stale_ids(db)) == 1


def test_close_older_than_the_window_is_not_reopened_by_the_sweep(db: Engine) -> None:
    """With a window of 10 min, the close at NOW - 20 min is out of it: the sweep leaves the
    run closed (53.3 CU-hours) until the workload's next run event."""
    _closed_then_beat(db)
    with db.begin() as conn:
        assert sweep(conn, NOW, stale_after_s=600, revive_within_s=600) == (0, 0)
    assert _late_run(db)[0] == NOW - 1200


def test_decision_bound_onto_the_revived_runs_gpus_is_withdrawn(db: Engine) -> None:
    """After the close a cycle bound `other` onto a1's GPUs 0-3, free as it seemed. Reopening
    `late` (a1's 8 GPUs) withdraws that decision: `other` pending again, without a binding."""
    _late_running(db)
    assert _sweep(db) == (1, 0)
    pods = [{"pod_index": 0, "node": "a1", "gpu_indices": [0, 1, 2, 3], "gpu_fraction": 1.0}]
    with db.begin() as conn:
        conn.execute(
            text(
                "UPDATE workloads SET state = 'bound', binding = CAST(:b AS jsonb), "
                "bound_at = to_timestamp(:now), bind_expires_at = to_timestamp(:now + 300) "
                "WHERE uid = 'other'"
            ),
            {"b": json.dumps({"gpu_type": "a100", "cycle_id": 0, "pods": pods}), "now": NOW},
        )
    _ingest(db, _heartbeat(NOW - 60))
    assert _sweep(db) == (0, 1)
    assert _late_run(db) == (None, 80.0, "running", 80.0)
    with db.connect() as conn:
        state, binding = conn.execute(
            text("SELECT state, binding FROM workloads WHERE uid = 'other'")
        ).one()
    assert (state, binding) == ("pending", None)


def test_run_of_an_hour_is_what_a_rederivation_from_scratch_gives(db: Engine) -> None:
    """Intervals deleted and `late` derived again from its events alone (start, void close,
    heartbeats): the same open run of 80 CU from NOW - 1 h."""
    _closed_then_beat(db)
    assert _sweep(db) == (0, 1)
    with db.begin() as conn:
        conn.execute(text("DELETE FROM allocation_intervals"))
        ingest_pipeline.ingest(conn, [], NOW, internal=True, rederive=["late"])
    ended, cu, state, cu_hours = _late_run(db)
    assert (ended, cu, state, cu_hours) == (None, 80.0, "running", 80.0)
