"""After a bind, a queue rejoins allocation's order keyed by its next workload's submit time
(`CycleState.queue_key` at the position after the bound one, `cycle_allocate.allocate`): with
ratios tied, the queue whose next workload waited longer goes first."""

from __future__ import annotations

from cycle_builders import bound_uids, node, queue, snapshot, workload

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
