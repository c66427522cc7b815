"""The common claim, one pod for one victim pod of a trial settled both ways, is placed and held
on the victim's node in one go (`cycle_claims._hold_on_victim_node`). It must make the same
holds, records, capacity and books as the general way it stands for (the queue's limits asked
through `pods_allowed`, `place_one_released`, `CycleState.hold`): random full pools, victims of
whole and shared GPUs, free GPUs beside them, partitions, queues with and without limits. So must the
claims of gangs and of several victim pods of such a trial, placed among the nodes their victims
free (`cycle_claims._hold_on_freed_nodes`) against `_serve`'s general way."""

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
from gpufair.domain.victim_search import Victim


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


def _gang_pool(seed: int) -> CycleSnapshot:
    """Full nodes of two types, queue b's running pods of one and two GPUs (some jobs of two
    pods, on one node or two, a few sharing a GPU), evicted in flight for claims of queues a
    and c (c has limits): gangs of two for two victims, one pod of two GPUs for two victims
    on one node or one job of two pods, gangs of two pods of two GPUs; now and then a victim
    beside others on a node another victim frees (the general way takes those)."""
    rng = random.Random(seed)
    count = rng.randint(4, 9)
    nodes = []
    work: list[Allocation] = []
    singles: list[tuple[str, int]] = []  # one-GPU victims: (uid, node)
    doubles: list[str] = []  # two-GPU victims, one pod or two pods on one node
    for index in range(count):
        gpu_type = UNIT if index % 2 else A100
        name = f"n{index}"
        nodes.append(node(name, gpu_type, 8, cpu_millicores=64_000, memory_mib=512_000))
        gpu = 0
        while gpu < 8:
            uid = f"b{index}-{gpu}"
            cpu = rng.choice((0, 4_000, 20_000))
            roll = rng.random()
            if roll < 0.15 and gpu <= 6:  # one job of two one-GPU pods on this node
                job = workload(uid, "b", 2, 1.0, cpu_millicores=cpu)
                pods = [(name, (gpu + 1,)), (name, (gpu,))]
                work.append(running(job, pods, gpu_type))
                doubles.append(uid)
                gpu += 2
            elif roll < 0.3 and gpu <= 6:
                job = workload(uid, "b", gpus=2.0, cpu_millicores=cpu)
                work.append(running(job, [(name, (gpu + 1, gpu))], gpu_type))
                doubles.append(uid)
                gpu += 2
            elif roll < 0.35:
                for half in (0, 1):  # two halves of one GPU
                    job = workload(f"{uid}-{half}", "b", gpus=0.5, cpu_millicores=cpu)
                    work.append(running(job, [(name, (gpu,), 0.5)], gpu_type))
                    singles.append((f"{uid}-{half}", index))
                gpu += 1
            else:
                job = workload(uid, "b", gpus=1.0, cpu_millicores=cpu)
                work.append(running(job, [(name, (gpu,))], gpu_type))
                singles.append((uid, index))
                gpu += 1
    rng.shuffle(singles)
    rng.shuffle(doubles)
    pending: list[Workload] = []
    evicting: list[EvictionInFlight] = []
    number = 0
    while singles or doubles:
        owner = rng.choice(("a", "a", "c"))
        uid = f"{owner}{number}"
        cpu = rng.choice((0, 0, 8_000, 40_000))
        roll = rng.random()
        victims: list[str] = []
        if roll < 0.35 and len(singles) >= 2:  # a gang of two for two one-GPU victims
            job = workload(uid, owner, 2, 1.0, float(number), cpu_millicores=cpu)
            victims = [singles.pop()[0], singles.pop()[0]]
        elif roll < 0.5 and len(singles) >= 2:  # one two-GPU pod for two victims on a node
            first, index = singles.pop()
            mates = [spot for spot in singles if spot[1] == index]
            if not mates:
                singles.insert(0, (first, index))
                continue
            singles.remove(mates[0])
            job = workload(uid, owner, gpus=2.0, submit_time_s=float(number), cpu_millicores=cpu)
            victims = [first, mates[0][0]]
        elif roll < 0.6 and len(singles) >= 3:  # three victims, two of them on one node
            first, index = singles.pop()
            mates = [spot for spot in singles if spot[1] == index]
            others = [spot for spot in singles if spot[1] != index]
            if not mates or not others:
                singles.insert(0, (first, index))
                continue
            singles.remove(mates[0])
            singles.remove(others[0])
            job = workload(uid, owner, 3, 1.0, float(number), cpu_millicores=cpu)
            victims = [first, mates[0][0], others[0][0]]
        elif doubles:  # one pod of two GPUs, or a gang of two, for a two-GPU victim or two
            if rng.random() < 0.3 and len(doubles) >= 2:
                job = workload(uid, owner, 2, 2.0, float(number), cpu_millicores=cpu)
                victims = [doubles.pop(), doubles.pop()]
            else:
                job = workload(
                    uid, owner, gpus=2.0, submit_time_s=float(number), cpu_millicores=cpu
                )
                victims = [doubles.pop()]
        elif singles:  # the common claim
            job = workload(uid, owner, gpus=1.0, submit_time_s=float(number), cpu_millicores=cpu)
            victims = [singles.pop()[0]]
        number += 1
        pending.append(job)
        evicting += [EvictionInFlight(victim, uid) for victim in victims]
    queues = [queue("a", 40.0), queue("b", 40.0), queue("c", 10.0, limit_cu=rng.choice((30, 90)))]
    shares = {"a": 40.0, "b": 40.0, "c": 10.0}
    return snapshot(nodes, queues, shares, running_work=work, pending=pending, evicting=evicting)


@pytest.mark.parametrize("seed", range(40))
def test_a_claim_held_on_the_freed_nodes_is_held_as_the_general_way(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Claims of gangs and of several victims of a settled trial, placed among the nodes
    their victims free (`_hold_on_freed_nodes`), make the same holds, records, capacity and
    books as the general way (`_serve`: `Capacity.released`, `place_released`)."""
    snap = _gang_pool(seed)
    fast = _after_claims(snap)
    monkeypatch.setattr(cycle_claims, "_hold_on_freed_nodes", lambda *_: False)
    assert fast == _after_claims(snap)


def test_the_pools_take_the_freed_nodes_path_every_way() -> None:
    """The gang pools reach `_hold_on_freed_nodes` with holds on one node and on several, for
    gangs and for one pod, under a limited queue, and give some claims back to `_serve`."""
    seen = {"one node": 0, "several nodes": 0, "gang": 0, "limited": 0, "declined": 0}
    taken = cycle_claims._hold_on_freed_nodes

    def counting(state: CycleState, item: Pending, pods: int, leaving: list[Victim]) -> bool:
        held = len(state.reservations)
        done = taken(state, item, pods, leaving)
        seen["declined"] += not done
        if len(state.reservations) > held:
            nodes = len(state.reservations[-1].nodes)
            seen["one node" if nodes == 1 else "several nodes"] += 1
            seen["gang"] += pods > 1
            seen["limited"] += not item.book.unlimited
        return done

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(cycle_claims, "_hold_on_freed_nodes", counting)
        for seed in range(40):
            _after_claims(_gang_pool(seed))
    assert seen["one node"] >= 50 and seen["several nodes"] >= 20, seen
    assert seen["gang"] >= 30 and seen["limited"] >= 10 and seen["declined"] >= 3, seen


@pytest.mark.parametrize("seed", range(10))
def test_a_common_claim_of_a_settled_trial_never_reaches_serve(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # `honour_claims` finds a claimant's settled trial by its `Pending.trial` number (twice the
    # trial's identity, plus one if preemptible: `Kind.trial_keys`); a claim of one pod for one
    # victim pod of such a trial goes straight to the victim's node, never through `_serve`.
    snap, _ = _pool(seed)
    state = CycleState(snap)
    load(state)
    honour_moves(state)
    real = cycle_claims._serve
    served: list[str] = []
    skipped: list[str] = []

    def serve(state: CycleState, item: Pending, memo: cycle_claims._Memo, *rest: object) -> None:
        leaving = state.leaving_for.get(item.uid) or []
        common = (
            item.workload.gang_min_pods == 1
            and len(leaving) == 1
            and len(leaving[0].uses) == 1
            and not leaving[0].uses[0].slice_mask
        )
        if common and id(item.kind.trial) in memo.settled:
            served.append(item.uid)
        real(state, item, memo, *rest)  # type: ignore[arg-type]

    def victim_node(
        state: CycleState, item: Pending, one: PodUse, allowed: dict[str, int] | None
    ) -> None:
        skipped.append(item.uid)
        hold_on_victim_node(state, item, one, allowed)

    hold_on_victim_node = cycle_claims._hold_on_victim_node
    monkeypatch.setattr(cycle_claims, "_serve", serve)
    monkeypatch.setattr(cycle_claims, "_hold_on_victim_node", victim_node)
    honour_claims(state)
    assert served == []
    assert skipped  # some claims went straight to their victim's node
