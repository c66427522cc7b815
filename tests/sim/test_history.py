"""A queue's allocation history: the step function and the segments usage integrals read."""

from __future__ import annotations

from gpufair.domain.usage import Segment
from gpufair.sim.history import QueueHistory


def test_changes_and_segments_follow_the_allocation() -> None:
    history = QueueHistory()
    history.set(0.0, 4.0)
    history.set(10.0, 6.0)
    history.set(30.0, 0.0)
    history.set(40.0, 2.0)
    assert history.changes == [(0.0, 4.0), (10.0, 6.0), (30.0, 0.0), (40.0, 2.0)]
    assert list(history.segments) == [Segment(0.0, 10.0, 4.0), Segment(10.0, 30.0, 6.0)]
    assert history.timeline(50.0)[-1] == Segment(40.0, 50.0, 2.0)


def test_changes_within_one_instant_leave_one_change_or_none() -> None:
    history = QueueHistory()
    history.set(0.0, 4.0)
    history.set(10.0, 2.0)  # a job ends...
    history.set(10.0, 6.0)  # ...and two start at the same instant
    assert history.changes == [(0.0, 4.0), (10.0, 6.0)]
    history.set(20.0, 2.0)
    history.set(20.0, 6.0)  # back to what it was: no change at 20 at all
    assert history.changes == [(0.0, 4.0), (10.0, 6.0)]
    assert history.timeline(30.0) == [Segment(0.0, 10.0, 4.0), Segment(10.0, 30.0, 6.0)]


def test_prune_drops_only_segments_that_ended_before_the_window() -> None:
    history = QueueHistory()
    for at_s, value in ((0.0, 1.0), (10.0, 2.0), (20.0, 3.0)):
        history.set(at_s, value)
    history.prune(10.0)
    assert list(history.segments) == [Segment(10.0, 20.0, 2.0)]
    history.prune(15.0)  # still reaches into the window: kept, usage_inputs clips it
    assert len(history.segments) == 1
