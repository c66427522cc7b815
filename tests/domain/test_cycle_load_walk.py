"""The pending load's walk beside the last load's workloads (`cycle_load_pending._aligned`),
the positions of the workloads it did not carry (`_misses`) and the uid check
(`_uid_taken`): exact positions and keys over stretches longer than one comparison."""

from __future__ import annotations

import copy
import math
import random

from cycle_builders import node, queue, running, snapshot, workload

from gpufair.domain.cycle import run_cycle
from gpufair.domain.cycle_load import load
from gpufair.domain.cycle_load_pending import (
    _aligned,
    _kept_before,
    _misses,
    _suffix,
    _uid_taken,
    _without,
)
from gpufair.domain.cycle_memory import CarriedLoad
from gpufair.domain.cycle_state import CycleState
from gpufair.domain.model import Allocation, Node, Queue, Workload
from gpufair.domain.snapshot import EvictionInFlight


def _carried(last: list[Workload], queued: list[bool]) -> CarriedLoad:
    """A carried state whose last load saw `last` and queued those marked in `queued`."""
    carried = CarriedLoad()
    carried.order = (tuple(last), bytes(queued))
    carried.pending = {id(w) >> 4: None for w, q in zip(last, queued, strict=True) if q}
    return carried


def test_the_walk_finds_every_parting_in_long_stretches() -> None:
    """300 workloads of two queues, the last load having queued all but 4 (never fitting,
    say); this load drops 7 at the edges of the stretches compared at once (0, 63, 64, 65,
    127, 128 and the last) and brings 2 new ones: 291 carried given again, the 7 dropped
    named per queue, the 4 not queued and the 2 new not carried, at their positions."""
    last = [workload(f"w{i}", "a" if i % 3 else "b") for i in range(300)]
    queued = [i not in (10, 100, 200, 250) for i in range(300)]
    carried = _carried(last, queued)
    gone = {0, 63, 64, 65, 127, 128, 299}
    new = [workload("n1", "a"), workload("n2", "b")]
    pending = [w for i, w in enumerate(last) if i not in gone]
    pending.insert(150, new[0])
    pending.insert(5, new[1])
    found = _aligned(tuple(pending), carried)
    assert found is not None
    hits, dropped = found
    assert len(hits) == 295
    assert sum(hits) == 289  # 300 - 4 not queued - 7 dropped
    not_carried = [pending[at].uid for at in _misses(hits)]
    assert not_carried == ["n2", "w10", "w100", "n1", "w200", "w250"]
    assert {name: sorted(w.uid for w in left.values()) for name, left in dropped.items()} == {
        "a": ["w127", "w128", "w299", "w64", "w65"],
        "b": ["w0", "w63"],
    }
    assert all(key == id(w) >> 4 for left in dropped.values() for key, w in left.items())


def test_the_walk_over_the_same_workloads_finds_no_parting() -> None:
    last = [workload(f"w{i}", "a") for i in range(1_000)]
    found = _aligned(tuple(last), _carried(last, [True] * 1_000))
    assert found == (bytes([1] * 1_000), {})


def test_misses_are_the_positions_of_false_both_ways() -> None:
    """Few (under a sixteenth: found one by one) and many (the pass over all)."""
    few = [True] * 100
    for at in (0, 1, 17, 99):
        few[at] = False
    assert _misses(bytearray(few)) == [0, 1, 17, 99]
    many = [at % 3 == 0 for at in range(30)]
    assert _misses(bytearray(many)) == [at for at in range(30) if at % 3]
    assert _misses(bytearray()) == []
    assert _misses(bytearray([1] * 5)) == []


def test_the_uid_check_asks_the_carried_workloads_given_again() -> None:
    """With the uids of the carried workloads not given again (`gone`): a uid of one of
    those is free, a uid of one given again is taken; with the keys given again, the
    reverse."""
    jobs = [workload(f"w{i}", "a") for i in range(3)]
    carried = CarriedLoad()
    run_cycle(snapshot([node("n1", gpus=1)], [queue("a", 1.0)], {"a": 1.0}, pending=jobs), carried)
    assert sorted(carried.by_uid) == ["w0", "w1", "w2"]
    assert not _uid_taken(carried, ["w0", "x"], gone={"w0"})
    assert _uid_taken(carried, ["w1"], gone={"w0"})
    given = {id(jobs[1]) >> 4, id(jobs[2]) >> 4}
    assert not _uid_taken(carried, ["w0", "x"], given)
    assert _uid_taken(carried, ["w2"], given)


def test_a_bound_workload_now_running_leaves_the_other_carried_work_taken() -> None:
    """The next cycle's usual case: the workload a cycle bound runs (its uid is a fresh
    running one) and has left the pending list; the queue's 2 other workloads are taken
    from the carried records, and the cycle decides as one without them."""
    team = queue("team", 8.0)
    nodes = [node("n1", gpus=2)]
    jobs = [workload(f"w{i}", "team", pods=2, submit_time_s=float(i)) for i in range(3)]
    carried = CarriedLoad()
    first = run_cycle(snapshot(nodes, [team], {"team": 8.0}, pending=jobs), carried)
    assert [bind.workload_uid for bind in first.binds] == ["w0"]
    started = running(jobs[0], [("n1", (0,)), ("n1", (1,))])
    snap = snapshot(nodes, [team], {"team": 8.0}, running_work=[started], pending=jobs[1:])
    assert run_cycle(snap, carried) == run_cycle(snap)
    assert carried.reused == 2


def _one_busy_gpu() -> tuple[list[Node], list[Queue], Allocation]:
    """One node of one GPU, held by a running workload nothing evicts: pending work waits."""
    held = workload("r", "b", preemptible=False)
    return [node("n1", gpus=1)], [queue("a", 1.0), queue("b", 1.0)], running(held, [("n1", (0,))])


def test_items_by_uid_of_dropped_workloads_are_kept_but_never_read() -> None:
    """A load that only drops workloads keeps the items by uid (not copied) and lists the
    dropped uids (`CarriedLoad.left_uids`): a later eviction made for the uid of a dropped
    workload finds no claimant, and a running workload given that uid does not make the
    load start again without records; past an eighth of the table it is made anew."""
    nodes, queues, busy = _one_busy_gpu()
    jobs = [workload(f"w{i}", "a", submit_time_s=float(i)) for i in range(20)]
    shares = {"a": 1.0, "b": 1.0}
    carried = CarriedLoad()
    run_cycle(snapshot(nodes, queues, shares, running_work=[busy], pending=jobs), carried)
    table = carried.by_uid
    second = snapshot(nodes, queues, shares, running_work=[busy], pending=jobs[1:])
    assert run_cycle(second, carried) == run_cycle(second)
    assert carried.by_uid is table and carried.left_uids == {"w0"}
    claim = EvictionInFlight("r", "w0")
    third = snapshot(nodes, queues, shares, running_work=[busy], pending=jobs[1:], evicting=[claim])
    assert run_cycle(third, copy.copy(carried)) == run_cycle(third)
    again = running(workload("w0", "b"), [("n1", (0,), 0.0)])
    fourth = snapshot(nodes, queues, shares, running_work=[busy, again], pending=jobs[1:])
    given = copy.copy(carried)
    assert run_cycle(fourth, given) == run_cycle(fourth)
    assert given.reused == 20  # the running record and the 19 carried items
    # More than an eighth of the table left: it is made anew without them.
    fifth = snapshot(nodes, queues, shares, running_work=[busy], pending=jobs[4:])
    assert run_cycle(fifth, carried) == run_cycle(fifth)
    assert not carried.left_uids and sorted(carried.by_uid) == sorted(j.uid for j in jobs[4:])


def test_rejected_workloads_given_again_keep_their_table_unless_a_uid_is_taken() -> None:
    """A never-fitting workload given again keeps its reason and the last load's table of
    them (the same object when all are given again); when its uid is also a new workload's
    or a running one's, the first of the uid wins as without records."""
    nodes, queues, busy = _one_busy_gpu()
    big = workload("x", "a", gpus=4.0)
    small = workload("w1", "a")
    shares = {"a": 1.0, "b": 1.0}
    carried = CarriedLoad()
    first = snapshot(nodes, queues, shares, running_work=[busy], pending=[big, small])
    run_cycle(first, carried)
    table = carried.rejected
    assert list(table) == [id(big)]
    given = copy.copy(carried)
    assert run_cycle(first, given) == run_cycle(first)
    assert given.rejected is table
    twin = workload("x", "a")
    doubled = snapshot(nodes, queues, shares, running_work=[busy], pending=[big, twin, small])
    assert run_cycle(doubled, copy.copy(carried)) == run_cycle(doubled)
    runs = running(workload("x", "b"), [("n1", (0,), 0.0)])
    taken = snapshot(nodes, queues, shares, running_work=[busy, runs], pending=[big, small])
    assert run_cycle(taken, copy.copy(carried)) == run_cycle(taken)


def test_rejected_workloads_where_they_were_are_marked_and_never_missed() -> None:
    """The kept order marks never-fitting workloads 2 (queued ones 1): given again where they
    were, even just after a workload that left (w0 here), the walk finds them (no misses) and
    all of them keep the last load's table and reasons; when one of them is gone, the other
    is looked up among the misses as before and keeps its reason. Each cycle decides as one
    without records."""
    nodes, queues, busy = _one_busy_gpu()
    jobs = [workload(f"w{i}", "a", submit_time_s=float(i)) for i in range(4)]
    bigs = [workload(f"x{i}", "a", gpus=4.0) for i in range(2)]
    shares = {"a": 1.0, "b": 1.0}
    carried = CarriedLoad()

    def cycle(pending: list[Workload], given: CarriedLoad) -> None:
        snap = snapshot(nodes, queues, shares, running_work=[busy], pending=pending)
        with_records, without = run_cycle(snap, given), run_cycle(snap)
        assert with_records == without
        assert list(with_records.pending) == list(without.pending)

    cycle([jobs[0], bigs[0], jobs[1], jobs[2], bigs[1], jobs[3]], carried)
    assert carried.order is not None and carried.order[1] == bytes([1, 2, 1, 1, 2, 1])
    table = carried.rejected
    assert list(carried.rejected_reasons) == ["x0", "x1"]
    again = (bigs[0], jobs[1], jobs[2], bigs[1], jobs[3])
    found = _aligned(again, carried)
    assert found is not None
    hits, dropped = found
    assert hits == bytearray([2, 1, 1, 2, 1]) and _misses(hits) == []
    assert [w.uid for left in dropped.values() for w in left.values()] == ["w0"]
    given = copy.copy(carried)
    cycle(list(again), given)
    assert given.rejected is table and given.reused == 4  # the running record, 3 items
    assert given.order is not None and given.order[1] == bytes([2, 1, 1, 2, 1])
    cycle([jobs[0], bigs[0], jobs[1], jobs[2], jobs[3]], carried)  # x1 gone
    assert list(carried.rejected) == [id(bigs[0])] and list(carried.rejected_reasons) == ["x0"]
    assert carried.order is not None and carried.order[1] == bytes([1, 2, 1, 1, 1])


def test_running_records_added_on_the_kept_ones_until_an_eighth() -> None:
    """Loads that start from the kept capacity keep its records and add theirs beside them
    (`CarriedLoad.running_added`): each next load still starts from the kept capacity, and
    the records are merged once the added ones pass an eighth of the kept; a load that
    cannot start from it finds the records of both."""
    nodes = [node(f"n{i}", gpus=8) for i in range(4)]
    team = queue("team", 32.0)
    jobs = [workload(f"r{i}", "team") for i in range(19)]
    work = [running(job, [(f"n{i % 4}", (i // 4,))]) for i, job in enumerate(jobs)]
    waiting = [workload("p", "team", gpus=8.0)]
    carried = CarriedLoad()
    first = snapshot(nodes, [team], {"team": 32.0}, running_work=work[:16], pending=waiting)
    run_cycle(first, carried)
    kept = carried.running
    for count, added in ((17, 1), (18, 2), (19, 0)):
        snap = snapshot(nodes, [team], {"team": 32.0}, running_work=work[:count], pending=waiting)
        assert run_cycle(snap, carried) == run_cycle(snap)
        assert carried.shared == count - 1
        assert len(carried.running_added) == len(carried.victims_added) == added
        state = CycleState(snap, copy.copy(carried))
        load(state)  # the victims of both, in order
        assert list(state.running) == [job.uid for job in jobs[:count]]
        assert (carried.running is kept) == (count < 19)
        if added:  # a load that cannot start from the kept capacity finds every record
            given = copy.copy(carried)
            later = work[1:count]
            snap = snapshot(nodes, [team], {"team": 32.0}, running_work=later, pending=waiting)
            assert run_cycle(snap, given) == run_cycle(snap)
            assert given.shared == 0 and given.reused == count  # its records and the pending one
    assert len(carried.running) == 19


def test_a_queue_that_lost_records_keeps_the_rest_and_their_suffix_minima() -> None:
    """A queue of 300 records (seeded CU) loses 6 at positions 0, 1, 63, 64, 130 and 131:
    `_kept_before` names them and ends just past 131 (records 132 to 299 not read), and
    `_without` leaves 294 records, in order, whose suffix minima are those found anew from
    every CU left (the 168 after position 131 taken from the old minima as they were)."""
    rng = random.Random(5)
    names = [f"w{i}" for i in range(300)]
    ids = [1_000 + i for i in range(300)]
    cus = [rng.choice([1.0, 2.0, 4.0, 8.0, 0.5]) for _ in range(300)]
    dropped = [0, 1, 63, 64, 130, 131]
    left = {ids[at]: workload(names[at], "a") for at in reversed(dropped)}
    keep, end = _kept_before(ids, left)
    assert end == 132
    assert [at for at in range(end) if not keep[at]] == dropped
    records = (names, ids, cus, _suffix(cus))
    kept, kept_ids, kept_cus, least = _without(records, keep, end)  # type: ignore[arg-type]
    remaining = [at for at in range(300) if at not in dropped]
    assert kept == [names[at] for at in remaining]
    assert kept_ids == [ids[at] for at in remaining]
    assert kept_cus == [cus[at] for at in remaining]
    assert least == _suffix(kept_cus)
    assert len(least) == 295 and least[-1] == math.inf
