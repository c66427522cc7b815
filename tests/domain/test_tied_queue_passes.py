"""Reclaim and preempt read the waiting workloads in place, queue by queue; queues tied in the
order (same tier and ratio) are merged by workload order. The tries must come in the order of
`CycleState.in_queue_order` over the same workloads, the general way."""

from __future__ import annotations

import pytest
from cycle_builders import node, queue, running, snapshot, workload

from gpufair.domain import cycle_preempt, cycle_reclaim
from gpufair.domain.cycle import run_cycle
from gpufair.domain.cycle_state import CycleState, Pending


def _tied_snapshot(preempt: bool) -> object:
    nodes = [node(f"n{i}") for i in range(4)]
    names = ["ta", "tb", "tc"]
    work = []
    # Every GPU taken: by the tied queues' own low-class work (preempt), or by a queue
    # without a share (reclaim).
    owners = [*names, "victim"] if preempt else ["victim"] * 4
    for number, name in enumerate(owners):
        for index in range(8):
            job = workload(f"{name}-r{number}-{index}", name, priority_class=0)
            work.append(running(job, [(f"n{number}", (index,))]))
    pending = [
        workload(
            f"{names[index % 3]}-w{index}",
            names[index % 3],
            pods=1 + index % 4,
            gpus=1.0 + index // 4 % 3,
            submit_time_s=float(index),
            priority_class=5 if preempt else 0,
        )
        for index in range(24)
    ]
    queues = [queue(name, 8.0) for name in names] + [queue("victim", 0.0)]
    shares = dict.fromkeys(names, 8.0) | {"victim": 0.0}
    return snapshot(nodes, queues, shares, running_work=work, pending=pending)


@pytest.mark.parametrize("preempt", [False, True])
def test_tied_queues_are_tried_in_workload_order(
    monkeypatch: pytest.MonkeyPatch, preempt: bool
) -> None:
    tried: list[Pending] = []
    expected: list[list[str]] = []
    module = cycle_preempt if preempt else cycle_reclaim
    name = "_try_preempt" if preempt else "_try_reclaim"
    real = getattr(module, name)

    def counted(state: CycleState, item: Pending, *args: object) -> object:
        if not expected:
            wanting = [i for items in state.queue_pending.values() for i in items if not i.done]
            expected.append([i.uid for i in state.in_queue_order(wanting)])
        tried.append(item)
        return real(state, item, *args)

    monkeypatch.setattr(module, name, counted)
    run_cycle(_tied_snapshot(preempt))  # type: ignore[arg-type]
    uids = [item.uid for item in tried]
    assert len({item.book.name for item in tried}) >= 2  # the tie is read
    order = {uid: position for position, uid in enumerate(expected[0])}
    assert uids == sorted(uids, key=order.__getitem__)
