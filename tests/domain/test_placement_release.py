"""A placement on what a release would free (`placement_release`) is the one `place` makes after
releasing the same work under a journal: random full pools, random groups of running pods."""

from __future__ import annotations

import random

import pytest

from gpufair.domain.capacity import Capacity, Journal, PodUse
from gpufair.domain.model import Node, PlacementStrategy
from gpufair.domain.placement import place
from gpufair.domain.placement_ask import Ask, Exclusion, PodShape
from gpufair.domain.placement_release import (
    UNDECIDED,
    only_released,
    place_on_freed_nodes,
    place_one_released,
    place_released,
    released_whole_gpus,
)
from tests.domain.full_pools import ASKED_SHAPES, BINPACK, TYPES, capacity_state, full_pool


def _placed_after_release(
    capacity: Capacity,
    victims: list[tuple[PodUse, ...]],
    gpu_type: str,
    shape: PodShape,
    pods: int,
) -> list[PodUse] | None:
    """`place` on the capacity with `victims` released under a journal, then restored: the
    general way the fast placements must agree with."""
    journal = Journal()
    for uses in victims:
        capacity.release(uses, journal)
    placed = place(capacity, Ask(shape, gpu_type, pods, pods), BINPACK, Exclusion())
    capacity.restore(journal)
    return placed


@pytest.mark.parametrize("seed", range(40))
def test_a_placement_on_released_capacity_is_the_one_after_the_release(seed: int) -> None:
    _compare(seed)


def test_pods_sharing_a_gpu_are_placed_on_released_capacity() -> None:
    placed = [_compare(seed) for seed in range(40, 60)]
    assert sum(shared for shared, _ in placed) > 10  # on several nodes
    assert sum(undecided for _, undecided in placed) < sum(shared for shared, _ in placed)


def _compare(seed: int) -> tuple[int, int]:
    rng = random.Random(seed)
    capacity, running = full_pool(rng)
    compared = found = undecided = 0
    shared: set[int] = set()
    for _ in range(30):
        victims = rng.sample(running, min(len(running), rng.randint(1, 4)))
        before = capacity_state(capacity)
        released = capacity.released(victims)
        assert released is not None and capacity_state(capacity) == before  # nothing changed
        for shape in ASKED_SHAPES:
            for gpu_type in TYPES:
                no_room = place(capacity, Ask(shape, gpu_type, 1, 1), BINPACK, Exclusion()) is None
                if not only_released(capacity, gpu_type, shape, None, (), BINPACK, no_room):
                    continue
                for pods in (1, 2, 3):
                    fast = place_released(capacity, gpu_type, shape, pods, released)
                    if fast is UNDECIDED:
                        assert shape.shares_gpu
                        undecided += pods == 1
                        continue
                    expected = _placed_after_release(capacity, victims, gpu_type, shape, pods)
                    assert fast == expected
                    compared += 1
                    if shape.shares_gpu and expected is not None:
                        shared.add(expected[0].node)
                    found += expected is not None
        # Holds are taken on top of running work, as the claims take them.
        if rng.random() < 0.5:
            plan = place_released(capacity, TYPES[0], ASKED_SHAPES[0], 1, released)
            if plan is not None:
                capacity.take(plan)
    assert compared > 0 and found > 0
    return len(shared), undecided


def test_one_pod_for_one_victim_pod_is_placed_as_on_the_released_capacity() -> None:
    placed = [_compare_one(seed) for seed in range(30)]
    assert sum(compared for compared, _, _ in placed) > 300
    assert sum(found for _, found, _ in placed) > 30
    assert sum(shared for _, _, shared in placed) > 30


def _compare_one(seed: int) -> tuple[int, int, int]:
    rng = random.Random(1000 + seed)
    capacity, running = full_pool(rng)
    singles = [uses[0] for uses in running if len(uses) == 1]
    # Some single GPUs set free: nodes where a free GPU may come before the victim's.
    for use in rng.sample(singles, min(3, len(singles) - 1)):
        if len(use.gpu_indices) == 1 and use.gpu_amount == 1.0:
            capacity.release((use,))
            singles.remove(use)
    compared = found = shared = 0
    for _ in range(40):
        use = rng.choice(singles)
        if rng.random() < 0.5:  # the victim's GPUs in any order
            use = use._replace(gpu_indices=use.gpu_indices[::-1])
        gpu_type = capacity.nodes[use.node].gpu_type
        for shape in ASKED_SHAPES:
            no_room = place(capacity, Ask(shape, gpu_type, 1, 1), BINPACK, Exclusion()) is None
            if not only_released(capacity, gpu_type, shape, None, (), BINPACK, no_room):
                continue
            shared += shape.shares_gpu
            released = capacity.released([(use,)])
            assert released is not None
            expected = place_released(capacity, gpu_type, shape, 1, released)
            assert place_one_released(capacity, shape, use) == expected
            journal = Journal()
            capacity.release((use,), journal)
            assert place(capacity, Ask(shape, gpu_type, 1, 1), BINPACK, Exclusion()) == expected
            capacity.restore(journal)
            compared += 1
            found += expected is not None
        # Holds are taken on top of running work, as the claims take them.
        if rng.random() < 0.5:
            plan = place_one_released(capacity, ASKED_SHAPES[0], use)
            if plan is not None and only_released(
                capacity, gpu_type, ASKED_SHAPES[0], None, (), BINPACK
            ):
                capacity.take(plan)
    return compared, found, shared


def test_only_full_types_and_plain_gangs_are_decided_on_released_capacity() -> None:
    capacity = Capacity([Node("a", "p", "big", 8, 0, 0), Node("b", "p", "big", 8, 0, 0)])
    one = PodShape(1.0, 0, 0)
    assert not only_released(capacity, "big", one, None, (), BINPACK)  # free GPUs
    capacity.take([PodUse(0, tuple(range(8)), 1.0, 0, 0), PodUse(1, tuple(range(7)), 1.0, 0, 0)])
    assert only_released(capacity, "big", PodShape(2.0, 0, 0), None, (), BINPACK)
    assert not only_released(capacity, "big", one, None, (), BINPACK)  # one GPU is free
    capacity.take([PodUse(1, (7,), 1.0, 0, 0)])
    assert only_released(capacity, "big", one, None, (), BINPACK)
    assert not only_released(capacity, "big", one, None, ("rack",), BINPACK)
    assert not only_released(capacity, "big", one, None, (), PlacementStrategy.SPREAD)
    assert not only_released(capacity, "big", PodShape(0.5, 0, 0), None, (), BINPACK)
    assert only_released(capacity, "big", PodShape(0.5, 0, 0), None, (), BINPACK, no_room=True)
    assert not only_released(capacity, "other", one, None, (), BINPACK)
    partition = PodUse(0, (0,), 0.5, 0, 0, slice_mask=1)
    assert capacity.released([(partition,)]) is None


def _freed(victims: list[tuple[PodUse, ...]]) -> dict[int, list[PodUse]] | None:
    """The victims' pods by node, nodes in the order first touched; None where a node is
    touched by two victims beside other nodes (`place_on_freed_nodes` does not take those)."""
    freed: dict[int, list[PodUse]] = {}
    owner: dict[int, int] = {}
    for number, uses in enumerate(victims):
        for use in uses:
            freed.setdefault(use.node, []).append(use)
            if (
                owner.setdefault(use.node, number) != number
                and len({u.node for v in victims for u in v}) > 1
            ):
                return None
    return freed


@pytest.mark.parametrize("seed", range(30))
def test_a_gang_placed_on_the_freed_nodes_is_the_one_after_the_release(seed: int) -> None:
    """`place_on_freed_nodes` (no `ReleasedNode`) places as `place_released` and as `place`
    after the release: victims on nodes of their own, several on one node, in any order."""
    rng = random.Random(2000 + seed)
    capacity, running = full_pool(rng)
    compared = found = several = 0
    for _ in range(30):
        if rng.random() < 0.3:  # victims all on one node
            node = rng.choice(running)[0].node
            on_node = [uses for uses in running if all(use.node == node for use in uses)]
            victims = rng.sample(on_node, min(len(on_node), rng.randint(1, 3)))
        else:
            victims = rng.sample(running, min(len(running), rng.randint(1, 4)))
        freed = _freed(victims)
        if freed is None:
            continue
        released = capacity.released(victims)
        assert released is not None
        for shape in ASKED_SHAPES[:4]:
            for gpu_type in TYPES:
                if not only_released(capacity, gpu_type, shape, None, (), BINPACK):
                    continue
                for pods in (1, 2, 3, 5):
                    fast = place_on_freed_nodes(capacity, gpu_type, shape, pods, freed)
                    assert fast == place_released(capacity, gpu_type, shape, pods, released)
                    expected = _placed_after_release(capacity, victims, gpu_type, shape, pods)
                    assert fast == expected
                    compared += 1
                    found += expected is not None
                    several += expected is not None and len({use.node for use in expected}) > 1
        # Holds are taken on top of running work, as the claims take them.
        if rng.random() < 0.5:
            plan = place_released(capacity, TYPES[0], ASKED_SHAPES[0], 1, released)
            if plan is not None:
                capacity.take(plan)
    assert compared > 50 and found > 5, (compared, found)


@pytest.mark.parametrize("held_on_top", [False, True])
@pytest.mark.parametrize("free_gpu", [None, 0, 7])
def test_one_gpu_released_is_taken_only_where_it_is_the_first_untouched(
    held_on_top: bool, free_gpu: int | None
) -> None:
    """`released_whole_gpus` gives a one-GPU victim's own tuple back only on a node with no
    untouched GPU before the release and when the release frees that GPU: an untouched GPU of
    lower index is taken first, and a GPU still held by a hold on top of the victim is not
    free. Each case checked against `place` after the release."""
    capacity = Capacity([Node("n0", "p", TYPES[0], 8, cpu_millicores=64_000, memory_mib=256_000)])
    victims = [PodUse(0, (gpu,), 1.0, 1_000, 1_000) for gpu in range(8)]
    capacity.take(victims)
    victim = victims[3]
    if held_on_top:  # another claim's hold taken over the victim's GPU
        capacity.take([PodUse(0, (3,), 1.0, 1_000, 1_000)])
    if free_gpu is not None:
        capacity.release([victims[free_gpu]])
    shape = PodShape(1.0, 1_000, 1_000)
    expected = _placed_after_release(capacity, [(victim,)], TYPES[0], shape, 1)
    taken = released_whole_gpus(capacity.nodes[0], shape, victim)
    assert (None if taken is None else [PodUse(0, taken, 1.0, 1_000, 1_000)]) == expected
    if free_gpu is None and not held_on_top:
        assert taken is victim.gpu_indices  # the victim's own tuple, not a copy
