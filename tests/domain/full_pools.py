"""Random full pools for the placement tests: mixed nodes of two GPU types filled with random
running pods until one more GPU pod fits nowhere, and the pod shapes asked of them."""

from __future__ import annotations

import random

from gpufair.domain.capacity import Capacity, PodUse
from gpufair.domain.model import Node, PlacementStrategy
from gpufair.domain.placement import place
from gpufair.domain.placement_ask import Ask, Exclusion, PodShape
from gpufair.domain.victim_search import Victim

BINPACK = PlacementStrategy.BINPACK
TYPES = ("big", "small")
RUNNING_SHAPES = [PodShape(1.0, 4_000, 8_000)] * 4 + [
    PodShape(2.0, 8_000, 16_000),
    PodShape(4.0, 16_000, 32_000),
    PodShape(0.5, 2_000, 4_000),
    PodShape(0.25, 1_000, 2_000),
    PodShape(1.0, 30_000, 8_000),  # CPU-heavy: leaves GPUs free that no pod can use
]
ASKED_SHAPES = [
    PodShape(1.0, 4_000, 8_000),
    PodShape(2.0, 8_000, 16_000),
    PodShape(4.0, 16_000, 32_000),
    PodShape(1.0, 4_000, 8_000, one_per_node=True),
    PodShape(0.5, 2_000, 4_000),
]


def full_pool(rng: random.Random) -> tuple[Capacity, list[tuple[PodUse, ...]]]:
    """A pool of mixed nodes filled with random pods until one more GPU pod fits nowhere."""
    nodes = [
        Node(
            f"n{i:02d}",
            "p",
            TYPES[i % 2],
            rng.choice((4, 8)),
            cpu_millicores=rng.choice((64_000, 128_000)),
            memory_mib=256_000,
        )
        for i in range(rng.randint(4, 14))
    ]
    capacity = Capacity(nodes)
    groups: list[tuple[PodUse, ...]] = []
    for _ in range(400):
        shape = rng.choice(RUNNING_SHAPES)
        pods = rng.choice((1, 1, 1, 2, 3))
        plan = place(capacity, Ask(shape, rng.choice(TYPES), pods, pods), BINPACK, Exclusion())
        if plan is not None:
            capacity.take(plan)
            groups.append(tuple(plan))
    for gpu_type in TYPES:
        while (
            plan := place(capacity, Ask(RUNNING_SHAPES[0], gpu_type, 1, 1), BINPACK, Exclusion())
        ) is not None:
            capacity.take(plan)
            groups.append(tuple(plan))
    return capacity, groups


def capacity_state(capacity: Capacity) -> list[tuple[object, ...]]:
    return [
        (s.gpu_used.copy(), s.cpu_free, s.memory_free, s.free_whole, s.partial_gpus, s.version)
        for s in capacity.nodes
    ] + [
        [list(capacity.bucket(t, k)) for t in TYPES for k in range(capacity.max_gpus[t] + 1)],
        capacity.version,
    ]


def random_victims(
    capacity: Capacity,
    running: list[tuple[PodUse, ...]],
    rng: random.Random,
    *,
    offered: float,
    classes: int,
    priced: bool,
) -> dict[str, list[Victim]]:
    """Running groups as victims of one queue "q", by GPU type: each offered with chance
    `offered` (the rest not preemptible), of a random priority class below `classes`, started at
    a random time; its CU is its GPUs, 2.5 times that at random when `priced`."""
    by_type: dict[str, list[Victim]] = {gpu_type: [] for gpu_type in TYPES}
    for number, uses in enumerate(running):
        if rng.random() >= offered:
            continue
        gpu_type = capacity.nodes[uses[0].node].gpu_type
        gpus = sum(use.gpu_amount * len(use.gpu_indices) for use in uses)
        by_type[gpu_type].append(
            Victim(
                f"v{number}",
                "q",
                0,
                rng.randrange(classes),
                float(rng.randint(0, 1_000)),
                gpus * rng.choice((1.0, 2.5)) if priced else gpus,
                gpus,
                gpu_type,
                uses,
                tuple(dict.fromkeys(use.node for use in uses)),
            )
        )
    return by_type
