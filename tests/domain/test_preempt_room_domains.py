"""Preemption's room test (`cycle_preempt._room_short`) for a gang that must go into one topology
domain counts the pods each domain could hold with the queue's victims of a lower class gone
(`_domain_room_short`): room enough over the pool but in no one domain makes no search. And the
test reads the queue's victims not yet evicted only (`_Own.victims`)."""

from __future__ import annotations

from typing import Any

import pytest
from cycle_builders import count_victim_searches, node, queue, running, snapshot, workload

from gpufair.domain import cycle_preempt
from gpufair.domain.cycle import run_cycle
from gpufair.domain.model import TopologyConstraint
from gpufair.domain.snapshot import EvictReason, PendingCode


def _half_freeable(name: str, rack: str) -> tuple[Any, list[Any]]:
    """Node `name` in `rack`: four one-GPU class-0 jobs of queue a (GPUs 0-3) beside a
    non-preemptible four-GPU job of queue a (GPUs 4-7): four GPUs could be freed."""
    work = [
        running(workload(f"{name}-low{gpu}", "a"), [(name, (gpu,))], started_at_s=gpu)
        for gpu in range(4)
    ]
    keep = workload(f"{name}-keep", "a", gpus=4, preemptible=False)
    work.append(running(keep, [(name, (4, 5, 6, 7))]))
    return node(name, rack=rack), work


@pytest.mark.parametrize(
    ("racks", "searched"),
    [
        # One node per rack: each rack could hold one pod of four GPUs, the pool two.
        (("r1", "r2"), False),
        # Both nodes in one rack: it could hold the gang.
        (("r1", "r1"), True),
    ],
)
def test_a_gang_no_domain_could_hold_makes_no_search(
    monkeypatch: pytest.MonkeyPatch, racks: tuple[str, str], searched: bool
) -> None:
    nodes = []
    work = []
    for name, rack in zip(("x", "y"), racks, strict=True):
        made, jobs = _half_freeable(name, rack)
        nodes.append(made)
        work += jobs
    gang = workload(
        "gang",
        "a",
        pods=2,
        gpus=4,
        priority_class=5,
        topology=TopologyConstraint("rack", required=True),
    )
    searches = count_victim_searches(monkeypatch)
    result = run_cycle(
        snapshot(nodes, [queue("a", 16)], {"a": 16}, running_work=work, pending=[gang])
    )
    assert bool(searches) is searched
    if searched:
        assert result.pending["gang"].code is PendingCode.WAITING_FOR_EVICTED_CAPACITY
        assert len(result.evicts) == 8
        assert {evict.reason for evict in result.evicts} == {EvictReason.PREEMPT}
    else:
        assert result.pending["gang"].code is PendingCode.OVER_FAIR_SHARE
        assert result.evicts == ()


def test_the_room_test_reads_no_evicted_victim(monkeypatch: pytest.MonkeyPatch) -> None:
    # Four class-0 one-GPU victims on x beside a non-preemptible four-GPU job; a class-5 pod of
    # one GPU evicts one of them, then a class-5 pod of two GPUs is room-tested (pods of two
    # GPUs are tested at every search) and evicts two more.
    made, work = _half_freeable("x", "r1")
    pending = [
        workload("one", "a", priority_class=5, submit_time_s=0),
        workload("two", "a", gpus=2, priority_class=5, submit_time_s=1),
    ]
    room_short = cycle_preempt._room_short
    read: list[tuple[str, set[str], set[str]]] = []

    def recorded(state: Any, item: Any, gpu_type: str, own: Any, partitions: bool) -> bool:
        read.append((item.uid, {victim.uid for victim in own.victims}, set(state.evicted)))
        return room_short(state, item, gpu_type, own, partitions)

    monkeypatch.setattr(cycle_preempt, "_room_short", recorded)
    result = run_cycle(
        snapshot([made], [queue("a", 8)], {"a": 8}, running_work=work, pending=pending)
    )
    assert [uid for uid, _, _ in read] == ["one", "two"]
    (_, first, _), (_, second, evicted) = read
    assert first == {f"x-low{gpu}" for gpu in range(4)}
    assert len(evicted) == 1
    assert second == first - evicted
    assert result.pending["two"].code is PendingCode.WAITING_FOR_EVICTED_CAPACITY
    assert len(result.evicts) == 3
