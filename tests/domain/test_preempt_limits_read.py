"""Preemption reads a queue's limits only where they can cap (`cycle_preempt._try_preempt`):
preemptible work of a queue without limits is never capped beyond its share
(`queuebook.UNCAPPED`), so its try does not ask `CycleState.pods_allowed`; a queue with a
limit is asked on each type, and the limit keeps its victims running."""

from __future__ import annotations

import pytest
from cycle_builders import (
    POOL,
    limits_asked_in_preemption,
    node,
    queue,
    running,
    snapshot,
    workload,
)

from gpufair.domain.cycle import run_cycle
from gpufair.domain.queuebook import UNCAPPED, LimitBook, QueueBook
from gpufair.domain.snapshot import CycleResult, EvictReason, PendingCode


def _full_node_and_one_waiting(
    monkeypatch: pytest.MonkeyPatch, limit_cu: float | None
) -> tuple[CycleResult, list[str]]:
    """Node x's eight GPUs run eight class-0 one-GPU jobs of queue a (8 CU deserved,
    `limit_cu`); one class-5 one-GPU workload of a waits. Returns the cycle's result and the
    uids `pods_allowed` was asked about inside preemption's tries."""
    asked = limits_asked_in_preemption(monkeypatch)
    work = [
        running(workload(f"low{gpu}", "a"), [("x", (gpu,))], started_at_s=gpu) for gpu in range(8)
    ]
    result = run_cycle(
        snapshot(
            [node("x")],
            [queue("a", 8, limit_cu=limit_cu)],
            {"a": 8},
            running_work=work,
            pending=[workload("high", "a", priority_class=5)],
        )
    )
    return result, asked


def test_a_queue_without_limits_preempts_without_asking_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # 8 - 1 + 1 = 8 CU: the swap keeps queue a within its share; the most recent class-0 job
    # (started at 7 s) goes, and no limit was read for it.
    result, asked = _full_node_and_one_waiting(monkeypatch, limit_cu=None)
    assert asked == []
    assert [evict.workload_uid for evict in result.evicts] == ["low7"]
    assert {evict.reason for evict in result.evicts} == {EvictReason.PREEMPT}
    assert result.pending["high"].code is PendingCode.WAITING_FOR_EVICTED_CAPACITY


def test_a_queue_at_its_limit_is_asked_and_keeps_its_victims(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # limit 8 CU, 8 CU running: the limit allows no pod beyond them, so nothing is evicted
    # and the workload waits on its limit.
    result, asked = _full_node_and_one_waiting(monkeypatch, limit_cu=8.0)
    assert asked == ["high"]
    assert result.evicts == ()
    assert result.pending["high"].code is PendingCode.QUEUE_LIMIT


def test_only_preemptible_work_of_a_book_without_any_limit_is_never_capped() -> None:
    """`QueueBook.never_caps`, the one statement of `UNCAPPED`'s rule: a book with a CU limit,
    a GPU limit of a type, or a limited inner queue above it caps; work not preemptible is
    capped by its deserved share whatever the limits."""
    dept = LimitBook(queue("dept", limit_cu=100.0), POOL)
    books = {
        "free": QueueBook(queue("free", 8.0), POOL, 8.0, {}),
        "cu limit": QueueBook(queue("cu", 8.0, limit_cu=16.0), POOL, 8.0, {}),
        "gpu limit": QueueBook(queue("gpu", 8.0, limit_gpus_by_type={"a100": 2.0}), POOL, 8.0, {}),
        "under dept": QueueBook(queue("team", 8.0, parent="dept"), POOL, 8.0, {}, (dept,)),
    }
    answers = {
        name: (book.never_caps(True), book.never_caps(False)) for name, book in books.items()
    }
    assert answers == {
        "free": (True, False),
        "cu limit": (False, False),
        "gpu limit": (False, False),
        "under dept": (False, False),
    }
    # `max_pods` beyond the share agrees: UNCAPPED exactly where the rule says.
    assert books["free"].max_pods(2.0, 1.0, "a100", True, False) == UNCAPPED
    assert books["cu limit"].max_pods(2.0, 1.0, "a100", True, False) == (8, PendingCode.QUEUE_LIMIT)
