"""The passes over waiting work read only what can still change their outcome:

- reclaim passes over a queue, unread, whose trials left `NO_CAPACITY` by allocation
  (`CycleState.short_trials`) are all dead, and leaves a queue's list at the try that kills its
  last (`cycle_reclaim._reclaim_in_order`);
- the reservations keep what each group of nodes offers a gang's shape and size, and read again
  only the groups of the nodes held since (`cycle_reserve._fullest_hole`): the same holes as a
  read of every group at every gang;
- the reservations pass over a waiter whose gang its queue's room in its share cannot hold, and
  leave unread a queue whose every waiting trial is so refused (`cycle_reserve._Shares`);
- a queue's answer of its limits for work that is not preemptible serves both allocation
  passes (`CycleState.max_pods`)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from cycle_builders import node, queue, running, snapshot, workload

from gpufair.domain import cycle_reserve
from gpufair.domain.cycle import run_cycle
from gpufair.domain.cycle_allocate import allocate
from gpufair.domain.cycle_claims import honour_claims
from gpufair.domain.cycle_load import load
from gpufair.domain.cycle_reclaim import reclaim
from gpufair.domain.cycle_state import CycleState, Pending
from gpufair.domain.model import TopologyConstraint
from gpufair.domain.queuebook import QueueBook
from gpufair.domain.snapshot import CycleSnapshot, PendingCode


class _Counted(list[Pending]):
    """A queue's list that counts the workloads read from it by iteration."""

    read = 0

    def __iter__(self) -> Iterator[Pending]:
        for item in super().__iter__():
            self.read += 1
            yield item


def _no_room_to_reclaim() -> CycleSnapshot:
    """Node x's four GPUs run v's four one-GPU workloads (v: share 3, so 1 CU of surplus);
    node y's one GPU runs b0 of b (not preemptible). a (ratio 0) and b (ratio 1/8) wait with
    three and two four-GPU workloads within their share: none fits, and no reclaim frees 4
    GPUs within v's 1 CU of surplus."""
    victims = [workload(f"v{gpu}", "v") for gpu in range(4)]
    keeper = workload("b0", "b", preemptible=False)
    return snapshot(
        [node("x", gpus=4), node("y", gpus=1)],
        [queue("a"), queue("b"), queue("v")],
        {"a": 8, "b": 8, "v": 3},
        running_work=[
            *(running(job, [("x", (gpu,))]) for gpu, job in enumerate(victims)),
            running(keeper, [("y", (0,))]),
        ],
        pending=[
            workload("a1", "a", gpus=4),
            workload("a2", "a", gpus=4, submit_time_s=1),
            workload("a3", "a", gpus=4, submit_time_s=2),
            workload("b1", "b", gpus=4),
            workload("b2", "b", gpus=4, submit_time_s=1),
        ],
    )


def test_reclaim_leaves_a_queue_whose_trials_are_dead_unread() -> None:
    state = CycleState(_no_room_to_reclaim())
    load(state)
    honour_claims(state)
    allocate(state, within_share=True)
    trial = state.queue_pending["a"][0].trial
    assert state.short_trials == {"a": {trial}, "b": {trial}}
    lists = {name: _Counted(state.queue_pending[name]) for name in ("a", "b")}
    state.queue_pending.update(lists)
    reclaim(state)
    # a1 is read by the phase's test for any wanting workload, then tried: its search fails
    # (remembered); a2's try finds its type remembered and kills the one trial. a's list is
    # left there (a3 unread), b's is not read.
    assert (lists["a"].read, lists["b"].read) == (3, 0)
    assert state.evicts == []
    codes = {item.uid: item.code for name in lists for item in state.queue_pending[name][:]}
    assert codes == dict.fromkeys(["a1", "a2", "a3", "b1", "b2"], PendingCode.NO_CAPACITY)


def test_reclaim_without_short_trials_decides_the_same() -> None:
    # The whole cycle: nothing evicted, every waiting workload short of capacity.
    result = run_cycle(_no_room_to_reclaim())
    assert result.evicts == ()
    assert {uid: reason.code for uid, reason in result.pending.items()} == dict.fromkeys(
        ["a1", "a2", "a3", "b1", "b2"], PendingCode.NO_CAPACITY
    )


def _racks_and_gangs() -> CycleSnapshot:
    """Three racks of two four-GPU nodes; one GPU used on each node of r1, none elsewhere but
    what the waiting one-pod workloads leave; four queues each wait with a two-pod gang of
    four GPUs held to one rack, long enough for a reservation, and nothing is free enough."""
    nodes = [
        node(f"n{rack}{index}", gpus=4, rack=f"r{rack}") for rack in range(3) for index in range(2)
    ]
    filler = [workload(f"f{at}", "z", preemptible=False) for at in range(6)]
    used = [running(job, [(nodes[at].name, (0,))]) for at, job in enumerate(filler)]
    rack = TopologyConstraint("rack", required=True)
    gangs = [
        workload(f"g{name}", name, pods=2, gpus=4, topology=rack) for name in ("a", "b", "c", "d")
    ]
    return snapshot(
        nodes,
        [queue(name) for name in ("a", "b", "c", "d", "z")],
        {"a": 8, "b": 8, "c": 8, "d": 8, "z": 6},
        running_work=used,
        pending=gangs,
        gang_reservation_after_s=600,
        now_s=10_000.0,
        topology_levels=("rack",),
    )


def test_reservations_read_again_only_the_groups_of_nodes_held_since(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    reads: list[int] = []
    hole_in = cycle_reserve._hole_in

    def counted(*args: object, **kwargs: object) -> object:
        reads.append(1)
        return hole_in(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(cycle_reserve, "_hole_in", counted)
    kept = run_cycle(_racks_and_gangs())
    kept_reads = len(reads)
    # Every group read at every gang: what each look found is never kept.
    reads.clear()
    monkeypatch.setattr(cycle_reserve._Ranking, "best", lambda *args: None)
    monkeypatch.setattr(cycle_reserve._Ranking, "holes", lambda *args: {})
    every = run_cycle(_racks_and_gangs())
    # Three racks, three gangs served (one rack each, then none is left), read 3 + 1 + 1 + 1
    # times against 3 per gang.
    assert [r.nodes for r in kept.reservations] == [r.nodes for r in every.reservations]
    assert [r.workload_uid for r in kept.reservations] == ["ga", "gb", "gc"]
    assert kept.pending == every.pending
    assert (kept_reads, len(reads)) == (6, 12)


def _spent_shares() -> CycleSnapshot:
    """Queues a and c each hold 5 CU on node x (shares 9 and 9.5) and wait, long enough for a
    reservation, with 12 four-GPU workloads each; b runs 8 preemptible one-GPU workloads on
    y above its share of 0. Reclaim takes 4 of b's GPUs for c0 and 4 for a0; a and c then hold
    9 CU each, 0 and 0.5 CU short of their share, so none of their other 22 waiters can be
    reserved for."""
    nodes = [node("x", gpus=10), node("y")]
    work = [
        *(running(workload(f"a-run{i}", "a"), [("x", (i,))]) for i in range(5)),
        *(running(workload(f"c-run{i}", "c"), [("x", (5 + i,))]) for i in range(5)),
        *(running(workload(f"b{i}", "b"), [("y", (i,))], started_at_s=i) for i in range(8)),
    ]
    pending = [
        workload(f"{name}{i}", name, gpus=4, submit_time_s=i) for name in "ac" for i in range(12)
    ]
    return snapshot(
        nodes,
        [queue("a", 9), queue("b", 0), queue("c", 9)],
        {"a": 9, "b": 0, "c": 9.5},
        running_work=work,
        pending=pending,
        gang_reservation_after_s=600,
        now_s=10_000.0,
    )


def test_reservations_pass_over_waiters_their_share_cannot_hold(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    tried: list[str] = []
    reserve_gang = cycle_reserve.reserve_gang

    def counted(state: CycleState, item: Pending, *args: object, **kwargs: object) -> bool:
        tried.append(item.uid)
        return reserve_gang(state, item, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(cycle_reserve, "reserve_gang", counted)
    skipped = run_cycle(_spent_shares())
    skipped_tries = list(tried)
    # Every waiter tried, as without the test of the room.
    tried.clear()
    monkeypatch.setattr(cycle_reserve._Shares, "refuses", lambda *args: False)
    monkeypatch.setattr(cycle_reserve._Shares, "refuses_all", lambda *args: False)
    every = run_cycle(_spent_shares())
    assert (len(skipped_tries), len(tried)) == (0, 22)
    assert skipped == every
    assert sorted({evict.beneficiary_uid for evict in every.evicts}) == ["a0", "c0"]
    assert len(every.evicts) == 8
    assert every.reservations[2:] == ()  # the two claims' holds, no gang reservation
    waiting = {f"{name}{i}" for name in "ac" for i in range(1, 12)}
    assert {every.pending[uid].code for uid in waiting} == {PendingCode.NO_CAPACITY}


def test_a_queue_whose_waiting_trials_are_all_refused_is_not_read() -> None:
    state = CycleState(_spent_shares())
    load(state)
    honour_claims(state)
    allocate(state, within_share=True)
    reclaim(state)
    lists = {name: _Counted(state.queue_pending[name]) for name in ("a", "c")}
    state.queue_pending.update(lists)
    cycle_reserve.reserve_for_long_waits(state)
    # c (first in order: ratio 9 / 9.5 against a's 9 / 9) is read to meet its one trial, and
    # each of its waiters passed over; a, of the same trial, is not read.
    assert sorted(state.short_trials) == ["a", "c"]
    assert (lists["c"].read, lists["a"].read) == (12, 0)
    assert state.reservations[2:] == []


def test_an_answer_for_work_not_preemptible_serves_both_passes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    asked: list[bool] = []
    max_pods = QueueBook.max_pods

    def counted(book: QueueBook, *args: object) -> tuple[int, PendingCode | None]:
        asked.append(bool(args[-1]))
        return max_pods(book, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(QueueBook, "max_pods", counted)
    state = CycleState(
        snapshot(
            [node("x", gpus=4)],
            [queue("a", 2, limit_cu=4)],
            {"a": 2},
            pending=[workload("n", "a", pods=3, preemptible=False), workload("p", "a", pods=3)],
        )
    )
    load(state)
    book = state.books["a"]
    fixed, free = (item.workload for item in state.queue_pending["a"])
    within = state.max_pods(book, fixed, "unit", within_share=True)
    assert (
        state.max_pods(book, fixed, "unit", within_share=False)
        == within
        == (
            2,
            PendingCode.NON_PREEMPTIBLE_OVER_DESERVED,
        )
    )
    assert asked == [True]
    # Preemptible work beyond the share is held to the limit only: asked again.
    assert state.max_pods(book, free, "unit", within_share=True) == (2, PendingCode.OVER_FAIR_SHARE)
    assert state.max_pods(book, free, "unit", within_share=False) == (
        4,
        PendingCode.QUEUE_LIMIT,
    )
    assert asked == [True, True, False]


@pytest.mark.parametrize("allocated_cu", [0.0, 1.0, 2.0, 3.5, 6.0])
@pytest.mark.parametrize("limit_cu", [None, 3.0, 8.0])
def test_the_book_caps_work_not_preemptible_alike_in_both_passes(
    allocated_cu: float, limit_cu: float | None
) -> None:
    # `CycleState.max_pods` keys work that is not preemptible as of the pass within the share
    # in both passes: it rests on `QueueBook.max_pods` answering such work alike in both, which
    # a change of the book's rules must keep (or change the key).
    state = CycleState(
        snapshot([node("x", gpus=8)], [queue("a", 8, limit_cu=limit_cu)], {"a": 4}, pending=[])
    )
    book = state.books["a"]
    # Deserved 8 above the share 4 and nothing held not preemptible: the share is the cap
    # that binds such work first.
    book.allocated_cu = allocated_cu
    for gpus in (0.5, 1.0, 2.0):
        answers = [book.max_pods(gpus, gpus, "unit", False, within) for within in (True, False)]
        assert answers[0] == answers[1], (gpus, answers)
        preemptible = [book.max_pods(gpus, gpus, "unit", True, within) for within in (True, False)]
        # The premise is not empty: preemptible work is capped by the share in one pass only.
        if allocated_cu >= 4.0 and limit_cu != 3.0:
            assert preemptible[0][0] == 0 and preemptible[1][0] > 0, (gpus, preemptible)
