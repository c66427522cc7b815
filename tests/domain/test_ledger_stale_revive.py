"""The rule that voids a `stale` close when the workload showed a sign of life after it
(`ledger.derive_runs`), and the ids of the sweeper's closes (`ledger.stale_event_id`). Pure.

Workload `w` starts at t = 0 on 8 GPUs; the sweeper closed it as stale at t = 600 s (its last
sign of life then). Instants are seconds.
"""

from __future__ import annotations

import uuid

from gpufair.domain.ledger import (
    STALE_NAMESPACE,
    EventKind,
    EventPod,
    LedgerEvent,
    Run,
    WorkloadState,
    derive_runs,
    stale_event_id,
    state_after,
)

POD = (EventPod("a1", tuple(range(8))),)
START = LedgerEvent("s1", EventKind.STARTED, 0.0, "w", POD)
STALE = LedgerEvent("x1", EventKind.STALE, 600.0, "w")


def test_stale_close_stands_without_a_later_heartbeat() -> None:
    """No heartbeat, or one at the close's own instant or before: the run ends at 600 s."""
    closed = [Run("s1", 0.0, POD, 600.0, EventKind.STALE)]
    assert derive_runs([START, STALE]) == closed
    assert derive_runs([START, STALE], alive_at_s=600.0) == closed
    assert derive_runs([START, STALE], alive_at_s=300.0) == closed
    assert state_after(closed, WorkloadState.RUNNING) is WorkloadState.FINISHED


def test_heartbeat_after_a_stale_close_voids_it() -> None:
    """A heartbeat at 1800 s: the run goes on from 0 s (open, the workload running)."""
    runs = derive_runs([STALE, START], alive_at_s=1800.0)
    assert runs == [Run("s1", 0.0, POD)]
    assert state_after(runs, WorkloadState.FINISHED) is WorkloadState.RUNNING


def test_stop_after_a_voided_close_ends_the_run_at_the_stop() -> None:
    """Heartbeat at 1800 s, stop at 3000 s: one run of 3000 s, ended by the stop."""
    stop = LedgerEvent("t1", EventKind.STOPPED, 3000.0, "w")
    assert derive_runs([START, STALE, stop], alive_at_s=1800.0) == [
        Run("s1", 0.0, POD, 3000.0, EventKind.STOPPED)
    ]


def test_second_close_at_the_later_heartbeat_stands() -> None:
    """Revived by the heartbeat at 1800 s, silent again, closed anew at 1800 s: the run ends at
    1800 s (the first close is void, the second is not earlier than the heartbeat)."""
    again = LedgerEvent("x2", EventKind.STALE, 1800.0, "w")
    assert derive_runs([START, STALE, again], alive_at_s=1800.0) == [
        Run("s1", 0.0, POD, 1800.0, EventKind.STALE)
    ]


def test_real_stops_are_not_voided_by_later_heartbeats() -> None:
    """A stop at 600 s and a (late) heartbeat at 1800 s: the run still ends at 600 s."""
    stop = LedgerEvent("t1", EventKind.STOPPED, 600.0, "w")
    assert derive_runs([START, stop], alive_at_s=1800.0) == [
        Run("s1", 0.0, POD, 600.0, EventKind.STOPPED)
    ]
    failed = LedgerEvent("f1", EventKind.FAILED, 600.0, "w")
    assert derive_runs([START, failed], alive_at_s=1800.0)[0].ended_at_s == 600.0


def test_start_between_the_close_and_the_heartbeat_keeps_the_close() -> None:
    """A new start at 1000 s, heartbeat at 1500 s: the heartbeat may be the new run's, so the
    first run keeps its close at 600 s and the second is open from 1000 s."""
    restart = LedgerEvent("s2", EventKind.STARTED, 1000.0, "w", POD)
    assert derive_runs([START, STALE, restart], alive_at_s=1500.0) == [
        Run("s1", 0.0, POD, 600.0, EventKind.STALE),
        Run("s2", 1000.0, POD),
    ]


def test_stale_ids_name_one_close() -> None:
    """The same start and instant give one id (a second sweep of the same silence is a replay);
    a later instant gives another; neither is the id of the earlier scheme (start alone)."""
    first = stale_event_id("s1", 600.0)
    assert stale_event_id("s1", 600.0) == first
    assert stale_event_id("s1", 600.0000001) == first  # below a microsecond, as stored
    second = stale_event_id("s1", 1800.0)
    assert second != first
    assert stale_event_id("s2", 600.0) != first
    assert str(uuid.uuid5(STALE_NAMESPACE, "s1")) not in {first, second}
    assert uuid.UUID(first).version == 5
