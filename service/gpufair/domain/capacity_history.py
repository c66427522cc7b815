"""A pool's capacity from what its nodes count for: at one instant, or as steps over time.

A node counts in its pool (while ready) with the GPUs the batch system last reported usable,
never more than it declares, else its declared GPUs, each worth its type's CU. A pool's capacity
is a sum over its nodes; it is taken here as whole GPUs per (GPU type, CU per GPU), which are
integers and add up exactly, and CU as the correctly rounded sum of one product per group
(`math.fsum`). So the same nodes give the same capacity to the last bit whatever order they are
read or changed in: a capacity counted now and one replayed from history (`capacity_steps`)
compare equal, and a late report rebuilds the same rows as the reports in order.

What the fair share divides now (`division_capacity`) also counts, on a node that is not ready,
the GPUs its running work still holds; the rows over time (`capacity_steps`) count ready nodes
only (the pool's capacity as its nodes' changes left it).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import NamedTuple

NODE_CAPACITY = "node_capacity"  # the source of a capacity step a report made
CONFIG = "config"  # the source of a capacity step a config apply made

Capacity = tuple[float, dict[str, float]]  # (CU, GPUs by type)


class NodeConfig(NamedTuple):
    """What a node counts for, as configured: `pool` None while it counts nowhere (not ready,
    not configured)."""

    pool: str | None
    gpu_type: str
    gpu_count: int
    cu_per_gpu: float


def counted_gpus(config: NodeConfig, reported: int | None) -> int:
    return config.gpu_count if reported is None else min(config.gpu_count, reported)


class _Groups:
    """One pool's counted nodes and GPUs per (GPU type, CU per GPU), kept as nodes change."""

    __slots__ = ("groups",)

    def __init__(self) -> None:
        self.groups: dict[tuple[str, float], list[int]] = defaultdict(lambda: [0, 0])

    def add(self, config: NodeConfig, gpus: int, sign: int) -> None:
        group = self.groups[(config.gpu_type, config.cu_per_gpu)]
        group[0] += sign
        group[1] += sign * gpus

    def totals(self) -> Capacity:
        return totals({key: (nodes, gpus) for key, (nodes, gpus) in self.groups.items()})


def totals(groups: Mapping[tuple[str, float], tuple[int, int]]) -> Capacity:
    """A pool's capacity from its (nodes, counted GPUs) per (GPU type, CU per GPU); a type is
    named while a node of it counts, even with no GPU."""
    cu = math.fsum(gpus * w for (_t, w), (nodes, gpus) in groups.items() if nodes)
    by_type: dict[str, int] = {}
    for (gpu_type, _w), (nodes, gpus) in sorted(groups.items()):
        if nodes:
            by_type[gpu_type] = by_type.get(gpu_type, 0) + gpus
    return cu, {t: float(g) for t, g in by_type.items()}


class HeldNode(NamedTuple):
    """A node of the pool that is not ready (drained, down) while work still runs on it: its
    GPU type and CU per GPU, the GPUs it counts for (`counted_gpus`), and the GPUs its running
    work holds there (fractions of shared GPUs as their fractions, `capacity.binding_gpus`)."""

    gpu_type: str
    cu_per_gpu: float
    counted_gpus: int
    held_gpus: float


def division_capacity(
    groups: Mapping[tuple[str, float], tuple[int, int]], held: Sequence[HeldNode]
) -> Capacity:
    """What the fair share divides in a pool now: the capacity of its ready nodes (`groups`,
    as `totals` reads them), plus, on each node that is not ready, the GPUs its running work
    still holds (at most the GPUs the node counts for).

    A drain takes a node out of placement at once, but the work running there keeps its GPUs
    and stays in its queue's allocation (and demand) until it ends. Dividing only the ready
    nodes while that work still counts made the shares add up to less than what is held: the
    queues that compete over quota lost the drained node's GPUs at once, whoever held them, so
    a queue at its share became one above it, and its work elsewhere was reclaimed for nothing
    (nothing was freed: the drained GPUs stayed busy). Counted so, a drain changes no share
    until the work on the node ends, and each end gives its GPUs back to no one. Free GPUs of a
    node that is not ready never count: nothing new is placed there.

    With no such node (`held` empty, or holding nothing) this is `totals(groups)`, to the bit."""
    kept = [(h, min(float(h.counted_gpus), h.held_gpus)) for h in held]
    kept = [(h, gpus) for h, gpus in kept if gpus > 0.0]
    if not kept:
        return totals(groups)
    products = [gpus * w for (_t, w), (nodes, gpus) in groups.items() if nodes]
    products += [gpus * h.cu_per_gpu for h, gpus in kept]
    parts: dict[str, list[float]] = defaultdict(list)
    for (gpu_type, _w), (nodes, whole) in sorted(groups.items()):
        if nodes:
            parts[gpu_type].append(float(whole))
    for h, held_gpus in kept:
        parts[h.gpu_type].append(held_gpus)
    return math.fsum(products), {t: math.fsum(parts[t]) for t in sorted(parts)}


class Step(NamedTuple):
    at_s: float
    cu: float
    by_type: dict[str, float]
    source: str


def capacity_steps(
    pool: str,
    start_s: float,
    configs: Mapping[str, Sequence[tuple[float, NodeConfig]]],
    reports: Mapping[str, Sequence[tuple[float, int]]],
    before: Capacity | None,
    known_sources: Mapping[float, str],
) -> list[Step]:
    """The capacity rows of `pool` from `start_s` on: a step at every instant the capacity
    differs from the one before (`before`: the row in force just before `start_s`, if any).

    `configs` and `reports` hold, per node, its entries in time order from the one in force at
    `start_s` (at or before it) on; a node with no config entry at or before an instant counts
    nowhere then. `known_sources` are the stored rows' instants from `start_s` on, with their
    sources: each is looked at again, and keeps its source when no node changed then. A step's
    source is config when a node's config changed at its instant, else node_capacity."""
    changes: dict[float, list[tuple[str, NodeConfig | None, int | None, bool]]] = defaultdict(list)
    config_now: dict[str, NodeConfig | None] = {}
    report_now: dict[str, int | None] = {}
    sources: dict[float, str] = dict(known_sources)
    for node, entries in configs.items():
        config_now[node] = None
        for at_s, config in entries:
            if at_s <= start_s:
                config_now[node] = config
            else:
                changes[at_s].append((node, config, None, True))
            if at_s >= start_s:
                sources[at_s] = CONFIG
    for node, reported in reports.items():
        report_now.setdefault(node, None)
        for at_s, gpus in reported:
            if at_s <= start_s:
                report_now[node] = gpus
            else:
                changes[at_s].append((node, None, gpus, False))
            if at_s >= start_s and sources.get(at_s) != CONFIG:
                sources[at_s] = NODE_CAPACITY
    groups = _Groups()

    def count(node: str, sign: int) -> None:
        config = config_now.get(node)
        if config is not None and config.pool == pool:
            groups.add(config, counted_gpus(config, report_now.get(node)), sign)

    for node in config_now:
        count(node, 1)
    steps: list[Step] = []
    last = before
    for at_s in sorted({start_s, *changes, *sources}):
        if at_s < start_s:
            continue
        for node, new_config, new_gpus, is_config in changes.get(at_s, ()):
            count(node, -1)
            if is_config:
                config_now[node] = new_config
            else:
                report_now[node] = new_gpus
            count(node, 1)
        now = groups.totals()
        if now != last:
            steps.append(Step(at_s, now[0], now[1], sources.get(at_s, NODE_CAPACITY)))
            last = now
    return steps
