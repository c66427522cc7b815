"""The common claim, one pod for one victim pod of a trial settled both ways, is placed and held
on the victim's node in one go (`cycle_claims._hold_on_victim_node`). It must make the same
holds, records, capacity and books as the general way it stands for (the queue's limits asked
through `pods_allowed`, `place_one_released`, `CycleState.hold`): random full pools, victims of
whole and shared GPUs, free GPUs beside them, partitions, queues with and without limits."""

from __future__ import annotations

import random

import pytest
from cycle_builders import A100, UNIT, node, queue, running, snapshot, workload

from gpufair.domain import cycle_claims
from gpufair.domain.capacity import PodUse
from gpufair.domain.cycle import honour_moves, load
from gpufair.domain.cycle_claims import honour_claims
from gpufair.domain.cycle_state import CycleState, Pending
from gpufair.domain.model import Allocation, Workload
from gpufair.domain.placement_release import place_one_released
from gpufair.domain.snapshot import CycleSnapshot, EvictionInFlight


def _general(state: CycleState, item: Pending, one: PodUse, allowed: dict[str, int] | None) -> None:
    """The general way: what `_hold_on_victim_node` did before it made the hold itself."""
    capacity = state.capacity
    gpu_type = capacity.nodes[one.node].gpu_type
    if gpu_type in item.kind.types and cycle_claims._pods(state, item, gpu_type, {}) >= 1:
        plan = place_one_released(capacity, item.kind.shape, one)
        if plan is not None:
            state.hold(item, gpu_type, plan)


def _pool(seed: int) -> tuple[CycleSnapshot, int]:
    """Nodes of two types filled by queue b's one-pod jobs (whole GPUs, shared GPUs, now and
    then a free GPU), most of them evicted in flight for one pending pod of queue a or c each
    (c has limits); a few a-gangs and several victims for one claimant take the general way."""
    rng = random.Random(seed)
    nodes = []
    work: list[Allocation] = []
    victims: list[str] = []
    beside_free: set[str] = set()  # victims on a node with a free GPU
    count = rng.randint(3, 8)
    # At most one free GPU per type: a two-GPU pod still fits nowhere before the release.
    free = {
        rng.choice([n for n in range(count) if (n % 3 == 0) == big]) * 8 + rng.randrange(8)
        for big in (True, False)
        if rng.random() < 0.7
    }
    for index in range(count):
        gpu_type = UNIT if index % 3 else A100
        name = f"n{index}"
        nodes.append(node(name, gpu_type, 8, cpu_millicores=64_000, memory_mib=512_000))
        gpu = 0
        while gpu < 8:
            if index * 8 + gpu in free:
                gpu += 1  # left free
                continue
            uid = f"b{index}-{gpu}"
            cpu, memory = rng.choice((0, 4_000, 30_000)), rng.choice((0, 64_000, 250_000))
            if rng.random() < 0.25:
                fraction = rng.choice((0.25, 0.5))
                job = workload(uid, "b", gpus=fraction, cpu_millicores=cpu, memory_mib=memory)
                work.append(running(job, [(name, (gpu,), fraction)], gpu_type))
                gpu += 1
            else:
                size = min(rng.choice((1, 1, 2, 4)), 8 - gpu)
                job = workload(uid, "b", gpus=size, cpu_millicores=cpu, memory_mib=memory)
                spread = tuple(range(gpu, gpu + size))
                if rng.random() < 0.3:
                    spread = spread[::-1]
                work.append(running(job, [(name, spread)], gpu_type))
                gpu += size
            victims.append(uid)
            if any(index * 8 <= spot < index * 8 + 8 for spot in free):
                beside_free.add(uid)
    rng.shuffle(victims)
    pending: list[Workload] = []
    evicting: list[EvictionInFlight] = []
    shapes = (
        (1.0, 0, 0),
        (1.0, 8_000, 64_000),
        (2.0, 0, 0),
        (2.0, 4_000, 0),
        (0.5, 0, 0),
        (0.25, 2_000, 0),
    )
    for number, victim in enumerate(victims[: int(len(victims) * 0.8)]):
        gpus, cpu, memory = rng.choice(shapes[2:4] if victim in beside_free else shapes)
        owner = rng.choice(("a", "a", "c"))
        pods = 2 if rng.random() < 0.05 else 1
        uid = f"{owner}{number}"
        pending.append(
            workload(
                uid,
                owner,
                pods,
                gpus,
                float(number),
                cpu_millicores=cpu,
                memory_mib=memory,
                preemptible=rng.random() < 0.8,
            )
        )
        evicting.append(EvictionInFlight(victim, uid))
        if rng.random() < 0.05 and victims[-1 - number] != victim:
            evicting.append(EvictionInFlight(victims[-1 - number], uid))
    queues = [queue("a", 40.0), queue("b", 40.0), queue("c", 10.0, limit_cu=rng.choice((30, 90)))]
    shares = {"a": 40.0, "b": 40.0, "c": 10.0}
    found = snapshot(nodes, queues, shares, running_work=work, pending=pending, evicting=evicting)
    return found, len(evicting)


def _after_claims(snap: CycleSnapshot) -> tuple[object, ...]:
    state = CycleState(snap)
    load(state)
    honour_moves(state)
    honour_claims(state)
    return (
        state.reservations,
        state.binds,
        capacity_state_of(state),
        [
            (name, book.allocated_cu, book.claimed_cu, book.reserved_cu, book.gpus_by_type)
            for name, book in state.books.items()
        ],
        [
            (item.uid, item.code, item.done, item.held_nodes)
            for items in state.queue_pending.values()
            for item in items
        ],
    )


def capacity_state_of(state: CycleState) -> list[object]:
    capacity = state.capacity
    return [
        (s.gpu_used.copy(), s.cpu_free, s.memory_free, s.free_whole, s.partial_gpus, s.version)
        for s in capacity.nodes
    ] + [
        [list(capacity.bucket(t, k)) for t in capacity.by_type for k in range(9)],
        [list(capacity.partial_nodes(t)) for t in capacity.by_type],
        capacity.version,
    ]


@pytest.mark.parametrize("seed", range(40))
def test_the_hold_on_the_victims_node_is_the_general_ways(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    snap, _ = _pool(seed)
    fused = _after_claims(snap)
    monkeypatch.setattr(cycle_claims, "_hold_on_victim_node", _general)
    assert fused == _after_claims(snap)


def test_the_pools_take_the_hold_on_the_victims_node_both_ways() -> None:
    """The random pools reach the fused hold with whole GPUs and shared ones, on nodes with
    free GPUs before the release, and under a limited queue's book."""
    seen = {"whole": 0, "shared": 0, "free before": 0, "limited": 0}
    taken = cycle_claims._hold_on_victim_node

    def counting(
        state: CycleState, item: Pending, one: PodUse, allowed: dict[str, int] | None
    ) -> None:
        held = len(state.reservations)
        free_before = state.capacity.nodes[one.node].free_whole > 0
        taken(state, item, one, allowed)
        if len(state.reservations) > held:
            seen["shared" if item.kind.shape.shares_gpu else "whole"] += 1
            seen["free before"] += free_before
            seen["limited"] += not item.book.unlimited

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(cycle_claims, "_hold_on_victim_node", counting)
        for seed in range(40):
            _after_claims(_pool(seed)[0])
    assert seen["whole"] >= 50 and seen["limited"] >= 20, seen
    assert seen["shared"] >= 3 and seen["free before"] >= 2, seen


@pytest.mark.parametrize("seed", range(10))
def test_a_hold_of_two_pods_names_its_nodes_in_index_order_once(seed: int) -> None:
    """`CycleState.hold` names a gang of two's nodes without a set and a sort: the same names."""
    rng = random.Random(seed)
    snap, _ = _pool(seed)
    state = CycleState(snap)
    load(state)
    items = [item for items in state.queue_pending.values() for item in items]
    capacity = state.capacity
    for item in rng.sample(items, min(len(items), 6)):
        nodes = [rng.randrange(len(capacity.nodes)) for _ in range(2)]
        if rng.random() < 0.3:
            nodes[1] = nodes[0]
        gpu_type = capacity.nodes[nodes[0]].gpu_type
        plan = [PodUse(index, (pod,), 1.0, 0, 0) for pod, index in enumerate(nodes)]
        state.hold(item, gpu_type, plan)
        expected = tuple(capacity.nodes[index].name for index in sorted(set(nodes)))
        assert state.reservations[-1].nodes == expected
        assert item.held_nodes == len(expected)
