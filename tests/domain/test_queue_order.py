"""The order the capacity phases try pending work in (`CycleState.in_queue_order`): by the
queues' order (tier, then allocated/fair-share ratio), then by workload order inside a queue.
Reclaim, preempt and the per-type guarantees take their work queue by queue from
`queue_pending` and order it with `by_queue_order`, which neither groups nor sorts it again:
that holds only while each queue's list is in workload order, loaded afresh or carried
(`cycle_memory`). Here both ways are checked against the plain sort, over random pools with
queues that tie (equal shares, no work yet) and several cycles of carried records.
"""

from __future__ import annotations

import random

import pytest
from cycle_builders import snapshot
from test_cycle_never_rules import _arrivals, _nodes, _tree

from gpufair.domain.cycle_load import load
from gpufair.domain.cycle_memory import CarriedLoad
from gpufair.domain.cycle_state import CycleState, Pending
from gpufair.domain.model import Workload


def _sorted(state: CycleState, items: list[Pending]) -> list[Pending]:
    return sorted(items, key=lambda item: (-item.book.tier, item.book.ratio(), item.order))


def _run(seed: int) -> int:
    """One random run, each cycle's order checked; returns how many queues tied (merged)."""
    rng = random.Random(seed)
    nodes = _nodes(rng)
    tree = _tree(rng)
    names = [leaf.name for leaf in tree.leaves]
    waiting: dict[str, Workload] = {}
    carried = CarriedLoad()
    ties = 0
    for cycle in range(6):
        waiting.update((w.uid, w) for w in _arrivals(rng, names, cycle))
        for uid in [u for u in waiting if rng.random() < 0.2]:
            del waiting[uid]
        shares = {name: rng.choice([0.0, 8.0, 8.0, 30.0]) for name in names}
        snap = snapshot(
            nodes,
            tree.leaves,
            shares,
            pending=waiting.values(),
            now_s=1_000.0 + 100.0 * cycle,
            inner_queues=tree.inner,
        )
        state = CycleState(snap, carried if cycle % 3 else None)
        load(state)
        groups: dict[str, list[Pending]] = {}
        everything: list[Pending] = []
        for name, items in state.queue_pending.items():
            assert items == sorted(items, key=lambda item: item.order), (seed, cycle, name)
            taken = [item for item in items if rng.random() < 0.7]
            if taken:
                groups[name] = taken
                everything += taken
        ties += sum(len(run) - 1 for run in state.queue_runs(groups))
        expected = _sorted(state, everything)
        assert state.by_queue_order(groups) == expected, (seed, cycle)
        rng.shuffle(everything)
        assert state.in_queue_order(everything) == expected, (seed, cycle)
    return ties


@pytest.mark.parametrize("seed", range(20))
def test_queue_by_queue_order_is_the_sort(seed: int) -> None:
    _run(seed)


def test_the_runs_have_queues_that_tie() -> None:
    """Not vacuous: queues that tie are merged by workload order in some cycles."""
    assert sum(_run(seed) for seed in range(20)) >= 10
