"""The claims' holds are made by cheaper building blocks than `Capacity.take` and the records'
constructors: `Capacity.take_pod` (one pod, from its fields) and `Capacity.take_pods` (several
pods in one pass), and `CycleState.hold` / `hold_one` building the record themselves. Each must
leave exactly what the plain way leaves: every node's use, counts and version, the buckets in
their order, the part-used and partitioned node sets, the pool's version, the record and the
queue's book."""

from __future__ import annotations

import random

import pytest
from cycle_builders import A100, node, queue, snapshot, workload

from gpufair.domain.capacity import Capacity, PodUse
from gpufair.domain.cycle import load
from gpufair.domain.cycle_state import CycleState
from gpufair.domain.model import Node, PodBinding
from gpufair.domain.snapshot import PendingCode, Reservation, ReservationKind


def _nodes(count: int) -> list[Node]:
    return [
        Node(f"n{i}", "p", "a100" if i % 3 else "h100", 8, 64_000, 512_000) for i in range(count)
    ]


def _everything(capacity: Capacity) -> list[object]:
    """All a take may change, orders included."""
    return [
        [
            (
                list(state.gpu_used),
                state.free_whole,
                state.partial_gpus,
                state.cpu_free,
                state.memory_free,
                None if state.slices is None else list(state.slices),
                state.version,
            )
            for state in capacity.nodes
        ],
        {
            gpu_type: [list(capacity.bucket(gpu_type, free)) for free in range(9)]
            for gpu_type in capacity.by_type
        },
        {gpu_type: list(capacity.partial_nodes(gpu_type)) for gpu_type in capacity.by_type},
        {gpu_type: list(capacity.partitioned_nodes(gpu_type)) for gpu_type in capacity.by_type},
        dict(capacity.free_whole_by_type),
        capacity.version,
        capacity._next_version,
    ]


def _random_use(rng: random.Random, count: int) -> PodUse:
    """A pod on a random node: whole GPUs (often on GPUs already used, as a hold over a victim
    that still runs), a share of one GPU, or CPU and memory only."""
    index = rng.randrange(count)
    roll = rng.random()
    cpu, memory = rng.choice((0, 1_000, 8_000)), rng.choice((0, 4_000, 64_000))
    if roll < 0.6:
        gpus = tuple(rng.sample(range(8), rng.choice((1, 1, 2, 4))))
        return PodUse(index, gpus, 1.0, cpu, memory)
    if roll < 0.95:
        return PodUse(index, (rng.randrange(8),), rng.choice((0.25, 0.5, 0.3)), cpu, memory)
    return PodUse(index, (), 0.0, cpu, memory)


def _pool(rng: random.Random, count: int) -> tuple[Capacity, Capacity]:
    """Two equal capacities, already used by random pods; some nodes hold a partition (their
    `slices` kept, so the take re-indexes them as `_apply` does)."""
    nodes = _nodes(count)
    one, plain = Capacity(nodes), Capacity(nodes)
    for _ in range(rng.randint(0, 3 * count)):
        use = _random_use(rng, count)
        one.take((use,))
        plain.take((use,))
    for index in rng.sample(range(count), rng.randint(0, 2)):
        partition = PodUse(index, (rng.randrange(8),), 1.0, 0, 0, 0b11)
        one.take((partition,))
        plain.take((partition,))
    assert _everything(one) == _everything(plain)
    return one, plain


@pytest.mark.parametrize("seed", range(40))
def test_take_pod_changes_the_capacity_exactly_as_take_of_its_pod(seed: int) -> None:
    rng = random.Random(seed)
    count = rng.randint(1, 6)
    one, plain = _pool(rng, count)
    for _ in range(12):
        use = _random_use(rng, count)
        state = one.take_pod(*use[:5])
        plain.take((use,))
        assert state is one.nodes[use.node]
        assert _everything(one) == _everything(plain)


def test_take_pod_moves_a_node_between_buckets_and_part_used_sets() -> None:
    capacity = Capacity(_nodes(3))  # n1, n2: a100; n0: h100
    capacity.take_pod(1, (0, 1), 1.0, 1_000, 2_000)
    capacity.take_pod(2, (5,), 0.5, 0, 0)
    assert list(capacity.bucket("a100", 6)) == [1]
    assert list(capacity.bucket("a100", 7)) == [2]
    assert list(capacity.partial_nodes("a100")) == [2]
    assert capacity.free_whole_by_type["a100"] == 6 + 7
    capacity.take_pod(2, (5,), 0.5, 0, 0)  # the shared GPU is full: n2 no longer part-used
    assert list(capacity.partial_nodes("a100")) == []
    capacity.take_pod(1, (0,), 1.0, 0, 0)  # over a used GPU (a hold over a victim): no move
    assert capacity.nodes[1].gpu_used[:3] == [2.0, 1.0, 0.0]
    assert list(capacity.bucket("a100", 6)) == [1]
    assert capacity.nodes[1].cpu_free == 63_000


@pytest.mark.parametrize("seed", range(40))
def test_take_pods_changes_the_capacity_exactly_as_take_of_its_pods(seed: int) -> None:
    rng = random.Random(seed)
    count = rng.randint(1, 6)
    one, plain = _pool(rng, count)
    for _ in range(8):
        uses = [_random_use(rng, count) for _ in range(rng.randint(2, 5))]
        if rng.random() < 0.3:  # a node touched again after another (first-touch order)
            uses.append(uses[0]._replace(gpu_indices=(rng.randrange(8),)))
        touched = one.take_pods(uses)
        plain.take(uses)
        assert _everything(one) == _everything(plain)
        assert touched is not None
        assert list(touched) == list(dict.fromkeys(use.node for use in uses))
        assert all(touched[index] is one.nodes[index] for index in touched)


def test_take_pods_takes_nothing_where_a_pod_holds_a_partition() -> None:
    one, plain = Capacity(_nodes(2)), Capacity(_nodes(2))
    uses = [PodUse(0, (0,), 1.0, 0, 0), PodUse(1, (1,), 1.0, 0, 0, 0b1)]
    assert one.take_pods(uses) is None
    assert _everything(one) == _everything(plain)


def _state() -> CycleState:
    """Three free A100 nodes (10 CU per GPU) and queue a's pending work, loaded."""
    nodes = [node(f"n{i}", A100, 8) for i in range(3)]
    pending = [
        workload("w1", "a", gpus=1, cpu_millicores=1_000, memory_mib=2_000),
        workload("w2", "a", gpus=0.5),
        workload("w3", "a", 3, 2),
    ]
    state = CycleState(snapshot(nodes, [queue("a")], {"a": 40.0}, pending=pending))
    load(state)
    return state


@pytest.mark.parametrize(
    ("uid", "plan", "names", "gpus", "fraction"),
    [
        ("w1", [PodUse(2, (3,), 1.0, 1_000, 2_000)], ("n2",), 1.0, 1.0),
        ("w2", [PodUse(0, (6,), 0.5, 0, 0)], ("n0",), 0.5, 0.5),
        (
            "w3",
            [
                PodUse(2, (0, 1), 1.0, 0, 0),
                PodUse(0, (4, 5), 1.0, 0, 0),
                PodUse(2, (6, 7), 1.0, 0, 0),
            ],
            ("n0", "n2"),
            6.0,
            1.0,
        ),
    ],
)
def test_a_hold_records_and_counts_what_the_plain_way_does(
    uid: str, plan: list[PodUse], names: tuple[str, ...], gpus: float, fraction: float
) -> None:
    """One pod (whole GPUs, a share) by `hold_one`, three pods on two nodes by `take_pods`:
    the record equals the one its constructors build, the book counts the GPUs as held (10 CU
    per A100 GPU), the capacity is as `take` leaves it."""
    state, plain = _state(), _state()
    item = next(item for item in state.queue_pending["a"] if item.uid == uid)
    state.hold(item, "a100-80gb", plan)
    plain.capacity.take(plan)
    bindings = tuple(
        PodBinding(
            position,
            plain.capacity.nodes[use.node].name,
            use.gpu_indices,
            fraction,
            None,
        )
        for position, use in enumerate(plan)
    )
    expected = Reservation(uid, ReservationKind.EVICTED_CAPACITY, "a100-80gb", names, bindings)
    assert state.reservations == [expected]
    assert _everything_of(state) == _everything_of(plain)
    book = item.book
    assert book.allocated_cu == pytest.approx(10 * gpus)
    assert book.reserved_cu == book.allocated_cu
    assert book.gpus_by_type == {"a100-80gb": gpus}
    assert (item.done, item.code, item.held_nodes) == (
        True,
        PendingCode.WAITING_FOR_EVICTED_CAPACITY,
        len(names),
    )


def _everything_of(state: CycleState) -> list[object]:
    capacity = state.capacity
    return [
        [
            (list(s.gpu_used), s.free_whole, s.partial_gpus, s.cpu_free, s.memory_free, s.version)
            for s in capacity.nodes
        ],
        [list(capacity.bucket("a100-80gb", free)) for free in range(9)],
        list(capacity.partial_nodes("a100-80gb")),
        capacity.version,
    ]
