"""Preemption's victim index of a queue and type (`cycle_preempt._Own.index`) holds only the
victims of a class below its first search's workload: the queue's later searches are for work
of no higher class (`_wanting`), so no other victim could be chosen, and a node with none of
them is neither in its walks nor read by a search."""

from __future__ import annotations

from typing import Any

import pytest
from cycle_builders import node, queue, running, snapshot, workload

from gpufair.domain import cycle_preempt
from gpufair.domain.cycle import run_cycle
from gpufair.domain.snapshot import EvictReason


def test_the_index_holds_the_classes_below_the_first_search(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Node x: eight class-0 jobs of queue a; node y: eight of class 1; node z: eight of class 2
    # (the pool full). "high" (class 2) may evict work of class 0 or 1 only; "mid" (class 1),
    # after it, of class 0 only, from the same index.
    indexed: list[set[str]] = []
    index_type = cycle_preempt.VictimIndex

    def recorded(victims: Any, *args: Any) -> Any:
        victims = list(victims)
        indexed.append({victim.uid for victim in victims})
        return index_type(victims, *args)

    monkeypatch.setattr(cycle_preempt, "VictimIndex", recorded)
    work = [
        running(workload(f"c{level}-{gpu}", "a", priority_class=level), [(name, (gpu,))])
        for level, name in enumerate(("x", "y", "z"))
        for gpu in range(8)
    ]
    pending = [
        workload("high", "a", priority_class=2),
        workload("mid", "a", priority_class=1, submit_time_s=1.0),
    ]
    result = run_cycle(
        snapshot(
            [node("x"), node("y"), node("z")],
            [queue("a", 24)],
            {"a": 24},
            running_work=work,
            pending=pending,
        )
    )
    assert indexed == [{f"c{level}-{gpu}" for level in (0, 1) for gpu in range(8)}]
    evicted = {evict.workload_uid: evict.reason for evict in result.evicts}
    assert len(evicted) == 2
    assert set(evicted.values()) == {EvictReason.PREEMPT}
    assert all(uid.startswith("c0-") for uid in evicted)
