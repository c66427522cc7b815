"""Borrowing with a time limit (issue 14): a pool lends idle capacity and calls the loan back.

Work of a queue above its fair share that has run `max_borrow_s` (the queue's, else the pool's)
may be reclaimed even before its `min_runtime_s`; the evict message and explain say so.
"""

from __future__ import annotations

from cycle_builders import evicted_uids, node, queue, running, snapshot, workload

from gpufair.domain.cycle import run_cycle
from gpufair.domain.explain import explain
from gpufair.domain.model import Allocation
from gpufair.domain.snapshot import CycleResult, PendingCode

HOUR_S = 3600.0
NOW_S = 10 * HOUR_S


def _borrower_started(hours_ago: float) -> list[Allocation]:
    """b holds all 8 GPUs with 1-GPU jobs that may not be reclaimed for 6 h (min_runtime_s);
    b's share is 4, so 4 of them run on loan."""
    return [
        running(
            workload(f"b{i}", "b", min_runtime_s=6 * HOUR_S),
            [("n", (i,))],
            started_at_s=NOW_S - hours_ago * HOUR_S + i,
        )
        for i in range(8)
    ]


def _cycle(
    hours_ago: float, *, pool_limit_s: float | None, queue_limit_s: float | None
) -> CycleResult:
    queues = [queue("a", 4), queue("b", max_borrow_s=queue_limit_s)]
    snap = snapshot(
        [node("n")],
        queues,
        {"a": 4.0, "b": 4.0},
        running_work=_borrower_started(hours_ago),
        pending=[workload("a-job", "a", gpus=2, submit_time_s=NOW_S - 60)],
        now_s=NOW_S,
        max_borrow_s=pool_limit_s,
    )
    return run_cycle(snap)


def test_a_loan_past_the_pools_max_borrow_is_reclaimed_before_min_runtime() -> None:
    result = _cycle(3.0, pool_limit_s=2 * HOUR_S, queue_limit_s=None)
    # Three hours in (min_runtime 6 h not reached), past the pool's 2 h limit: the two most
    # recent of b's jobs go for a's 2-GPU job.
    assert evicted_uids(result) == {"b7", "b6"}
    message = result.evicts[0].message
    assert "on loan for 10793 s, past max_borrow_s 7200 s (its min_runtime_s 21600 s" in message


def test_no_loan_limit_or_one_not_yet_reached_keeps_min_runtime() -> None:
    for pool_limit_s in (None, 4 * HOUR_S):
        result = _cycle(3.0, pool_limit_s=pool_limit_s, queue_limit_s=None)
        assert result.evicts == ()
        assert result.pending["a-job"].code is PendingCode.NO_CAPACITY


def test_a_queues_own_limit_overrides_the_pools() -> None:
    stricter = _cycle(3.0, pool_limit_s=None, queue_limit_s=HOUR_S)
    assert evicted_uids(stricter) == {"b7", "b6"}
    looser = _cycle(3.0, pool_limit_s=HOUR_S, queue_limit_s=5 * HOUR_S)
    assert looser.evicts == ()


def test_a_loan_limit_never_takes_a_queue_below_its_share() -> None:
    # b holds 8 with a share of 8: nothing is on loan, whatever the limit.
    queues = [queue("a", 4), queue("b")]
    snap = snapshot(
        [node("n")],
        queues,
        {"a": 4.0, "b": 8.0},
        running_work=_borrower_started(3.0),
        pending=[workload("a-job", "a", gpus=2)],
        now_s=NOW_S,
        max_borrow_s=60.0,
    )
    assert run_cycle(snap).evicts == ()


def test_explain_states_the_loan_limit_of_the_workloads_queue() -> None:
    queues = [queue("a", 4, max_borrow_s=2 * HOUR_S), queue("b")]
    snap = snapshot(
        [node("n")],
        queues,
        {"a": 4.0, "b": 4.0},
        running_work=_borrower_started(1.0),
        pending=[workload("a-more", "a", gpus=8)],
        now_s=NOW_S,
    )
    why = explain(snap, run_cycle(snap), "a-more")
    assert why.max_borrow_s == 2 * HOUR_S
    assert "may be reclaimed after 7200 s (max_borrow_s), even before its min_runtime_s" in (
        why.message
    )
