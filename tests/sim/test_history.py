"""A queue's allocation history: the step function of the CU it holds."""

from __future__ import annotations

from gpufair.sim.history import QueueHistory


def test_changes_follow_the_allocation() -> None:
    history = QueueHistory()
    history.set(0.0, 4.0)
    history.set(10.0, 6.0)
    history.set(20.0, 6.0)  # no change
    history.set(30.0, 0.0)
    history.set(40.0, 2.0)
    assert history.changes == [(0.0, 4.0), (10.0, 6.0), (30.0, 0.0), (40.0, 2.0)]
    assert history.value == 2.0


def test_changes_within_one_instant_leave_one_change_or_none() -> None:
    history = QueueHistory()
    history.set(0.0, 4.0)
    history.set(10.0, 2.0)  # a job ends...
    history.set(10.0, 6.0)  # ...and two start at the same instant
    assert history.changes == [(0.0, 4.0), (10.0, 6.0)]
    history.set(20.0, 2.0)
    history.set(20.0, 6.0)  # back to what it was: no change at 20 at all
    assert history.changes == [(0.0, 4.0), (10.0, 6.0)]
