"""Hourly rollups of the ledger, and decayed usage rebuilt from them exactly (DESIGN §5).

A bucket [b, e) stores, for every queue, the *moment* of its usage under the pool's basis,

    M = ∫_b^e x(t) · 2^(-(e - t) / h) dt            (plain ∫ x dt without a half-life),

and the same for the capacity each sibling group competed for. At any later instant `now`,
that bucket's part of the decayed integral is M · 2^(-(now - e) / h): one multiplication, so a
recompute costs O(queues × buckets in the window), never O(events). Only the two edges of the
window that cut through a bucket (its start, and the hour still in progress) are integrated from
the raw intervals. Both parts use the closed forms of `usage`, so the sum equals the exact
integral over the raw intervals to float precision.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from gpufair.domain.model import FairSharePolicy, GpuType, Queue, WindowKind
from gpufair.domain.usage import Segment, Timeline, UsageInputs, keyed_step_pieces, usage_inputs

HOUR_S = 3600.0


def floor_hour(t_s: float) -> float:
    return math.floor(t_s / HOUR_S) * HOUR_S


def ceil_hour(t_s: float) -> float:
    return math.ceil(t_s / HOUR_S) * HOUR_S


def clip(timeline: Iterable[Segment], lo_s: float, hi_s: float) -> list[Segment]:
    """The parts of `timeline` inside [lo_s, hi_s)."""
    out = []
    for s in timeline:
        start, end = max(s.start_s, lo_s), min(s.end_s, hi_s)
        if start < end:
            out.append(Segment(start, end, s.value))
    return out


def range_usage(
    *,
    pool: str,
    policy: FairSharePolicy,
    queues: Sequence[Queue],
    gpu_types: Mapping[str, GpuType],
    leaf_allocations: Mapping[str, Timeline],
    capacity: Timeline,
    lo_s: float,
    hi_s: float,
    now_s: float,
) -> UsageInputs:
    """Decayed usage at `now_s` of what happened in [lo_s, hi_s) only (inside the window)."""
    return usage_inputs(
        pool=pool,
        policy=policy,
        queues=queues,
        gpu_types=gpu_types,
        leaf_allocations={q: clip(t, lo_s, hi_s) for q, t in leaf_allocations.items()},
        capacity=clip(capacity, lo_s, hi_s),
        now_s=now_s,
    )


def bucket_moments(
    *,
    pool: str,
    policy: FairSharePolicy,
    queues: Sequence[Queue],
    gpu_types: Mapping[str, GpuType],
    leaf_allocations: Mapping[str, Timeline],
    capacity: Timeline,
    bucket_start_s: float,
    bucket_s: float = HOUR_S,
) -> UsageInputs:
    """The moments of one bucket, taken at its end (module docstring)."""
    end_s = bucket_start_s + bucket_s
    unwindowed = replace(policy, window_kind=WindowKind.NONE)
    return range_usage(
        pool=pool,
        policy=unwindowed,
        queues=queues,
        gpu_types=gpu_types,
        leaf_allocations=leaf_allocations,
        capacity=capacity,
        lo_s=bucket_start_s,
        hi_s=end_s,
        now_s=end_s,
    )


def add_usage(*parts: UsageInputs) -> UsageInputs:
    usage: dict[str, float] = defaultdict(float)
    capacity: dict[str | None, float] = defaultdict(float)
    for part in parts:
        for q, v in part.usage_cu_s.items():
            usage[q] += v
        for g, v in part.group_capacity_cu_s.items():
            capacity[g] += v
    return UsageInputs(usage_cu_s=dict(usage), group_capacity_cu_s=dict(capacity))


@dataclass(frozen=True, slots=True)
class TypedInterval:
    """A leaf queue's allocation on one GPU type over [start_s, end_s)."""

    queue: str
    gpu_type: str
    gpus: float
    cu: float
    start_s: float
    end_s: float


@dataclass(frozen=True, slots=True)
class TypeUsage:
    """One row of the reporting rollup: a leaf queue on one GPU type over one bucket."""

    queue: str
    gpu_type: str
    gpu_seconds: float
    cu_seconds: float
    over_quota_cu_seconds: float


def type_usage(
    intervals: Iterable[TypedInterval], deserved_cu: Mapping[str, float], lo_s: float, hi_s: float
) -> list[TypeUsage]:
    """GPU-, CU- and over-quota CU-seconds per leaf queue and GPU type inside [lo_s, hi_s).

    The over-quota part of a queue's allocation, max(0, alloc(t) - deserved), is split between its
    GPU types in proportion to their CU at each instant: no type is singled out as "the" one above
    quota, and the parts add up to the queue's over-quota usage.
    """
    by_queue: dict[str, list[TypedInterval]] = defaultdict(list)
    for iv in intervals:
        start, end = max(iv.start_s, lo_s), min(iv.end_s, hi_s)
        if start < end:
            by_queue[iv.queue].append(
                TypedInterval(iv.queue, iv.gpu_type, iv.gpus, iv.cu, start, end)
            )
    rows: list[TypeUsage] = []
    for queue, items in sorted(by_queue.items()):
        gpu_s: dict[str, float] = defaultdict(float)
        cu_s: dict[str, float] = defaultdict(float)
        over_s: dict[str, float] = defaultdict(float)
        for iv in items:
            gpu_s[iv.gpu_type] += iv.gpus * (iv.end_s - iv.start_s)
            cu_s[iv.gpu_type] += iv.cu * (iv.end_s - iv.start_s)
        deserved = deserved_cu.get(queue, 0.0)
        stretches = keyed_step_pieces((iv.start_s, iv.end_s, iv.gpu_type, iv.cu) for iv in items)
        for start, end, cu_by_type in stretches:
            total = math.fsum(cu_by_type.values())
            over = max(0.0, total - deserved)
            if over > 0 and total > 0:
                for gpu_type, cu in cu_by_type.items():
                    over_s[gpu_type] += over * cu / total * (end - start)
        rows += [TypeUsage(queue, t, gpu_s[t], cu_s[t], over_s.get(t, 0.0)) for t in sorted(gpu_s)]
    return rows
