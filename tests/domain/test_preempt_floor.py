"""Preemption's floor of a queue's victims on a type (`cycle_preempt._Own.floor`) rises as the
last victim of its class is evicted: a later workload of that class finds the type closed
before any other test, its queue's limits not read (`CycleState.pods_allowed`), where the
victims' totals would have found nothing below its class to free."""

from __future__ import annotations

import pytest
from cycle_builders import limits_asked_in_preemption, node, queue, running, snapshot, workload

from gpufair.domain.cycle import run_cycle
from gpufair.domain.snapshot import EvictReason, PendingCode


def test_the_floor_rises_when_its_class_is_evicted(monkeypatch: pytest.MonkeyPatch) -> None:
    # Node x: one class-0 job (low0) and seven class-1 jobs of queue a (8 CU share, a 16 CU
    # limit, so its tries read the limit). "high" (class 5) evicts low0: 8 - 1 + 1 = 8 CU,
    # within the share. "second" and "third" (class 1, the same shape) have nothing below
    # their class left: the type's floor is now 1, so no try of theirs reads the limit.
    asked = limits_asked_in_preemption(monkeypatch)
    work = [
        running(workload("low0", "a"), [("x", (0,))]),
        *(
            running(workload(f"mid{gpu}", "a", priority_class=1), [("x", (gpu,))])
            for gpu in range(1, 8)
        ),
    ]
    pending = [
        workload("high", "a", priority_class=5),
        workload("second", "a", priority_class=1, submit_time_s=1.0),
        workload("third", "a", priority_class=1, submit_time_s=2.0),
    ]
    result = run_cycle(
        snapshot(
            [node("x")],
            [queue("a", 8, limit_cu=16.0)],
            {"a": 8},
            running_work=work,
            pending=pending,
        )
    )
    assert asked == ["high"]
    assert [evict.workload_uid for evict in result.evicts] == ["low0"]
    assert {evict.reason for evict in result.evicts} == {EvictReason.PREEMPT}
    assert result.pending["high"].code is PendingCode.WAITING_FOR_EVICTED_CAPACITY
    assert {result.pending[uid].code for uid in ("second", "third")} == {
        PendingCode.OVER_FAIR_SHARE
    }
