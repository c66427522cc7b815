"""State carried between cycles (`cycle_memory`, issue 17): a cycle given the records the pool's
last cycle loaded decides exactly what a cycle without them decides.

The runs are those of the never-rules test (random pools, queue trees and arrivals; binds start,
work ends, victims stop): every cycle is run twice over the same snapshot, once with the carried
state (kept from cycle to cycle, as the service and the simulator keep it) and once without,
and the two results must be equal field for field. Workloads and allocations that stay are the
same objects from cycle to cycle, as `SnapshotRows` and the simulator hand them out, so most
records are reused; now and then a node goes down or comes back, which drops them all.
"""

from __future__ import annotations

import random
from dataclasses import fields, replace

import pytest
from cycle_builders import node, queue, running, snapshot, workload
from test_cycle_never_rules import _arrivals, _nodes, _tree

from gpufair.domain.capacity import Capacity
from gpufair.domain.cycle import run_cycle
from gpufair.domain.cycle_load import load
from gpufair.domain.cycle_memory import CarriedLoad
from gpufair.domain.cycle_state import CycleState
from gpufair.domain.decisions import pending_reason
from gpufair.domain.model import Allocation, Workload
from gpufair.domain.snapshot import CycleSnapshot, EvictionInFlight, PendingCode, PendingReason

CYCLES = 10


def _run(seed: int, stirred: list[bool] | None = None) -> tuple[int, int, int]:
    """One random run; returns (cycles, records reused, cycles after a change of hardware).
    `stirred`: the pending workloads are handed in a stirred order (a few swapped, now and
    then one twice), and whether each load kept the order for the next is appended."""
    rng = random.Random(seed)
    nodes = _nodes(rng)
    tree = _tree(rng)
    names = [leaf.name for leaf in tree.leaves]
    live: dict[str, Allocation] = {}
    waiting: dict[str, Workload] = {}
    in_flight: list[EvictionInFlight] = []
    standing: list[EvictionInFlight] = []
    carried = CarriedLoad()
    reused = 0
    changes = 0
    for cycle in range(CYCLES):
        now_s = 1_000.0 + 100.0 * cycle
        waiting.update((w.uid, w) for w in _arrivals(rng, names, cycle))
        if cycle == 4:  # a workload of no leaf queue, and one of another pool: no records
            waiting["stray"] = workload("stray", "nobody")
            waiting["elsewhere"] = replace(workload("elsewhere", names[0]), pool="other")
        if cycle % 4 == 3:  # a node goes down or comes back: the records are dropped
            at = rng.randrange(len(nodes))
            nodes[at] = replace(nodes[at], ready=not nodes[at].ready)
            changes += 1
        shares = {name: rng.choice([0.0, 2.0, 8.0, 30.0, 60.0]) for name in names}
        pending = list(waiting.values())
        if stirred is not None and pending:
            for _ in range(rng.randint(0, 3)):
                first, second = rng.randrange(len(pending)), rng.randrange(len(pending))
                pending[first], pending[second] = pending[second], pending[first]
            if rng.random() < 0.2:
                pending.insert(rng.randrange(len(pending) + 1), rng.choice(pending))
        snap = snapshot(
            nodes,
            tree.leaves,
            shares,
            running_work=live.values(),
            pending=pending,
            now_s=now_s,
            evicting=in_flight + standing,
            inner_queues=tree.inner,
        )
        with_carried = run_cycle(snap, carried)
        assert with_carried == run_cycle(snap), (seed, cycle)
        if cycle % 4 == 3:
            assert carried.reused == 0, (seed, cycle)
        reused += carried.reused
        if stirred is not None:
            stirred.append(carried.order is not None)
        for stopped in in_flight:
            victim = live.pop(stopped.victim_uid, None)
            if victim is not None and rng.random() < 0.5:
                waiting[victim.workload.uid] = victim.workload
        standing = in_flight
        leaving = {e.victim_uid for e in in_flight} | {e.workload_uid for e in with_carried.evicts}
        for uid in [u for u in live if u not in leaving and rng.random() < 0.15]:
            del live[uid]
        for bind in with_carried.binds:
            job = waiting.pop(bind.workload_uid)
            live[job.uid] = Allocation(job, bind.bindings, now_s, bind.gpu_type)
        in_flight = [
            EvictionInFlight(e.workload_uid, e.beneficiary_uid) for e in with_carried.evicts
        ]
    return CYCLES, reused, changes


@pytest.mark.parametrize("seed", range(60))
def test_a_cycle_with_the_last_cycles_records_decides_as_one_without(seed: int) -> None:
    cycles, _, changes = _run(seed)
    assert (cycles, changes) == (10, 2)


@pytest.mark.parametrize("seed", range(30))
def test_pending_work_in_a_stirred_order_decides_as_without_records(seed: int) -> None:
    """The load finds the carried workloads by walking the pending list beside the last one
    (`cycle_load_pending._aligned`); swapped and repeated workloads must decide the same."""
    kept: list[bool] = []
    assert _run(1_000 + seed, kept)[0] == 10
    assert len(kept) == 10


def test_stirred_runs_take_both_ways_of_finding_carried_work() -> None:
    """Not vacuous: across the stirred runs some loads keep the pending order for the next
    (the walk) and some do not (the look-ups)."""
    kept: list[bool] = []
    for seed in range(30):
        _run(1_000 + seed, kept)
    assert sum(kept) > 30 and len(kept) - sum(kept) > 30


def test_the_runs_reuse_records() -> None:
    """Not vacuous: across the runs, loading takes thousands of records from the cycle before
    (10,065 over the 60 runs when this was written)."""
    assert sum(_run(seed)[1] for seed in range(60)) >= 3_000


def test_the_capacity_after_shared_running_work_is_carried_exactly() -> None:
    """A load whose running allocations begin with the last load's (the same objects, in
    order) starts from a copy of the capacity after them and takes only the rest: here 2 of
    3, and the capacity comes out as a load without carried state makes it (every node's use,
    the free-GPU buckets in their order, the version numbers). Running work in another order,
    or without one of the last load's allocations, is all taken anew."""
    team = queue("team", 8.0)
    nodes = [node("n1"), node("n2", gpus=4)]
    a = running(workload("a", "team", gpus=2), [("n1", (0, 1))])
    b = running(workload("b", "team", pods=2), [("n2", (0,)), ("n1", (2,))])
    c = running(workload("c", "team", gpus=0.5), [("n2", (1,), 0.5)])
    carried = CarriedLoad()

    def loaded(allocations: list[Allocation], given: CarriedLoad | None) -> Capacity:
        state = CycleState(snapshot(nodes, [team], {"team": 8.0}, running_work=allocations), given)
        load(state)
        return state.capacity

    loaded([a, b], carried)
    assert carried.shared == 0
    for allocations, shared in (([a, b, c], 2), ([a, b, c], 3), ([b, a, c], 0), ([a, c], 0)):
        capacity = loaded(allocations, carried)
        assert carried.shared == shared
        fresh = loaded(allocations, None)
        assert [s.gpu_used for s in capacity.nodes] == [s.gpu_used for s in fresh.nodes]
        assert [s.free_whole for s in capacity.nodes] == [s.free_whole for s in fresh.nodes]
        assert [s.version for s in capacity.nodes] == [s.version for s in fresh.nodes]
        assert capacity.version == fresh.version
        for gpu_type in fresh.by_type:
            assert [list(capacity.bucket(gpu_type, k)) for k in range(9)] == [
                list(fresh.bucket(gpu_type, k)) for k in range(9)
            ]
            assert list(capacity.partial_nodes(gpu_type)) == list(fresh.partial_nodes(gpu_type))
    # The last load ([a, c]): a's 2 GPUs on n1, c's half GPU on n2.
    assert [s.gpu_used for s in capacity.nodes] == [[1, 1, 0, 0, 0, 0, 0, 0], [0, 0.5, 0, 0]]


def test_books_and_victims_after_shared_running_work_are_carried_exactly() -> None:
    """A load that starts from the kept capacity (its running work begins with the last
    load's) copies the books' totals and the victims after that work instead of adding them
    again, then adds only the rest: every leaf's and department's allocated, non-preemptible
    and before-the-cycle CU and GPUs per type, the victims in their order, and what an
    eviction in flight takes off, as a load without carried state makes them."""
    org = queue("org", limit_cu=40.0)
    team = queue("team", 8.0, parent="org", limit_gpus_by_type={"unit": 6})
    solo = queue("solo", 2.0)
    nodes = [node("n1"), node("n2", gpus=4)]
    a = running(workload("a", "team", gpus=2), [("n1", (0, 1))])
    b = running(workload("b", "solo", pods=2, preemptible=False), [("n2", (0,)), ("n1", (2,))])
    c = running(workload("c", "team", gpus=0.5), [("n2", (1,), 0.5)])
    d = running(workload("d", "solo"), [("n1", (3,))])
    carried = CarriedLoad()

    def books(allocations: list[Allocation], given: CarriedLoad | None) -> list[object]:
        snap = snapshot(
            nodes,
            [team, solo],
            {"team": 8.0, "solo": 2.0},
            running_work=allocations,
            evicting=[EvictionInFlight("b", "x")],
            inner_queues=[org],
        )
        state = CycleState(snap, given)
        load(state)
        inner = state.books["team"].ancestors[0]
        return [
            *(
                (
                    book.allocated_cu,
                    book.nonpreemptible_cu,
                    book.allocated_cu_before,
                    book.evicting_cu,
                    dict(book.gpus_by_type),
                )
                for book in state.books.values()
            ),
            (inner.name, inner.allocated_cu, dict(inner.gpus_by_type)),
            [(uid, r.victim.cu, r.victim.nodes) for uid, r in state.running.items()],
            sorted(state.leaving),
        ]

    books([a, b], carried)
    for allocations, shared in (([a, b, c], 2), ([a, b, c, d], 3), ([a, b, c, d], 4)):
        got = books(allocations, carried)
        assert carried.shared == shared
        assert got == books(allocations, None)
    assert got[0][0] == 2.5  # team: a and c
    assert got[1][:3] == (1.0, 0.0, 3.0)  # solo: b and d, b (not preemptible) leaving
    assert got[2] == ("org", 2.5, {"unit": 2.5})


def test_records_are_kept_only_for_objects_given_again() -> None:
    """Equal but new objects are loaded anew (the key is the object, not its value), and a
    change of the queues drops every record."""
    team = queue("team", 8.0)
    first = workload("w1", "team", pods=2)
    nodes = [node("n1")]
    carried = CarriedLoad()
    run_cycle(snapshot(nodes, [team], {"team": 8.0}, pending=[first]), carried)
    assert (carried.reused, len(carried.pending)) == (0, 1)
    run_cycle(snapshot(nodes, [team], {"team": 8.0}, pending=[first]), carried)
    assert carried.reused == 1
    run_cycle(snapshot(nodes, [team], {"team": 8.0}, pending=[replace(first)]), carried)
    assert carried.reused == 0
    renamed = queue("team", 4.0)
    run_cycle(snapshot(nodes, [renamed], {"team": 8.0}, pending=[first]), carried)
    assert carried.reused == 0


def _decides_as_without_records(snap: CycleSnapshot, carried: CarriedLoad) -> None:
    """A cycle given `carried` decides as one without records, reasons in the same order."""
    with_carried = run_cycle(snap, carried)
    without = run_cycle(snap)
    assert with_carried == without
    assert list(with_carried.pending) == list(without.pending)


def test_queues_are_carried_in_order_and_a_uid_given_twice_drops_them() -> None:
    """Pending work is carried as whole queues: the next cycle takes the workloads given again
    (3 of 4 here, in their order, with one new one merged in by order) and decides as a cycle
    without carried state, reasons in the same order; a workload the pool never holds keeps its
    reason (1 carried); a carried workload whose uid is also running is loaded as without
    records (0 taken)."""
    team = queue("team", 1.0)
    nodes = [node("n1", gpus=2)]
    jobs = [workload(f"w{i}", "team", pods=2, submit_time_s=float(i)) for i in range(4)]

    big = workload("big", "team", pods=3, submit_time_s=0.5)  # 3 GPUs: never on 2
    carried = CarriedLoad()

    def cycle(pending: list[Workload], running: tuple[Allocation, ...] = ()) -> None:
        snap = snapshot(nodes, [team], {"team": 1.0}, running_work=running, pending=pending)
        _decides_as_without_records(snap, carried)

    cycle([*jobs, big])
    assert (carried.reused, len(carried.pending), len(carried.rejected)) == (0, 4, 1)
    late = workload("w9", "team", pods=2, submit_time_s=1.5)
    cycle([jobs[3], late, big, jobs[0], jobs[1]])
    assert (carried.reused, len(carried.pending), len(carried.rejected)) == (3, 4, 1)
    assert [item.uid for item in carried.queues["team"][0]] == ["w0", "w1", "w9", "w3"]
    cycle([jobs[3], jobs[0]], (running(replace(jobs[0], pods=1), [("n1", (0,))]),))
    assert carried.reused == 0


def test_a_new_object_with_the_uid_of_a_carried_workload_drops_the_queues() -> None:
    """A pending workload not given before whose uid is that of a carried one given again is
    found by the uid check (`cycle_load_pending._uid_taken`), and everything is loaded as
    without records (the first of a uid wins); a workload the last load found never fitting,
    given again, is not asked (no queued workload has its uid) and keeps its reason."""
    team = queue("team", 1.0)
    nodes = [node("n1", gpus=2)]
    jobs = [workload(f"w{i}", "team", pods=2, submit_time_s=float(i)) for i in range(3)]
    big = workload("big", "team", pods=3, submit_time_s=0.5)  # 3 GPUs: never on 2
    carried = CarriedLoad()

    def cycle(pending: list[Workload]) -> None:
        snap = snapshot(nodes, [team], {"team": 1.0}, pending=pending)
        _decides_as_without_records(snap, carried)

    cycle([*jobs, big])
    assert (carried.reused, len(carried.pending), len(carried.rejected)) == (0, 3, 1)
    cycle([*jobs, big])
    assert (carried.reused, len(carried.pending), len(carried.rejected)) == (3, 3, 1)
    twin = replace(jobs[1], submit_time_s=0.25)  # a new object with w1's uid, first
    cycle([twin, *jobs, big])
    assert (carried.reused, len(carried.pending), len(carried.rejected)) == (0, 3, 1)
    assert [item.workload for item in carried.queues["team"][0]] == [jobs[0], twin, jobs[2]]


def test_a_queue_whose_numbers_stay_keeps_the_last_results_reasons() -> None:
    """A reason made of the queue's numbers and words around them is a function of those
    alone: a cycle whose queue numbers are the last result's takes that result's reasons (the
    same objects), one whose numbers moved (its fair share, here) makes them anew with the new
    numbers, each as a cycle without records writes them."""
    team = queue("team", 1.0)
    nodes = [node("n1", gpus=2)]
    both = running(workload("r", "team", pods=2), [("n1", (0, 1))])
    jobs = [workload("w0", "team"), workload("w1", "team", pods=2)]
    carried = CarriedLoad()

    def cycle(share: float) -> dict[str, PendingReason]:
        snap = snapshot(nodes, [team], {"team": share}, running_work=[both], pending=jobs)
        _decides_as_without_records(snap, carried)
        return dict(run_cycle(snap, carried).pending)

    first = cycle(1.0)
    assert first["w1"] == PendingReason(
        PendingCode.OVER_FAIR_SHARE,
        "needs 2 CU, beyond its queue's fair share (queue team: allocated 2 CU, fair share 1 "
        "CU, deserved 1 CU), and no spare capacity fits it",
    )
    assert carried.reasons["team"][0] == (
        "queue team: allocated 2 CU, fair share 1 CU, deserved 1 CU"
    )
    again = cycle(1.0)
    assert [again[uid] is first[uid] for uid in ("w0", "w1")] == [True, True]
    moved = cycle(1.5)
    assert moved["w0"].message == (
        "needs 1 CU, beyond its queue's fair share (queue team: allocated 2 CU, fair share "
        "1.5 CU, deserved 1 CU), and no spare capacity fits it"
    )


def test_a_reason_that_reads_more_of_its_queue_is_made_each_cycle() -> None:
    """A limit's reason reads the department above the queue, which its sibling changes while
    the queue's own numbers stay: it is written anew each cycle (here 2 CU held under `org`,
    then 3)."""
    org = queue("org", limit_cu=3.0)
    mine = queue("mine", 1.0, parent="org")
    sibling = queue("sibling", 1.0, parent="org")
    nodes = [node("n1")]
    own = running(workload("ra", "mine"), [("n1", (2,))])
    wanted = workload("wa", "mine", pods=2)
    carried = CarriedLoad()
    held = []
    for gpus in ((0,), (0, 1)):
        other = running(workload("rb", "sibling", pods=len(gpus)), [("n1", gpus)])
        snap = snapshot(
            nodes,
            [mine, sibling],
            {"mine": 1.0, "sibling": 1.0},
            running_work=[own, other],
            pending=[wanted],
            inner_queues=[org],
        )
        _decides_as_without_records(snap, carried)
        held.append(run_cycle(snap, carried).pending["wa"].message)
    assert held == [
        "would exceed the limit of queue org above its queue (limit 3 CU; the queues under it "
        f"hold {cu} CU, this needs 2 CU)"
        for cu in (2, 3)
    ]


def test_pending_reason_builds_the_dataclass_value() -> None:
    """`decisions.pending_reason` fills every field of `PendingReason`, equal to the
    constructor's."""
    made = pending_reason(PendingCode.NO_CAPACITY, "within its queue's fair share")
    assert made == PendingReason(PendingCode.NO_CAPACITY, "within its queue's fair share")
    assert [field.name for field in fields(PendingReason)] == ["code", "message"]
