"""The victim search's one-victim pick (`victim_greedy.greedy`): one pod that fits nowhere now,
and a first pick of one victim on one node, is placed on that node without releasing anything.
It must choose the same victim and the same GPUs as the general way (release the pick under a
journal, `place`, restore): random full pools, random victims, every asked shape."""

from __future__ import annotations

import math
import random

import pytest

from gpufair.domain.capacity import Capacity, Journal, PodUse
from gpufair.domain.model import Node
from gpufair.domain.placement import place
from gpufair.domain.placement_ask import Ask, Exclusion
from gpufair.domain.placement_fit import free_pods
from gpufair.domain.victim_greedy import Picked, Selection, greedy
from gpufair.domain.victim_search import Victim, VictimBudget, VictimIndex, select_victims
from tests.domain.full_pools import (
    ASKED_SHAPES,
    BINPACK,
    TYPES,
    capacity_state,
    full_pool,
    random_victims,
)


def _twin(capacity: Capacity) -> Capacity:
    """A capacity over the same nodes in exactly the same state (buckets' order included)."""
    twin = Capacity(
        [
            Node(s.name, "p", s.gpu_type, s.gpu_count, s.cpu_total, s.memory_total)
            for s in capacity.nodes
        ]
    )
    twin.copy_state_from(capacity)
    return twin


def _pick(
    capacity: Capacity, ask: Ask, index: VictimIndex, budget: VictimBudget, *, binpack: bool
) -> tuple[Picked | Selection | None, Journal]:
    """The greedy over the whole type, nothing excluded; `binpack` False keeps it from the
    one-victim path. Returns its answer and the journal of what it released."""
    trial = Journal()
    found = greedy(
        capacity,
        ask,
        None,
        index,
        Exclusion(),
        budget=budget,
        trial=trial,
        leaving_nodes=(),
        binpack=binpack,
    )
    return found, trial


def _general(
    capacity: Capacity, ask: Ask, index: VictimIndex, budget: VictimBudget
) -> tuple[list[Victim] | None, list[PodUse] | None]:
    """The pick the general way: the greedy without the one-victim path, then `place` on the
    capacity with its victims released."""
    found, trial = _pick(capacity, ask, index, budget, binpack=False)
    try:
        assert not isinstance(found, Selection)
        if found is None:
            return None, None
        return found.victims, place(capacity, ask, BINPACK, Exclusion())
    finally:
        capacity.restore(trial)


def _compare(seed: int) -> tuple[int, int]:
    """Searches made the one-victim way and compared, and how many of those had nodes with a
    pod's GPUs free that CPU or memory kept from fitting it (no free-GPU bucket test says
    "full" there: the count of pods that fit does)."""
    rng = random.Random(2000 + seed)
    capacity, running = full_pool(rng)
    victims = random_victims(capacity, running, rng, offered=0.8, classes=3, priced=True)
    indexes = {gpu_type: VictimIndex(found, capacity) for gpu_type, found in victims.items()}
    compared = gpus_free = 0
    for _ in range(12):
        gpu_type = rng.choice(TYPES)
        index = indexes[gpu_type]
        for shape in ASKED_SHAPES:
            ask = Ask(shape, gpu_type, 1, 1)
            if free_pods(capacity, shape, gpu_type, Exclusion()):
                continue  # a pod fits now: no search
            budget = VictimBudget({"q": math.inf}, {}, below_priority_class=rng.randint(1, 3))
            twin = _twin(capacity)  # for the general way, from the same state
            found, trial = _pick(capacity, ask, index, budget, binpack=True)
            capacity.restore(trial)
            if not isinstance(found, Selection):
                continue  # the general way itself
            assert not trial.nodes  # nothing was released for it
            chosen, plan = _general(twin, ask, index, budget)
            assert chosen == list(found.victims) and len(chosen) == 1
            assert plan == found.plan
            # Both leave the capacity the same, down to the order of the free-GPU buckets.
            assert capacity_state(capacity) == capacity_state(twin)
            whole = shape.whole_gpus
            gpus_free |= whole > 0 and any(
                capacity.bucket(gpu_type, free)
                for free in range(whole, capacity.max_gpus[gpu_type] + 1)
            )
            compared += 1
            whole_search = select_victims(
                capacity, ask, BINPACK, Exclusion(), index=index, budget=budget
            )
            assert whole_search == found
        # Evict a random victim for real: the pools and the indexes move on.
        if victims[gpu_type]:
            gone = victims[gpu_type].pop(rng.randrange(len(victims[gpu_type])))
            index.remove(gone)
            capacity.release(gone.uses)
    return compared, gpus_free


@pytest.mark.parametrize("seed", range(6))
def test_a_one_victim_pick_places_the_pod_as_the_general_way(seed: int) -> None:
    compared, _ = _compare(seed)
    assert compared >= 1


def test_the_one_victim_pick_is_made_often_and_where_cpu_keeps_gpus_free() -> None:
    results = [_compare(seed) for seed in range(6, 36)]
    assert sum(compared for compared, _ in results) > 120
    assert sum(free for _, free in results) >= 3


def _pruned(capacity: Capacity, ask: Ask, picked: Picked) -> list[Victim]:
    """The victims the search's pruning keeps: each put back in turn, last chosen first, and
    kept out only if the gang no longer fits without it (`victim_search._search`)."""
    journal = Journal()
    needed: list[Victim] = []
    for victim in reversed(picked.victims):
        capacity.take(victim.uses, journal)
        if place(capacity, ask, BINPACK, Exclusion()) is None:
            capacity.release(victim.uses, journal)
            needed.append(victim)
    capacity.restore(journal)
    needed.reverse()
    return needed


def _gangs(seed: int) -> tuple[int, int]:
    """Gang searches whose picks were each needed, and those whose picks were not all lone
    picks: the first checked against the pruning, which must keep every victim."""
    rng = random.Random(4000 + seed)
    capacity, running = full_pool(rng)
    victims = random_victims(capacity, running, rng, offered=0.8, classes=3, priced=True)
    each = other = 0
    for gpu_type in TYPES:
        index = VictimIndex(victims[gpu_type], capacity)
        for shape in ASKED_SHAPES:
            for pods in (2, 3, 4):
                ask = Ask(shape, gpu_type, pods, pods)
                budget = VictimBudget({"q": math.inf}, {}, below_priority_class=3)
                found, trial = _pick(capacity, ask, index, budget, binpack=True)
                if isinstance(found, Picked) and len(found.victims) > 1:
                    if found.each_needed:
                        assert _pruned(capacity, ask, found) == found.victims
                        each += 1
                    else:
                        other += 1
                capacity.restore(trial)
    return each, other


def test_lone_picks_that_free_exactly_the_gang_are_each_needed() -> None:
    results = [_gangs(seed) for seed in range(30)]
    assert sum(each for each, _ in results) > 30
    assert sum(other for _, other in results) > 5
