"""Preemption's room test (`cycle_preempt._room_short`) keeps the node counts of a test that
found the room short (`_Own.room`) and answers later tests of the queue and type at that class
or below from them, for pods of any whole GPUs: the same answers a count of the victims gives."""

from __future__ import annotations

from typing import Any

import pytest
from cycle_builders import halves_and_fours, node, queue, snapshot, workload

from gpufair.domain import cycle_preempt
from gpufair.domain.cycle import run_cycle
from gpufair.domain.snapshot import PendingCode


def test_a_later_test_is_answered_from_the_counts_as_a_count_would(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Queue a's class-0 victims: on x, half of each GPU beside a non-preemptible half (no GPU
    # freed); on y, four one-GPU jobs beside a non-preemptible 4-GPU job (four GPUs freed).
    # Their GPUs (4 + 4) pass the cheap test for an 8-GPU pod, but only y could give four
    # whole GPUs: the 8-GPU pod's test counts the victims and finds the room short; the gang
    # of two 4-GPU pods that comes next (another placement problem) is refused by its counts
    # (one node with four, one pod), and a class-3 one-GPU pod after it, also from the counts
    # at a lower class, is let through (four pods), as a count of the victims says too.
    work = halves_and_fours()
    pending = [
        workload("eight", "a", gpus=8, priority_class=5, submit_time_s=0),
        workload("pair", "a", pods=2, gpus=4, priority_class=5, submit_time_s=1),
        workload("one", "a", priority_class=3, submit_time_s=2),
    ]
    room_short = cycle_preempt._room_short
    answers: list[tuple[str, bool, bool, bool]] = []

    def checked(state: Any, item: Any, gpu_type: str, own: Any, partitions: bool) -> bool:
        kept = own.room
        answer = room_short(state, item, gpu_type, own, partitions)
        own.room = None
        counted = room_short(state, item, gpu_type, own, partitions)
        own.room = kept if own.room is None else own.room
        answers.append((item.uid, kept is not None, answer, counted))
        return answer

    monkeypatch.setattr(cycle_preempt, "_room_short", checked)
    result = run_cycle(
        snapshot(
            [node("x"), node("y")],
            [queue("a", 32)],
            {"a": 32},
            running_work=work,
            pending=pending,
        )
    )
    assert answers == [
        ("eight", False, True, True),
        ("pair", True, True, True),
        ("one", True, False, False),
    ]
    assert result.pending["eight"].code is PendingCode.NO_CAPACITY
    assert result.pending["pair"].code is PendingCode.NO_CAPACITY
    assert result.pending["one"].code is PendingCode.WAITING_FOR_EVICTED_CAPACITY
