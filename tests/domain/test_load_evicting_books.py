"""What evictions in flight take out of the queue books (`QueueBook.remove`, as
`cycle_load.load_evicting` asks it): exactly the sums `add` of the negated amounts makes, in the
same order."""

from __future__ import annotations

from cycle_builders import RTX4090, node, queue, running, snapshot, workload

from gpufair.domain.cycle_load import load_evicting, load_running
from gpufair.domain.cycle_state import CycleState
from gpufair.domain.queuebook import LimitBook, QueueBook
from gpufair.domain.snapshot import EvictionInFlight

# Amounts whose sums round differently in another order.
AMOUNTS = [(0.1, 0.25, True), (0.2, 0.5, False), (0.3, 0.125, True), (0.7, 1.0, False)]


def _numbers(book: QueueBook) -> tuple[object, ...]:
    inner = [(a.allocated_cu, dict(a.gpus_by_type)) for a in book.ancestors]
    return (book.allocated_cu, book.nonpreemptible_cu, dict(book.gpus_by_type), inner)


def _book(limited: bool) -> QueueBook:
    dept = queue("dept", limit_cu=100.0)
    ancestors = (LimitBook(dept, "p"),) if limited else ()
    return QueueBook(queue("team", 1.0, parent="dept"), "p", 1.0, {"a100": 1.0}, ancestors)


def test_remove_is_add_of_the_negated_amounts_to_the_last_bit() -> None:
    for limited in (False, True):
        removed, added = _book(limited), _book(limited)
        for book in (removed, added):
            book.add(1.0, 4.0, "a100", False)
        for cu, gpus, preemptible in AMOUNTS:
            removed.answers = {}
            removed.remove(cu, gpus, "a100", preemptible)
            assert removed.answers is None
            added.add(-cu, -gpus, "a100", preemptible)
        assert _numbers(removed) == _numbers(added)
        # 1 - 0.1 - 0.2 - 0.3 - 0.7, in that order (not the 0.3 of exact arithmetic)
        assert removed.allocated_cu == ((((1.0 - 0.1) - 0.2) - 0.3) - 0.7)
        assert removed.nonpreemptible_cu == (1.0 - 0.2) - 0.7
        assert removed.gpus_by_type == {"a100": 4.0 - 0.25 - 0.5 - 0.125 - 1.0}


def test_evictions_in_flight_leave_the_books_as_remove_does() -> None:
    """Four running workloads of a team under a department with a CU limit and four of a team
    without one (1, 1, 2 and 4 GPUs of 2 CU each; two not preemptible), three of each evicted:
    each book holds the first one's GPUs, counts the three as evicting (14 CU), drops its
    memoised limits, and the department's book holds its team's first, as the same adds and
    removes in the snapshot's order make them."""
    dept = queue("dept")
    dept_with_limit = queue("dept", limit_cu=100.0)
    teams = [queue("limited", 8.0, parent="dept"), queue("free", 8.0)]
    nodes = [node(f"n{i}", RTX4090, gpus=8) for i in range(2)]
    sizes = [1, 1, 2, 4]
    work = []
    for at, team in enumerate(("limited", "free")):
        for i, gpus in enumerate(sizes):
            job = workload(f"{team}{i}", team, gpus=gpus, preemptible=i % 2 == 0)
            start = sum(sizes[:i])
            placed = [(f"n{at}", tuple(range(start, start + gpus)))]
            work.append(running(job, placed, RTX4090))
    evicting = [EvictionInFlight(a.workload.uid, None) for a in work if a.workload.uid[-1] != "0"]
    for inner, limited in ((dept, False), (dept_with_limit, True)):
        snap = snapshot(
            nodes,
            teams,
            {"limited": 8.0, "free": 8.0},
            running_work=work,
            evicting=evicting,
            inner_queues=[inner],
        )
        state = CycleState(snap)
        load_running(state, {}, None)
        for book in state.books.values():
            book.answers = {}
        load_evicting(state)
        assert bool(state.books["limited"].ancestors) is limited
        assert not state.books["free"].ancestors
        for name in ("limited", "free"):
            book = state.books[name]
            twin = _book(limited and name == "limited")
            for i, gpus in enumerate(sizes):
                twin.add(2.0 * gpus, float(gpus), RTX4090.name, i % 2 == 0)
            for i, gpus in enumerate(sizes[1:], start=1):
                twin.remove(2.0 * gpus, float(gpus), RTX4090.name, i % 2 == 0)
            assert book.answers is None
            assert (book.allocated_cu, book.evicting_cu, book.allocated_cu_before) == (
                2.0,
                14.0,
                16.0,
            )
            assert book.nonpreemptible_cu == 0.0  # the two not preemptible both leave
            assert book.gpus_by_type == {RTX4090.name: 1.0}
            assert _numbers(book)[:3] == _numbers(twin)[:3]
            if name == "limited" and limited:
                assert _numbers(book)[3] == [(2.0, {RTX4090.name: 1.0})]
