"""The `whole_gpus` rounding mode (DESIGN §3.4)."""

from __future__ import annotations

import math
from collections.abc import Sequence

from gpufair.domain.model import GpuType

# A share within this fraction of a unit below a whole number is that whole number: float noise
# from the division must not cost a queue a GPU.
_UNIT_SLACK = 1e-9


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
    queue, then the name (the reference behaviour of the best-known open implementation). A
    queue never receives more than its need, so a unit may be split when a need ends mid-unit.
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
    remainders.sort()
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
