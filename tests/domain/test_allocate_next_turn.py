"""After a bind, a queue rejoins allocation's order keyed by its next workload's submit time
(`CycleState.queue_key` at the position after the bound one, `cycle_allocate.allocate`): with
ratios tied, the queue whose next workload waited longer goes first."""

from __future__ import annotations

from cycle_builders import bound_uids, node, queue, running, snapshot, workload

from gpufair.domain.cycle import run_cycle
from gpufair.domain.snapshot import PendingCode


def test_a_tie_in_ratio_goes_to_the_queue_whose_next_workload_is_older() -> None:
    # Three free GPUs, queues a and b of 2 CU fair share each. a1 (0 s) binds first, then b1
    # (1 s): both queues at ratio 0.5. Their next workloads: a2 submitted at 10 s, b2 at 5 s,
    # so b2 takes the last GPU and a2 waits for capacity.
    result = run_cycle(
        snapshot(
            [node("x", gpus=3)],
            [queue("a", 2), queue("b", 2)],
            {"a": 2, "b": 2},
            pending=[
                workload("a1", "a", submit_time_s=0),
                workload("a2", "a", submit_time_s=10),
                workload("b1", "b", submit_time_s=1),
                workload("b2", "b", submit_time_s=5),
            ],
        )
    )
    assert [bind.workload_uid for bind in result.binds] == ["a1", "b1", "b2"]
    assert bound_uids(result) == {"a1", "b1", "b2"}
    assert result.pending["a2"].code is PendingCode.NO_CAPACITY


def test_a_later_turn_starts_after_the_bound_workload_not_at_the_queue_head() -> None:
    # Nodes x and y of 2 GPUs; y is taken by b's work, which may not be evicted. Queue a, 3 CU
    # fair share: in its first turn a1 (3 pods of 1 GPU, within the share) finds no room, so
    # NO_CAPACITY, and a2 binds; its second turn starts at a3, which binds. Were a1 tried
    # again there, the share left (2 CU) would cap it: OVER_FAIR_SHARE.
    kept = workload("b1", "b", pods=2, preemptible=False)
    result = run_cycle(
        snapshot(
            [node("x", gpus=2), node("y", gpus=2)],
            [queue("a", 3), queue("b", 2)],
            {"a": 3, "b": 2},
            running_work=[running(kept, [("y", (0,)), ("y", (1,))])],
            pending=[
                workload("a1", "a", pods=3, submit_time_s=0),
                workload("a2", "a", submit_time_s=1),
                workload("a3", "a", submit_time_s=2),
            ],
        )
    )
    assert [bind.workload_uid for bind in result.binds] == ["a2", "a3"]
    assert result.pending["a1"].code is PendingCode.NO_CAPACITY
