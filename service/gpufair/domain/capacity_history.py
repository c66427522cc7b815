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
only (the pool's capacity as its nodes' changes left it), and stay as they were: the usage
window's capacity, U''s denominator, adds what running work held on nodes that were not ready
when it reads the rows (`held_timeline`, `with_held`), by the same rule over time.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from itertools import pairwise
from typing import NamedTuple

from gpufair.domain.usage import Segment

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


def not_ready(config: NodeConfig | None) -> bool:
    """Whether a config history entry is of a node configured but not ready (drained, down):
    it counts in no pool's rows then (no pool), unlike a removal (negative declared GPUs)."""
    return config is not None and config.pool is None and config.gpu_count >= 0


def held_timeline(
    configs: Mapping[str, Sequence[tuple[float, NodeConfig]]],
    reports: Mapping[str, Sequence[tuple[float, int]]],
    runs: Mapping[str, Sequence[tuple[float, float, float]]],
    lo_s: float,
    hi_s: float,
) -> list[Segment]:
    """`division_capacity`'s rule over [lo_s, hi_s): the CU that running work held on nodes
    while they were not ready, as segments (one node's do not overlap; several nodes' may).

    `configs` and `reports` hold, per node, its config history entries and usable-GPU reports
    in time order from the one in force at `lo_s` on (as `capacity_steps` takes them); `runs`,
    per node, the (start, end, GPUs) of the runs of the pool that held GPUs there (a fraction
    of a shared GPU as that fraction; an open run ends at +inf). While a node is not ready
    (`not_ready`), it counts the GPUs its runs hold, at most the GPUs it counts for
    (`counted_gpus`), each worth its CU per GPU then; while it is ready it counts in the
    capacity rows and nothing here. A node with no config entry in force counts nothing: a
    drain is known from its entry (every config apply writes one for a node it changes).

    The GPUs held at an instant are the correctly rounded sum of its runs' (`math.fsum`), so the
    segments do not depend on the order runs were stored or listed in."""
    segments: list[Segment] = []
    for node in sorted(runs):
        entries = configs.get(node, ())
        if any(not_ready(config) for _at, config in entries):
            segments += _node_held(entries, reports.get(node, ()), runs[node], lo_s, hi_s)
    segments.sort(key=_start)
    return segments


def _start(segment: Segment) -> tuple[float, float, float]:
    return (segment.start_s, segment.end_s, segment.value)


def _node_held(
    entries: Sequence[tuple[float, NodeConfig]],
    reported: Sequence[tuple[float, int]],
    node_runs: Sequence[tuple[float, float, float]],
    lo_s: float,
    hi_s: float,
) -> list[Segment]:
    """One node's part of `held_timeline`: a sweep over its changes inside (lo_s, hi_s)."""
    config_at: dict[float, NodeConfig] = {}
    report_at: dict[float, int] = {}
    starts: dict[float, list[tuple[int, float]]] = defaultdict(list)
    ends: dict[float, list[int]] = defaultdict(list)
    config: NodeConfig | None = None
    report: int | None = None
    active: dict[int, float] = {}
    for at_s, entry in entries:
        if at_s <= lo_s:
            config = entry
        elif at_s < hi_s:
            config_at[at_s] = entry
    for at_s, usable in reported:
        if at_s <= lo_s:
            report = usable
        elif at_s < hi_s:
            report_at[at_s] = usable
    for run, (start_s, end_s, gpus) in enumerate(node_runs):
        if end_s <= max(start_s, lo_s) or start_s >= hi_s or not gpus > 0.0:
            continue
        if start_s <= lo_s:
            active[run] = gpus
        else:
            starts[start_s].append((run, gpus))
        if end_s < hi_s:
            ends[end_s].append(run)
    pieces: list[Segment] = []
    at_s = lo_s
    for next_s in [*sorted({*config_at, *report_at, *starts, *ends}), hi_s]:
        if next_s > at_s and active and config is not None and not_ready(config):
            held = min(float(counted_gpus(config, report)), math.fsum(active.values()))
            value = held * config.cu_per_gpu
            if held > 0.0 and 0.0 < value < math.inf:
                _append(pieces, Segment(at_s, next_s, value))
        config = config_at.get(next_s, config)
        report = report_at.get(next_s, report)
        for run, held_gpus in starts.get(next_s, ()):
            active[run] = held_gpus
        for run in ends.get(next_s, ()):
            del active[run]
        at_s = next_s
    return pieces


def _append(segments: list[Segment], segment: Segment) -> None:
    """Append, joined to the last segment when it ends where this starts with the same value."""
    if segments and segments[-1].end_s == segment.start_s and segments[-1].value == segment.value:
        segments[-1] = Segment(segments[-1].start_s, segment.end_s, segment.value)
    else:
        segments.append(segment)


def with_held(ready: Sequence[Segment], held: Sequence[Segment]) -> list[Segment]:
    """The usage window's capacity: the pool's rows as segments (`ready`, not overlapping, in
    time order) with what running work held on nodes that were not ready added (`held`, from
    `held_timeline`). Each stretch is the correctly rounded sum of the row's CU and the held
    nodes' CU (`math.fsum`), so no float dust is left where a drain's work ends; outside the
    held stretches the rows' segments come back as they were. With nothing held, `ready` itself,
    to the bit: a pool that had no node drained under work in the span reads what it read."""
    if not held:
        return list(ready)
    lo_s = min(h.start_s for h in held)
    hi_s = max(h.end_s for h in held)
    out: list[Segment] = []
    parts: list[Segment] = list(held)
    for s in ready:
        if s.end_s <= lo_s or s.start_s >= hi_s:
            out.append(s)
            continue
        if s.start_s < lo_s:
            out.append(Segment(s.start_s, lo_s, s.value))
        if s.end_s > hi_s:
            out.append(Segment(hi_s, s.end_s, s.value))
        parts.append(Segment(max(s.start_s, lo_s), min(s.end_s, hi_s), s.value))
    edges: dict[float, list[tuple[int, bool]]] = defaultdict(list)
    for i, part in enumerate(parts):
        edges[part.start_s].append((i, True))
        edges[part.end_s].append((i, False))
    cuts = sorted(edges)
    active: dict[int, float] = {}
    merged: list[Segment] = []
    for start_s, end_s in pairwise(cuts):
        for i, opens in edges[start_s]:
            if opens:
                active[i] = parts[i].value
            else:
                del active[i]
        if active:
            _append(merged, Segment(start_s, end_s, math.fsum(active.values())))
    joined: list[Segment] = []
    for segment in sorted([*out, *merged], key=_start):
        _append(joined, segment)
    return joined
