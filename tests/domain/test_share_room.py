"""The preemption's room test for pods that share a GPU (`cycle_preempt.share_room_short`): when
it says the victims could not make room, the victim search finds nothing. Random full pools with
no GPU room left, some GPUs held a second time over the pod still running there (as a claim's
hold is), random victims of random classes."""

from __future__ import annotations

import math
import random

from gpufair.domain.capacity import Capacity, PodUse
from gpufair.domain.cycle_preempt import share_room_short
from gpufair.domain.placement import place
from gpufair.domain.placement_ask import Ask, Exclusion, PodShape
from gpufair.domain.victim_search import Victim, VictimBudget, VictimIndex, select_victims
from tests.domain.full_pools import BINPACK, TYPES, full_pool, random_victims

SHARES = (0.5, 0.25)


def _fill_up(capacity: Capacity, running: list[tuple[PodUse, ...]]) -> None:
    """Fill every GPU to the brim: whole GPUs, then quarter shares (running pods' shares are
    halves and quarters, so part-used GPUs fill exactly)."""
    for shape in (PodShape(1.0, 0, 0), PodShape(0.25, 0, 0)):
        for gpu_type in TYPES:
            while (
                plan := place(capacity, Ask(shape, gpu_type, 1, 1), BINPACK, Exclusion())
            ) is not None:
                capacity.take(plan)
                running.append(tuple(plan))


def _compare(seed: int) -> tuple[int, int]:
    """Asks whose room test said "short" (each checked to find nothing), and asks whose search
    found victims."""
    rng = random.Random(3000 + seed)
    capacity, running = full_pool(rng)
    _fill_up(capacity, running)
    # Held GPUs: a pod taken again over a running one (the claim's hold until it stops).
    for uses in rng.sample(running, len(running) // 3):
        capacity.take(uses)
    victims = random_victims(capacity, running, rng, offered=0.7, classes=4, priced=False)
    short = found = 0
    for gpu_type in TYPES:
        assert capacity.free_whole_by_type[gpu_type] == 0
        assert not capacity.partial_nodes(gpu_type)
        for below in range(1, 5):
            eligible = [victim for victim in victims[gpu_type] if victim.priority_class < below]
            index = VictimIndex(eligible, capacity)
            for share in SHARES:
                for needed in (1, 2, 5):
                    bounded = share_room_short(
                        capacity, gpu_type, share, needed, below, victims[gpu_type]
                    )
                    selection = select_victims(
                        capacity,
                        Ask(PodShape(share, 0, 0), gpu_type, needed, needed),
                        BINPACK,
                        Exclusion(),
                        index=index,
                        budget=VictimBudget({"q": math.inf}, {}, below_priority_class=below),
                    )
                    if bounded:
                        assert selection is None
                        short += 1
                    found += selection is not None
    return short, found


def test_a_share_room_said_short_is_never_found_by_the_search() -> None:
    results = [_compare(seed) for seed in range(25)]
    assert sum(short for short, _ in results) > 30
    assert sum(found for _, found in results) > 30


def test_evicted_victims_free_nothing() -> None:
    capacity, running = full_pool(random.Random(1))
    _fill_up(capacity, running)
    gpu_type = TYPES[0]
    on_type = [uses for uses in running if capacity.nodes[uses[0].node].gpu_type == gpu_type]
    uses = on_type[0]
    victim = Victim("v", "q", 0, 0, 0.0, 1.0, 1.0, gpu_type, uses, (uses[0].node,))
    assert not share_room_short(capacity, gpu_type, 0.5, 1, 1, [victim])
    assert share_room_short(capacity, gpu_type, 0.5, 1, 1, [victim], evicted={"v"})
    assert share_room_short(capacity, gpu_type, 0.5, 1, 0, [victim])  # not of a lower class
