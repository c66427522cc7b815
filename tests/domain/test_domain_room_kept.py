"""A topology domain's room kept from one search to the next (`placement_domain._DomainRoom`):
after any takes, releases, trials restored and states copied in, it equals a count of the nodes
read one by one, and the domain search chooses the same nodes either way. A node's free GPUs read
from its counts (`placement_domain._free_gpus`) are its `free_gpus()`."""

from __future__ import annotations

import random

import pytest

from gpufair.domain.capacity import Capacity, Journal, PodUse
from gpufair.domain.model import Node, PlacementStrategy
from gpufair.domain.placement_ask import Ask, Exclusion, PodShape
from gpufair.domain.placement_domain import _choose_domain, _domain_room, _DomainRoom, _free_gpus

SHAPES = (
    PodShape(2.0, 8_000, 64_000),
    PodShape(1.0, 4_000, 32_000),
    PodShape(4.0, 16_000, 200_000),
    PodShape(2.0, 8_000, 64_000, one_per_node=True),
)
# Blocks no node, but makes the search read the nodes one by one.
_NODE_BY_NODE = Exclusion(held={-1: "nobody"})


def _pool(rng: random.Random) -> list[Node]:
    nodes = []
    for i in range(30):
        labels = {} if i % 7 == 6 else {"rack": f"r{i // 4}"}
        cpu = rng.choice((16_000, 32_000, 64_000))
        memory = rng.choice((128_000, 256_000, 512_000))
        nodes.append(Node(f"n{i}", "p", "a100", rng.choice((4, 8)), cpu, memory, labels))
    return nodes


def _take_some(capacity: Capacity, rng: random.Random, journal: Journal | None) -> PodUse | None:
    state = capacity.nodes[rng.randrange(len(capacity.nodes))]
    free = [gpu for gpu, used in enumerate(state.gpu_used) if used == 0.0]
    if not free or state.cpu_free < 2_000 or state.memory_free < 16_000:
        return None
    cpu, memory = rng.choice((0, 2_000)), rng.choice((0, 16_000))
    if rng.random() < 0.2:
        # A share of one GPU: the node has a part-used GPU until it goes.
        use = PodUse(state.index, (rng.choice(free),), rng.choice((0.1, 0.25, 0.3)), cpu, memory)
    else:
        gpus = tuple(rng.sample(free, rng.randint(1, len(free))))
        use = PodUse(state.index, gpus, 1.0, cpu, memory)
    capacity.take((use,), journal)
    return use


def _check(capacity: Capacity) -> None:
    for state in capacity.nodes:
        assert _free_gpus(state) == state.free_gpus()
    for shape in SHAPES:
        kept = _DomainRoom.of(capacity, "a100", "rack", shape).counted(capacity)
        ask = Ask(shape, "a100", 1, 1)
        room, members = _domain_room(
            capacity, ask, "rack", PlacementStrategy.BINPACK, _NODE_BY_NODE, shape.whole_gpus
        )
        assert kept[0] == room
        assert {value: sorted(found) for value, found in kept[1].items()} == {
            value: sorted(found) for value, found in members.items()
        }
        for pods in (1, 2, 3, 5, 8):
            for strategy in PlacementStrategy:
                ask = Ask(shape, "a100", pods, pods)
                assert _choose_domain(capacity, ask, "rack", strategy, Exclusion()) == (
                    _choose_domain(capacity, ask, "rack", strategy, _NODE_BY_NODE)
                )


@pytest.mark.parametrize("seed", range(12))
def test_kept_room_equals_a_count_node_by_node(seed: int) -> None:
    rng = random.Random(seed)
    nodes = _pool(rng)
    capacity = Capacity(nodes)
    other = Capacity(nodes)
    taken: list[PodUse] = []
    for _ in range(120):
        step = rng.random()
        if step < 0.45:
            use = _take_some(capacity, rng, None)
            if use is not None:
                taken.append(use)
        elif step < 0.7 and taken:
            capacity.release((taken.pop(rng.randrange(len(taken))),))
        elif step < 0.95:
            # A trial: releases and takes checked inside it, then undone.
            journal = Journal()
            for _ in range(rng.randint(1, 4)):
                if taken and rng.random() < 0.5:
                    capacity.release((rng.choice(taken),), journal)
                else:
                    _take_some(capacity, rng, journal)
                _check(capacity)
            capacity.restore(journal)
        else:
            # Another capacity's state copied in: the same versions may name other states.
            use = _take_some(other, rng, None)
            capacity.copy_state_from(other)
            taken = [] if use is None else [use]
        _check(capacity)


def test_a_state_copied_in_is_read_again_where_its_versions_name_other_states() -> None:
    nodes = [
        Node("a1", "p", "a100", 8, 64_000, 512_000, {"rack": "r1"}),
        Node("b1", "p", "a100", 8, 64_000, 512_000, {"rack": "r2"}),
    ]
    capacity, other = Capacity(nodes), Capacity(nodes)
    # Node a1 at version 1 in both, with 2 GPUs taken here and 6 there.
    capacity.take((PodUse(0, (0, 1), 1.0, 0, 0),))
    other.take((PodUse(0, (0, 1, 2, 3, 4, 5), 1.0, 0, 0),))
    assert capacity.nodes[0].version == other.nodes[0].version
    _check(capacity)
    capacity.copy_state_from(other)
    _check(capacity)
