"""One sibling group's division, phases 1 and 2 (`fairshare` module docstring), on columns.

`divide_group` reads the group's static numbers from its `GroupPlan` and its members' allowed
demand and usage share from the call's `ShareColumns`, divides in lists local to the group
(positions 0..n-1 in the group's name order) and writes guaranteed, over-quota and fair shares,
and the weights of the queues that competed, back into the columns.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from operator import ge, sub

from gpufair.domain.fairshare_plan import GroupPlan
from gpufair.domain.fairshare_result import ShareColumns
from gpufair.domain.kai_division import kai_over_quota
from gpufair.domain.model import Division, FairSharePolicy
from gpufair.domain.rounding import round_over_quota, round_scaled_guarantees
from gpufair.domain.waterfill import water_fill, water_fill_into
from gpufair.domain.weights import stage_weights


def divide_group(
    capacity_cu: float,
    group: GroupPlan,
    columns: ShareColumns,
    policy: FairSharePolicy,
    previous: Mapping[str, float],
    unit_cu: float | None,
) -> None:
    """Phases 1 and 2 for one sibling group; writes guaranteed, over-quota and fair shares."""
    start, end = group.start, group.end
    allowed = columns.allowed_cu[start:end]
    bases = list(map(min, group.deserved_cu, allowed))
    total_base = math.fsum(bases)
    if total_base <= capacity_cu:
        guaranteed = bases
        remaining = capacity_cu - total_base
    else:
        guaranteed = water_fill(capacity_cu, group.deserved_cu, bases).shares
        remaining = 0.0
        if unit_cu is not None:
            guaranteed = round_scaled_guarantees(
                guaranteed,
                base_cu=bases,
                unit_cu=unit_cu,
                created_at_s=group.created_at_s,
                names=group.names,
            )
    satisfied = list(map(ge, guaranteed, allowed))
    over_quota = [0.0] * (end - start)

    if policy.division == Division.KAI:
        _divide_kai(
            remaining, group, columns, policy, unit_cu, allowed, guaranteed, satisfied, over_quota
        )
    else:
        _divide_gpufair(
            remaining,
            group,
            columns,
            policy,
            previous,
            unit_cu,
            allowed,
            guaranteed,
            satisfied,
            over_quota,
        )
    columns.guaranteed_cu[start:end] = guaranteed
    columns.over_quota_cu[start:end] = over_quota
    columns.satisfied[start:end] = satisfied
    # A satisfied queue holds its allowed demand exactly, not guaranteed + need in floats.
    columns.fair_share_cu[start:end] = [
        most if done else got + more
        for most, done, got, more in zip(allowed, satisfied, guaranteed, over_quota, strict=True)
    ]


def _divide_kai(
    remaining: float,
    group: GroupPlan,
    columns: ShareColumns,
    policy: FairSharePolicy,
    unit_cu: float | None,
    allowed: list[float],
    guaranteed: list[float],
    satisfied: list[bool],
    over_quota: list[float],
) -> None:
    """Phase 2 by KAI-Scheduler's rules (`kai_division`): weights per round, rounding inside."""
    division = kai_over_quota(
        remaining,
        needs=[
            0.0 if done else most - got
            for done, most, got in zip(satisfied, allowed, guaranteed, strict=True)
        ],
        weights=group.over_quota_weights,
        usage_shares=columns.usage_share[group.start : group.end],
        tiers=group.priority_tiers,
        created_at_s=group.created_at_s,
        names=group.names,
        k=policy.k,
        unit_cu=unit_cu,
    )
    # A queue satisfied by its guarantee needs 0: KAI gives it nothing and it never competes,
    # and a queue that never competed has no weights; the group's columns are written whole.
    over_quota[:] = division.shares
    satisfied[:] = [
        done or got + more >= most
        for done, got, more, most in zip(
            satisfied, guaranteed, division.shares, allowed, strict=True
        )
    ]
    start, end = group.start, group.end
    columns.competes[start:end] = division.competed
    columns.weight_share[start:end] = division.weight_shares
    columns.priority_weight[start:end] = division.priority_weights
    columns.effective_weight[start:end] = division.effective_weights


def _divide_gpufair(
    remaining: float,
    group: GroupPlan,
    columns: ShareColumns,
    policy: FairSharePolicy,
    previous: Mapping[str, float],
    unit_cu: float | None,
    allowed: list[float],
    guaranteed: list[float],
    satisfied: list[bool],
    over_quota: list[float],
) -> None:
    """Phase 2 by gpufair's rules (`fairshare` module docstring), then whole-GPU rounding."""
    # Weighted queues of every tier first, then best effort (weight 0) of every tier
    # (`GroupPlan.tiers`); a tier's queues satisfied by their guarantee do not compete.
    needs = list(map(sub, allowed, guaranteed))
    for tier in group.tiers:
        competing = [j for j in tier if not satisfied[j]]
        if not competing:
            continue
        if remaining <= 0.0:
            break
        remaining = _divide_tier(
            remaining,
            competing,
            group,
            columns,
            policy,
            previous,
            needs,
            satisfied,
            over_quota,
        )

    if unit_cu is not None:
        over_quota[:] = round_over_quota(
            over_quota,
            over_quota_need_cu=needs,
            satisfied=satisfied,
            unit_cu=unit_cu,
            created_at_s=group.created_at_s,
            names=group.names,
        )


def _divide_tier(
    amount_cu: float,
    competing: list[int],
    group: GroupPlan,
    columns: ShareColumns,
    policy: FairSharePolicy,
    previous: Mapping[str, float],
    needs: list[float],
    satisfied: list[bool],
    over_quota: list[float],
) -> float:
    """Water-fill one priority tier in stages (`fairshare` module docstring); returns what is
    left. `competing` are positions in the group, `needs` each position's allowed demand less
    its guarantee."""
    start, names, weights = group.start, group.names, group.over_quota_weights
    usage_share = columns.usage_share[start : group.end]
    first_stage = True
    while competing and amount_cu > 0.0:
        weight_shares, priority_weights, effective = stage_weights(
            list(map(weights.__getitem__, competing)),
            list(map(usage_share.__getitem__, competing)),
            policy.k,
            list(map(previous.get, map(names.__getitem__, competing))) if first_stage else None,
            policy.dead_band,
        )
        if first_stage:
            for j, w, p, e in zip(
                competing, weight_shares, priority_weights, effective, strict=True
            ):
                i = start + j
                columns.competes[i] = True
                columns.weight_share[i] = w
                columns.priority_weight[i] = p
                columns.effective_weight[i] = e
        amount_cu = water_fill_into(amount_cu, competing, effective, needs, over_quota, satisfied)
        competing = [j for j, w in zip(competing, effective, strict=True) if w <= 0.0]
        first_stage = False
    return amount_cu
