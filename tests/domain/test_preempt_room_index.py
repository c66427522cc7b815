"""Preemption's room test (`cycle_preempt._room_short`) answers from the queue's victim index
once it is made: the GPUs each node could wholly free (`VictimIndex.freeable_pods`, a count of
nodes per GPUs freeable kept as victims leave) bound the pods, and room short by them is short
without reading a victim, the answer a count of the victims gives; for a gang that must keep
to one domain, domain by domain."""

from __future__ import annotations

from typing import Any

import pytest
from cycle_builders import halves_and_fours, node, queue, running, snapshot, workload

from gpufair.domain import cycle_preempt
from gpufair.domain.capacity import Capacity, PodUse
from gpufair.domain.cycle import run_cycle
from gpufair.domain.model import Node, TopologyConstraint
from gpufair.domain.snapshot import PendingCode
from gpufair.domain.victim_index import Victim, VictimIndex


class _Counted(dict[Any, int]):
    """A queue's victims (`_Own.victims`) that count how many a test reads."""

    read = 0

    def items(self) -> Any:
        for pair in dict.items(self):
            self.read += 1
            yield pair


def _recorded(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, bool, bool, int, bool]]:
    """Per room test: the workload, whether the index was made, the answer, the victims it
    read, and the answer of a count of the victims (the index and the kept counts hidden)."""
    room_short = cycle_preempt._room_short
    answers: list[tuple[str, bool, bool, int, bool]] = []

    def checked(state: Any, item: Any, gpu_type: str, own: Any, partitions: bool) -> bool:
        victims, index, room = own.victims, own.index, own.room
        own.victims = counted = _Counted(victims)
        answer = room_short(state, item, gpu_type, own, partitions)
        own.victims, own.index, own.room = victims, None, None
        by_victims = room_short(state, item, gpu_type, own, partitions)
        own.index, own.room = index, room
        answers.append((item.uid, index is not None, answer, counted.read, by_victims))
        return answer

    monkeypatch.setattr(cycle_preempt, "_room_short", checked)
    return answers


def test_a_short_room_is_answered_from_the_index_without_reading_a_victim(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Queue a's class-0 victims: on x, half of each GPU beside a non-preemptible half (no GPU
    # freed); on y, four one-GPU jobs beside a non-preemptible 4-GPU job. The one-GPU pod of
    # class 6 comes first: its test (no index yet) counts the victims, its search makes the
    # index and evicts y's most recent job. The gang of two 2-GPU pods of class 5 that comes
    # next passes the cheap test (7 victims' GPUs for 4) but y can now free three GPUs, one
    # pod, and x none: its test is answered from the index, reading no victim, and a count of
    # the victims (the index hidden) says the same.
    work = halves_and_fours()
    pending = [
        workload("one", "a", priority_class=6, submit_time_s=0),
        workload("pair", "a", pods=2, gpus=2, priority_class=5, submit_time_s=1),
    ]
    answers = _recorded(monkeypatch)
    result = run_cycle(
        snapshot(
            [node("x"), node("y")],
            [queue("a", 32)],
            {"a": 32},
            running_work=work,
            pending=pending,
        )
    )
    assert [evict.workload_uid for evict in result.evicts] == ["low3"]
    assert result.pending["one"].code is PendingCode.WAITING_FOR_EVICTED_CAPACITY
    assert answers[0][:3] == ("one", False, False)
    assert answers[0][3] >= 1  # no index yet: the victims are read
    assert answers[1:] == [("pair", True, True, 0, True)]
    assert result.pending["pair"].code is PendingCode.NO_CAPACITY


def test_a_gang_bound_to_one_rack_is_answered_per_rack_from_the_index(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # x in rack r1 and y in rack r2, each with four one-GPU class-0 jobs of queue a beside a
    # non-preemptible 4-GPU job. The one-GPU pod of class 6 makes the index and evicts y's most
    # recent job: x could then free four GPUs, y three. A gang of two 3-GPU pods that must keep
    # to one rack has room for two pods over the pool but one per rack: its test is answered
    # from the index, rack by rack, reading no victim, as a count of the victims answers.
    work = []
    for name, first in (("x", 0), ("y", 10)):
        for gpu in range(4):
            low = workload(f"{name}-low{gpu}", "a")
            work.append(running(low, [(name, (gpu,))], started_at_s=first + gpu))
        keep = workload(f"{name}-keep", "a", gpus=4, preemptible=False)
        work.append(running(keep, [(name, (4, 5, 6, 7))]))
    rack = TopologyConstraint("rack", required=True)
    pending = [
        workload("one", "a", priority_class=6, submit_time_s=0),
        workload("gang", "a", pods=2, gpus=3, priority_class=5, submit_time_s=1, topology=rack),
    ]
    answers = _recorded(monkeypatch)
    result = run_cycle(
        snapshot(
            [node("x", rack="r1"), node("y", rack="r2")],
            [queue("a", 32)],
            {"a": 32},
            running_work=work,
            pending=pending,
        )
    )
    assert [evict.workload_uid for evict in result.evicts] == ["y-low3"]
    assert answers[0][:3] == ("one", False, False)
    assert answers[1:] == [("gang", True, True, 0, True)]
    assert result.pending["gang"].code is PendingCode.NO_CAPACITY


def _victim(uid: str, node: int, gpus: tuple[int, ...], amount: float = 1.0) -> Victim:
    use = PodUse(node, gpus, amount, 1_000, 1_000)
    return Victim(
        uid,
        "q",
        0,
        0,
        100.0,
        10.0 * amount * len(gpus),
        amount * len(gpus),
        "a100",
        (use,),
        (node,),
    )


def test_the_pods_freeable_follow_the_victims_as_they_leave() -> None:
    # n0: two 2-GPU victims (4 freeable); n1: four one-GPU victims (4); n2: a half-GPU victim
    # beside a non-preemptible half on GPU 0 (nothing freed) and a one-GPU victim (1), three
    # GPUs free (4 in all).
    capacity = Capacity(Node(f"n{i}", "p", "a100", 4, 64_000, 512_000, {}) for i in range(3))
    victims = [
        _victim("a", 0, (0, 1)),
        _victim("b", 0, (2, 3)),
        *[_victim(f"c{gpu}", 1, (gpu,)) for gpu in range(4)],
        _victim("d", 2, (0,), 0.5),
    ]
    capacity.take(tuple(use for victim in victims for use in victim.uses))
    capacity.take((PodUse(2, (0,), 0.5, 0, 0),))  # the non-preemptible half
    index = VictimIndex(victims, capacity)
    assert index.freeable_on_node == {0: 4, 1: 4, 2: 3}
    assert [index.freeable_pods(whole) for whole in (1, 2, 3, 4)] == [11, 5, 3, 2]

    index.remove(victims[0])  # n0 keeps b: 2 GPUs freeable (a's stay used: nothing released)
    index.remove(victims[2])  # n1 keeps c1-c3
    assert index.freeable_on_node == {0: 2, 1: 3, 2: 3}
    assert [index.freeable_pods(whole) for whole in (1, 2, 3, 4)] == [8, 3, 2, 0]

    index.remove(victims[1])  # n0 leaves the index
    assert index.freeable_on_node == {1: 3, 2: 3}
    assert [index.freeable_pods(whole) for whole in (1, 2, 3, 4)] == [6, 2, 2, 0]
