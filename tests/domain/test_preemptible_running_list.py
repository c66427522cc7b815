"""The running work reclaim, guarantee reclaim and preemption may take is listed once per cycle
(`cycle_reclaim.preemptible_running`, kept in `CycleState.preemptible_running`): preemptible and
not already leaving, in the snapshot's order. Each phase walks that list, not all running work."""

from __future__ import annotations

from cycle_builders import node, queue, running, snapshot, workload

from gpufair.domain.cycle import run_cycle
from gpufair.domain.cycle_guarantee import reclaim_for_guarantees
from gpufair.domain.cycle_load import load
from gpufair.domain.cycle_preempt import preempt
from gpufair.domain.cycle_reclaim import preemptible_running, reclaim
from gpufair.domain.cycle_state import CycleState
from gpufair.domain.snapshot import CycleSnapshot, EvictionInFlight, EvictReason, PendingCode


def _four_running_one_waiting() -> CycleSnapshot:
    """Node x's four GPUs run p0, n1 (not preemptible), p2 and p3 (already told to stop) of
    queue a (4 CU deserved and fair share), started at 0, 1, 2 and 3 s; `high` (class 5, one
    GPU) of a waits."""
    jobs = [
        workload("p0", "a"),
        workload("n1", "a", preemptible=False),
        workload("p2", "a"),
        workload("p3", "a"),
    ]
    return snapshot(
        [node("x", gpus=4)],
        [queue("a", 4)],
        {"a": 4},
        running_work=[
            running(job, [("x", (gpu,))], started_at_s=gpu) for gpu, job in enumerate(jobs)
        ],
        pending=[workload("high", "a", priority_class=5)],
        evicting=[EvictionInFlight("p3")],
    )


def test_the_list_holds_preemptible_work_not_leaving_and_is_made_once() -> None:
    state = CycleState(_four_running_one_waiting())
    load(state)
    assert state.preemptible_running is None
    listed = preemptible_running(state)
    assert [entry.victim.uid for entry in listed] == ["p0", "p2"]
    reclaim(state)
    reclaim_for_guarantees(state)
    preempt(state)
    assert preemptible_running(state) is listed
    assert [entry.victim.uid for entry in listed] == ["p0", "p2"]


def test_preemption_takes_the_most_recent_listed_victim() -> None:
    # p3 is the most recent but already leaving, n1 is not preemptible: p2 goes for `high`.
    result = run_cycle(_four_running_one_waiting())
    assert [(evict.workload_uid, evict.reason) for evict in result.evicts] == [
        ("p2", EvictReason.PREEMPT)
    ]
    assert result.pending["high"].code is PendingCode.WAITING_FOR_EVICTED_CAPACITY
