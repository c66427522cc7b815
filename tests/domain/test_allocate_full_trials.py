"""Allocation's reasons for a trial known full (`cycle_allocate`): once every type of a trial
failed placement in a pass, a later workload of it is not tried; its reason is read off its
queue's limits (`_code_when_full`), except preemptible work beyond the share of a queue without
limits, which is never capped (`queuebook.UNCAPPED`) and keeps its reason without that call."""

from __future__ import annotations

from typing import Any

import pytest
from cycle_builders import node, queue, running, snapshot, workload

from gpufair.domain import cycle_allocate
from gpufair.domain.cycle import run_cycle
from gpufair.domain.snapshot import CycleResult, PendingCode


def _two_queues_on_a_full_node(
    monkeypatch: pytest.MonkeyPatch, limit_cu: float | None
) -> tuple[CycleResult, list[tuple[str, bool]]]:
    """Node x's two GPUs run two non-preemptible jobs of queue c; queues a and b (1 CU fair
    share each, b with `limit_cu`) wait with one-GPU work of one trial: `pa` (a), `pb` and the
    non-preemptible `nb` (b). Returns the result and (uid, within share) of each
    `_code_when_full` call."""
    asked: list[tuple[str, bool]] = []
    code_when_full = cycle_allocate._code_when_full

    def counted(state: Any, item: Any, within_share: bool) -> Any:
        asked.append((item.uid, within_share))
        return code_when_full(state, item, within_share)

    monkeypatch.setattr(cycle_allocate, "_code_when_full", counted)
    result = run_cycle(
        snapshot(
            [node("x", gpus=2)],
            [queue("a", 1), queue("b", 0, limit_cu=limit_cu), queue("c", 2)],
            {"a": 1, "b": 1, "c": 2},
            running_work=[
                running(workload(f"r{gpu}", "c", preemptible=False), [("x", (gpu,))])
                for gpu in range(2)
            ],
            pending=[
                workload("pa", "a", submit_time_s=0),
                workload("pb", "b", submit_time_s=1),
                workload("nb", "b", submit_time_s=2, preemptible=False),
            ],
        )
    )
    return result, asked


def test_preemptible_work_of_a_queue_without_limits_is_not_asked_beyond_share(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Within share: pa fails on the full node (its trial is then full), pb and nb are read off
    # b's limits (1 CU of share left: no capacity; b deserves nothing: nb is over deserved).
    # Beyond share: pa is tried again and fails; pb, preemptible in a queue without limits,
    # keeps its reason unasked; nb, not preemptible, is asked.
    result, asked = _two_queues_on_a_full_node(monkeypatch, limit_cu=None)
    assert asked == [("pb", True), ("nb", True), ("nb", False)]
    assert result.binds == ()
    assert {uid: reason.code for uid, reason in result.pending.items()} == {
        "pa": PendingCode.NO_CAPACITY,
        "pb": PendingCode.NO_CAPACITY,
        "nb": PendingCode.NON_PREEMPTIBLE_OVER_DESERVED,
    }


def test_preemptible_work_of_a_queue_with_a_limit_is_asked_beyond_share(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # b's 10 CU limit is far from reached, so the reasons are the same; but a limit may cap
    # preemptible work beyond the share, so pb is asked in both passes.
    result, asked = _two_queues_on_a_full_node(monkeypatch, limit_cu=10.0)
    assert asked == [("pb", True), ("nb", True), ("pb", False), ("nb", False)]
    assert {uid: reason.code for uid, reason in result.pending.items()} == {
        "pa": PendingCode.NO_CAPACITY,
        "pb": PendingCode.NO_CAPACITY,
        "nb": PendingCode.NON_PREEMPTIBLE_OVER_DESERVED,
    }
