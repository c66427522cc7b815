"""Defragmentation's memo of searches that found no moves (`cycle_defrag_memo`): the same
search on the same pool is not run again, and any change to what it reads (free capacity, the
budget) runs it again and decides as a fresh cycle would."""

from __future__ import annotations

import pytest
from cycle_builders import node, queue, running, snapshot, workload

from gpufair.domain import cycle_defrag
from gpufair.domain.cycle import run_cycle
from gpufair.domain.cycle_defrag_memo import forget
from gpufair.domain.cycle_state import CycleState
from gpufair.domain.model import Allocation
from gpufair.domain.snapshot import CycleResult, CycleSnapshot, EvictReason, PendingCode

NODES = [node(f"n{i}") for i in range(1, 5)]  # 4 nodes of 8 GPUs and 64 CPU cores each


def _job(uid: str, gpus: int, where: str, first_gpu: int, cpu: int = 0) -> Allocation:
    job = workload(uid, "team", gpus=float(gpus), cpu_millicores=cpu)
    return running(job, [(where, tuple(range(first_gpu, first_gpu + gpus)))])


# Every node has 2 GPUs free (8 in all), none 8. Only c1, c2, c3 (2 GPUs and 8 cores each) can
# make room: emptying n3 for the gang, each moved to the 2 free GPUs of n1, n2 or n4.
RUNNING = [
    _job("a1", 4, "n1", 0),
    _job("a2", 2, "n1", 4),
    _job("b1", 4, "n2", 0),
    _job("b2", 2, "n2", 4),
    _job("c1", 2, "n3", 0, cpu=8_000),
    _job("c2", 2, "n3", 2, cpu=8_000),
    _job("c3", 2, "n3", 4, cpu=8_000),
    _job("d1", 6, "n4", 0),
]
# A CPU-only job that may not move, leaving n4 4 cores: no c fits there, so no move is found.
HOG = running(
    workload("hog", "team", gpus=0.0, cpu_millicores=60_000, preemptible=False), [("n4", ())]
)
GANG = workload("gang", "big", gpus=8.0, submit_time_s=500.0)


def _snapshot(hog: bool, share: float = 0.25) -> CycleSnapshot:
    return snapshot(
        NODES,
        [queue("team", 24), queue("big", 8)],
        {"team": 24.0, "big": 8.0},
        running_work=[*RUNNING, HOG] if hog else RUNNING,
        pending=[GANG],
        max_moved_share_per_hour=share,
    )


def _moved(result: CycleResult) -> dict[str, set[str]]:
    return {
        e.workload_uid: {binding.node for binding in e.move_to}
        for e in result.evicts
        if e.reason is EvictReason.DEFRAGMENT
    }


@pytest.fixture
def greedy_runs(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the greedy passes of move searches; starts with an empty memo."""
    forget()
    calls = [0]
    greedy = cycle_defrag._greedy

    def counted(*args: object, **kwargs: object) -> object:
        calls[0] += 1
        return greedy(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(cycle_defrag, "_greedy", counted)
    return calls


def test_a_search_that_found_nothing_is_not_run_again_on_the_same_pool(
    greedy_runs: list[int],
) -> None:
    first = run_cycle(_snapshot(hog=True))
    assert not first.evicts and first.pending["gang"].code is PendingCode.NO_CAPACITY
    searched = greedy_runs[0]
    assert searched >= 2  # c1-c3 fit nowhere else: n3 is left out and the greedy runs again
    again = run_cycle(_snapshot(hog=True))
    assert greedy_runs[0] == searched  # the second, identical cycle did not search
    assert again.evicts == first.evicts and again.binds == first.binds
    assert again.pending["gang"].code is PendingCode.NO_CAPACITY


def test_freed_capacity_searches_again_and_moves_as_a_fresh_cycle(
    greedy_runs: list[int],
) -> None:
    """The hog ends: the movable work, the gang and the budget are as before, only n4's free
    CPU changed; the search runs and moves c1, c2, c3 to n1, n2 and n4, as without the memo."""
    assert not run_cycle(_snapshot(hog=True)).evicts
    before = greedy_runs[0]
    result = run_cycle(_snapshot(hog=False))
    assert greedy_runs[0] > before
    moved = _moved(result)
    assert set(moved) == {"c1", "c2", "c3"}
    assert sorted(n for nodes in moved.values() for n in nodes) == ["n1", "n2", "n4"]
    forget()
    fresh = run_cycle(_snapshot(hog=False))
    assert fresh.evicts == result.evicts and fresh.reservations == result.reservations


def test_a_larger_budget_searches_again(greedy_runs: list[int]) -> None:
    """3.2 GPUs an hour (10 % of 32) cannot pay for the 6 GPUs of c1-c3; at 8 an hour the same
    pool is searched again and the moves are made."""
    assert not run_cycle(_snapshot(hog=False, share=0.1)).evicts
    assert not run_cycle(_snapshot(hog=False, share=0.1)).evicts
    before = greedy_runs[0]
    assert set(_moved(run_cycle(_snapshot(hog=False, share=0.25)))) == {"c1", "c2", "c3"}
    assert greedy_runs[0] > before


def test_a_skipped_search_leaves_the_nodes_in_the_order_the_search_would_have(
    greedy_runs: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A search undoes its releases, which puts each released node last in its free-GPU bucket;
    the phases after it place in that order. The cycle that skips the search (the memo) leaves
    the same order as the cycle that ran it."""
    seen: list[tuple[tuple[tuple[int, ...], ...], tuple[tuple[int, ...], ...]]] = []
    defragment = cycle_defrag.defragment

    def orders(state: CycleState) -> tuple[tuple[int, ...], ...]:
        capacity = state.capacity
        buckets = [tuple(capacity.bucket("unit", free)) for free in range(9)]
        return (*buckets, tuple(capacity.partial_nodes("unit")))

    def recorded(state: CycleState) -> None:
        before = orders(state)
        defragment(state)
        seen.append((before, orders(state)))

    monkeypatch.setattr("gpufair.domain.cycle.defragment", recorded)
    run_cycle(_snapshot(hog=True))
    searched = greedy_runs[0]
    run_cycle(_snapshot(hog=True))
    (before, searched_order), (before_again, skipped_order) = seen
    assert before == before_again
    # The bucket of nodes with 2 untouched GPUs: n1-n4 in order before, reordered by the
    # search's undone releases (n4, n3, n1, n2).
    assert before[2] == (0, 1, 2, 3) and searched_order[2] == (3, 2, 0, 1)
    assert skipped_order == searched_order
    assert greedy_runs[0] == searched
