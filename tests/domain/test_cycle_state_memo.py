"""`CycleState.max_pods` keeps its answers in each queue's book until the book changes, and
`decisions` builds the cycle's records as their constructors do: both must give exactly what
the plain computation gives."""

from __future__ import annotations

import random

import pytest
from cycle_builders import A100, RTX4090, V100, node, queue, snapshot, workload

from gpufair.domain.cycle_state import CycleState
from gpufair.domain.decisions import (
    bind_decision,
    evict_decision,
    evicted_capacity,
)
from gpufair.domain.model import PodBinding, pod_binding
from gpufair.domain.snapshot import (
    BindDecision,
    EvictDecision,
    EvictReason,
    Reservation,
    ReservationKind,
)

_TYPES = (A100.name, V100.name, RTX4090.name)


def _state() -> CycleState:
    queues = [
        queue("plain", 40.0),
        queue("capped", 20.0, limit_cu=90.0),
        queue("typed", 10.0, limit_gpus_by_type={A100.name: 6.0}),
        queue("under-a", 10.0, parent="dept"),
        queue("under-b", 5.0, parent="dept"),
    ]
    inner = [queue("dept", limit_cu=70.0, limit_gpus_by_type={V100.name: 9.0})]
    fair = {"plain": 60.0, "capped": 50.0, "typed": 30.0, "under-a": 35.0, "under-b": 20.0}
    nodes = [node(f"n{i}", gpu_type) for i, gpu_type in enumerate((A100, V100, RTX4090))]
    return CycleState(snapshot(nodes, queues, fair, inner_queues=inner))


@pytest.mark.parametrize("seed", range(6))
def test_max_pods_answers_as_the_book_does_through_changes(seed: int) -> None:
    """Random asks between random binds and evictions on every kind of book (no limits, own
    limits, per-type limits, an inner queue's limits shared with a sibling): every answer is
    the one `QueueBook.max_pods` gives at that moment."""
    rng = random.Random(seed)
    state = _state()
    books = list(state.books.values())
    asked = 0
    for step in range(600):
        book = rng.choice(books)
        if rng.random() < 0.3:
            gpu_type = rng.choice(_TYPES)
            gpus = rng.choice((1.0, 2.0, 0.5))
            cu = gpus * state.weights[gpu_type]
            preemptible = rng.random() < 0.6
            if rng.random() < 0.4 and book.allocated_cu >= cu:
                book.remove(cu, gpus, gpu_type, preemptible)
            else:
                book.add(cu, gpus, gpu_type, preemptible)
            continue
        gpus_per_pod = rng.choice((1.0, 2.0, 4.0, 0.5))
        preemptible = rng.random() < 0.5
        within_share = rng.random() < 0.5
        item = workload(f"w{step}", book.name, gpus=gpus_per_pod, preemptible=preemptible)
        gpu_type = rng.choice(_TYPES)
        for _ in range(2):  # the second ask of an unchanged book is answered from its memo
            found = state.max_pods(book, item, gpu_type, within_share)
            expected = book.max_pods(
                gpus_per_pod * state.weights[gpu_type],
                gpus_per_pod,
                gpu_type,
                preemptible,
                within_share,
            )
            assert found == expected
            asked += 1
    assert asked > 600


def test_books_without_limits_are_told_apart() -> None:
    state = _state()
    unlimited = {name for name, book in state.books.items() if book.unlimited}
    assert unlimited == {"plain"}


def test_decision_records_equal_their_constructors() -> None:
    bindings = (pod_binding(0, "n0", (1, 2), 1.0, None), pod_binding(1, "n1", (0,), 0.5, 3))
    made = bind_decision("w", "q", A100.name, bindings, 20.0, True)
    assert made == BindDecision("w", "q", A100.name, bindings, 20.0, True)
    assert made.gpus_by_type == {}
    assert made.gpus_by_type is not bind_decision("v", "q", A100.name, (), 0.0, False).gpus_by_type
    held = evicted_capacity("w", V100.name, ("n0", "n1"), bindings)
    assert held == Reservation(
        "w", ReservationKind.EVICTED_CAPACITY, V100.name, ("n0", "n1"), bindings
    )
    one = evicted_capacity("w", V100.name, ("n1",), (pod_binding(0, "n1", (0,), 0.5, 3),))
    expected = Reservation(
        "w",
        ReservationKind.EVICTED_CAPACITY,
        V100.name,
        ("n1",),
        (PodBinding(0, "n1", (0,), 0.5, 3),),
    )
    assert one == expected
    assert repr(one) == repr(expected)
    evict = evict_decision("v", "q", EvictReason.RECLAIM, "why", "w", 4.0)
    assert evict == EvictDecision("v", "q", EvictReason.RECLAIM, "why", "w", 4.0)
    assert (evict.move_to, evict.move_gpu_type) == ((), "")
