"""The `whole_gpus` rounding mode (DESIGN §3.4)."""

from __future__ import annotations

import math
from collections.abc import Sequence

from gpufair.domain.model import GpuType

# A share within this fraction of a unit below a whole number is that whole number: float noise
# from the division must not cost a queue a GPU.
_UNIT_SLACK = 1e-9
# Remainders closer than this fraction of a unit are equal (DESIGN §3.4): the tie rule, not
# float noise, decides between them.
_TIE_SLACK = 1e-9


def whole_gpu_unit_cu(
    gpu_types: Sequence[GpuType], capacity_gpus_by_type: dict[str, float]
) -> float | None:
    """The CU of one "whole GPU" in a pool, or None when the pool has no GPUs.

    A single-type pool: one GPU of that type. A mixed pool: one GPU of its smallest type, the
    finest step every type's shares can be measured in; larger cards are then whole multiples of
    it only when their weights are, which is why mixed pools are better run continuous.
    """
    weights = [t.compute_weight for t in gpu_types if capacity_gpus_by_type.get(t.name, 0.0) > 0]
    return min(weights) if weights else None


def round_over_quota(
    over_quota_cu: Sequence[float],
    *,
    over_quota_need_cu: Sequence[float],
    satisfied: Sequence[bool],
    unit_cu: float,
    created_at_s: Sequence[float],
    names: Sequence[str],
) -> list[float]:
    """One sibling group's over-quota shares, rounded to whole units; the total is kept.

    Deserved (phase-1) amounts are never rounded — a guarantee stays exactly as configured — and
    neither is a satisfied queue, which keeps exactly its allowed demand (fractional GPUs
    included). Every other queue's over-quota share is floored to whole units, and the CU the
    floors freed go back one unit at a time: largest fractional remainder first, then the older
    queue, then the name (the reference behaviour of the best-known open implementation).
    Remainders equal up to float noise are equal: 12.8 − 12 and 3.2 − 3 computed in floats differ
    in the last bits, and the tie rule must decide, not those bits. A queue never receives more
    than its need, so a unit may be split when a need ends mid-unit.
    """
    rounded = list(over_quota_cu)
    remainders: list[tuple[float, float, str, int]] = []
    freed = 0.0
    for i, share in enumerate(over_quota_cu):
        if satisfied[i] or share <= 0.0:
            continue
        floored = min(unit_cu * math.floor(share / unit_cu + _UNIT_SLACK), over_quota_need_cu[i])
        rounded[i] = floored
        remainder = max(0.0, share - floored)
        freed += share - floored
        remainders.append((-remainder, created_at_s[i], names[i], i))
    remainders = _tied_within_noise(remainders, unit_cu)
    # The freed CU are a whole number of units up to float noise; hand out whole units then,
    # not 0.9999999 of one.
    whole_units = round(freed / unit_cu)
    if abs(freed - whole_units * unit_cu) <= unit_cu * _UNIT_SLACK * max(1, len(remainders)):
        freed = whole_units * unit_cu
    for _, _, _, i in remainders:
        if freed <= unit_cu * _UNIT_SLACK:
            break
        grant = min(unit_cu, over_quota_need_cu[i] - rounded[i], freed)
        if grant > 0.0:
            rounded[i] += grant
            freed -= grant
    return rounded


def _tied_within_noise(
    remainders: list[tuple[float, float, str, int]], unit_cu: float
) -> list[tuple[float, float, str, int]]:
    """`remainders` (negated remainder, age, name, index) in hand-out order, remainders within
    `_TIE_SLACK` units of the largest of their run counted equal."""
    remainders.sort()
    ordered: list[tuple[float, float, str, int]] = []
    level: float | None = None
    for negated, created_at_s, name, i in remainders:
        if level is None or negated - level > unit_cu * _TIE_SLACK:
            level = negated
        ordered.append((level, created_at_s, name, i))
    ordered.sort()
    return ordered


def round_scaled_guarantees(
    guaranteed_cu: Sequence[float],
    *,
    base_cu: Sequence[float],
    unit_cu: float,
    created_at_s: Sequence[float],
    names: Sequence[str],
) -> list[float]:
    """Guarantees a group could not cover in full, shrunk by water-filling, in whole units.

    A guarantee granted in full stays exact (as configured, fractions included); a shrunk one is
    floored to whole units and the freed CU go back one unit at a time by the rule of
    `round_over_quota` (largest remainder, older queue, name), never above the queue's base
    min(deserved, allowed demand). The total is kept.
    """
    return round_over_quota(
        guaranteed_cu,
        over_quota_need_cu=base_cu,
        satisfied=[
            got >= base - unit_cu * _UNIT_SLACK
            for got, base in zip(guaranteed_cu, base_cu, strict=True)
        ],
        unit_cu=unit_cu,
        created_at_s=created_at_s,
        names=names,
    )
