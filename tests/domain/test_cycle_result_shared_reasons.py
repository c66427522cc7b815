"""The result gives workloads of one kind in one queue one reason object whatever their
preemptibility (`CycleState.result`: reasons are found by (code, trial, held nodes) with the
trial of either preemptibility, `Kind.trial_keys`, and made once by the preemptible one), both
for a sentence that reads only the queue's numbers and for one that reads its limits."""

from __future__ import annotations

from cycle_builders import node, queue, snapshot, workload

from gpufair.domain.cycle import run_cycle
from gpufair.domain.snapshot import CycleResult, PendingCode


def _result() -> CycleResult:
    nodes = [node("n", gpus=16)]
    pending = [workload(f"t1-{i}", "t1", submit_time_s=i, preemptible=i % 2 == 0) for i in range(8)]
    pending += [
        workload(f"t2-{i}", "t2", gpus=4, submit_time_s=i, preemptible=i % 2 == 0) for i in range(6)
    ]
    return run_cycle(
        snapshot(
            nodes,
            [queue("t1", 8.0, parent="dept"), queue("t2", 8.0)],
            {"t1": 8.0, "t2": 8.0},
            pending=pending,
            inner_queues=[queue("dept", limit_cu=4)],
        )
    )


def test_a_limit_reason_is_one_object_for_both_preemptibilities() -> None:
    result = _result()
    # dept may hold 4 CU: t1-0 .. t1-3 bound, the other four (two of each preemptibility) wait
    # on the limit, a sentence that reads the queue's limits (made anew each cycle).
    waiting = [result.pending[f"t1-{i}"] for i in range(4, 8)]
    assert waiting[0].code is PendingCode.QUEUE_LIMIT
    assert waiting[0].message == (
        "would exceed the limit of queue dept above its queue (limit 4 CU; the queues under "
        "it hold 4 CU, this needs 1 CU)"
    )
    assert all(reason is waiting[0] for reason in waiting)


def test_a_fair_share_reason_is_one_object_for_both_preemptibilities() -> None:
    result = _result()
    # t2 holds 12 of the 16 GPUs (t1 the other 4); t2-3 (not preemptible), t2-4 and t2-5 wait
    # beyond its share, a sentence of the queue's numbers only.
    waiting = [result.pending[f"t2-{i}"] for i in range(3, 6)]
    assert waiting[0].code is PendingCode.OVER_FAIR_SHARE
    assert waiting[0].message == (
        "needs 4 CU, beyond its queue's fair share (queue t2: allocated 12 CU, fair share 8 CU, "
        "deserved 8 CU), and no spare capacity fits it"
    )
    assert all(reason is waiting[0] for reason in waiting)
    assert list(result.pending) == [f"t1-{i}" for i in range(4, 8)] + [
        f"t2-{i}" for i in range(3, 6)
    ]
