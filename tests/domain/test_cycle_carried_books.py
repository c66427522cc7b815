"""A cycle with carried records keeps the queue books its carried items hold, made new again
(`QueueBook.reset`), instead of giving every item a new one."""

from __future__ import annotations

from dataclasses import replace

from cycle_builders import node, queue, running, snapshot, workload

from gpufair.domain.cycle import run_cycle
from gpufair.domain.cycle_memory import CarriedLoad


def test_carried_items_keep_their_queue_book_made_new_again() -> None:
    """One queue of share 8 with 2 GPUs running and three pending workloads of 8 GPUs (none
    fits beside the running one on one 8-GPU node). Each later cycle with the records makes
    the same book object new again: the carried items hold it, its allocated CU reads 2.0
    (not 4.0, 6.0: counted once per cycle) and each result equals one without records. A node
    gone unready drops the records, and the book is a new object."""
    team = queue("team", 8.0)
    nodes = [node("n1")]
    pending = [workload(f"w{i}", "team", gpus=8) for i in range(3)]
    snap = snapshot(
        nodes,
        [team],
        {"team": 8.0},
        running_work=[running(workload("a", "team", gpus=2), [("n1", (0, 1))])],
        pending=pending,
    )
    carried = CarriedLoad()
    assert run_cycle(snap, carried) == run_cycle(snap)
    book = carried.books["team"]
    for _ in range(2):
        assert run_cycle(snap, carried) == run_cycle(snap)
        assert carried.books["team"] is book
        assert book.allocated_cu == 2.0
        items = carried.queues["team"][0]
        assert [item.uid for item in items] == ["w0", "w1", "w2"]
        assert all(item.book is book for item in items)
    changed = replace(snap, nodes=(replace(nodes[0], ready=False),))
    assert run_cycle(changed, carried) == run_cycle(changed)
    assert carried.books["team"] is not book
