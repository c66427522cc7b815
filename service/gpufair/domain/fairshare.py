"""The fair-share engine: one pool's capacity divided among its queue tree (DESIGN §3).

`compute_fair_shares(FairShareInput) -> FairShareResult` is pure: the caller brings the
snapshot (queues, demands, capacity) and the history (`usage.usage_inputs`), and gets back, for
every queue, an explain record `QueueShare` with all the numbers that produced its fair share.

Division, top-down, in compute units (CU); each sibling group divides what its parent received
(the top level divides the pool's capacity):

1. Deserved first: each queue gets min(deserved, demand, limit) — its `guaranteed_cu`. History
   never touches this phase. If the group's capacity cannot cover all of it (quotas promised
   beyond the capacity, nodes down), the guarantees shrink by water-filling on deserved quotas:
   every queue keeps the same fraction of its deserved quota, small demands in full; in
   `whole_gpus` mode the shrunk guarantees are then rounded to whole units like over-quota
   shares (`rounding.round_scaled_guarantees`).
2. Over-quota next, by priority tier, highest first; a lower tier gets only what the higher ones
   cannot use. Weight 0 is best effort (DESIGN §3.3): such queues get over-quota capacity only
   after every queue with a weight above 0, in every tier, is satisfied; among themselves they
   go by tier again. Inside a tier, exact water-filling (`waterfill.water_fill`) on effective weights
   (`weights.stage_weights`), each queue capped at its allowed demand.

   The queues "still competing" (DESIGN §3.3) are those of the tier with allowed demand above
   their guarantee; W' is normalised over them and U' over the group's capacity. Effective
   weights stay fixed while the water level rises, which is what makes one exact pass possible
   and keeps a queue's share monotone in its usage. A queue whose P is 0 gets nothing while any
   positive-weight queue of its tier still wants capacity; once they are all satisfied, what is
   left is divided again among the queues still wanting, with W', U' and P recomputed over them
   (a stage). So capacity is never idle while a queue wants more and may have it. The explain
   record shows the weights of a queue's first stage — the ones the dead band remembers.

Division profile. Everything above is the `gpufair` division. A pool with `division: kai`
keeps phase 1 (scaled guarantees included) and divides phase 2 by KAI-Scheduler's rules
(`kai_division`: weights recomputed every round, floors per round and a remainder pass, weight 0
without over-quota, no dead band); its quotas may set a limit below the deserved quota, which
then caps the guarantee. docs/kai-compatibility.md lists the differences with examples.

Demand and limits. Demand is allocated + pending, in GPUs per type, worth their types' CU; an
inner queue's demand is its children's sum. A queue's `allowed_demand_cu` is its demand after
every limit: per type min(demand, limit of the type, the pool's GPUs of the type), in CU, capped
by `limit_cu`; an inner queue's is also capped by the sum of its children's. The division never
gives a queue more than that, so fair shares add up to min(capacity, Σ allowed demand).

Per-type guarantees (DESIGN §3.5). Each queue's `guaranteed_gpus_by_type[t]` is
min(deserved GPUs of t, allowed demand of t) when it declares a deserved quota for t; an inner
queue that declares none for t passes its children's up. Top-down, when a group's claims exceed
what is available (the pool's GPUs of t at the top, the parent's guarantee below), they shrink
in proportion. Per-type deserved quotas raise the CU guarantee to their worth
(`policy.deserved_cu_with_types`); per-type limits cap allowed demand as above. What this
division does not decide, and the scheduling cycle must: which GPUs of which type a queue's
CU share is taken on, reclaim of a type from queues above their own guarantee for it, and
a parent's per-type limit across its children in mixed pools (the children's division is in
CU; the cycle keeps the parent under the per-type limit when it admits work).

`fair_share_gpus_by_type` is reported where it is well defined: in a single-type pool, and for a
queue whose allowed demand is all on one type; otherwise it is empty.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpufair.domain.errors import InvalidInputError, Violation
from gpufair.domain.fairshare_result import (
    NO_GPUS,
    FairShareResult,
    QueueShare,
    QueueState,
    ShareRecords,
)
from gpufair.domain.kai_division import kai_over_quota
from gpufair.domain.model import (
    Division,
    FairSharePolicy,
    GpuType,
    Queue,
    QueueQuota,
    Rounding,
    frozen_map,
)
from gpufair.domain.policy import (
    validate_gpu_types,
    validate_policy,
    validate_pool_quotas,
)
from gpufair.domain.rounding import (
    round_over_quota,
    round_scaled_guarantees,
    whole_gpu_unit_cu,
)
from gpufair.domain.tree import QueueTree
from gpufair.domain.usage import UsageInputs
from gpufair.domain.waterfill import water_fill
from gpufair.domain.weights import stage_weights

__all__ = [
    "FairShareInput",
    "FairShareResult",
    "QueueDemand",
    "QueueShare",
    "compute_fair_shares",
]


@dataclass(frozen=True, slots=True)
class QueueDemand:
    """A leaf queue's work in the pool, in GPUs per type (fractions allowed).

    Pending work that may run on several types is counted on the type placement would choose
    (DESIGN §4.2: the cheapest that serves it); the engine cannot guess it.
    """

    allocated_gpus_by_type: Mapping[str, float] = field(default_factory=frozen_map)
    pending_gpus_by_type: Mapping[str, float] = field(default_factory=frozen_map)


@dataclass(frozen=True, slots=True)
class FairShareInput:
    """One pool's snapshot and history, everything `compute_fair_shares` reads."""

    pool: str
    policy: FairSharePolicy
    gpu_types: Mapping[str, GpuType]  # by name; at least the types in the pool and in demands
    capacity_gpus_by_type: Mapping[str, float]  # GPUs of each type on the pool's ready nodes
    queues: Sequence[Queue]  # the whole tree; a queue without terms in the pool is best effort
    demands: Mapping[str, QueueDemand] = field(default_factory=frozen_map)  # leaves only
    usage: UsageInputs = field(default_factory=UsageInputs)  # empty: no history
    # The last computation's `FairShareResult.effective_weights`, for the dead band.
    previous_effective_weights: Mapping[str, float] = field(default_factory=frozen_map)


def compute_fair_shares(inp: FairShareInput) -> FairShareResult:
    """Divide one pool's capacity among its queues (module docstring).

    Raises `InvalidInputError` for an invalid policy, GPU type, quota, tree, demand or history.
    """
    _validate(inp)
    tree = QueueTree.build(inp.queues)
    _validate_demands(inp, tree)
    compute_weights = {name: t.compute_weight for name, t in inp.gpu_types.items()}
    capacity_by_type = {t: g for t, g in inp.capacity_gpus_by_type.items() if g > 0.0}
    capacity_cu = math.fsum(g * compute_weights[t] for t, g in capacity_by_type.items())
    children = tree.children
    states = _aggregate_demand(inp, tree, compute_weights, capacity_by_type)

    policy = inp.policy
    unit_cu = None
    if policy.rounding == Rounding.WHOLE_GPUS:
        unit_cu = whole_gpu_unit_cu(list(inp.gpu_types.values()), capacity_by_type)
    usage_cu_s = inp.usage.usage_cu_s
    for group in tree.inner_groups():
        members = [states[name] for name in children[group]]
        group_capacity_cu = capacity_cu if group is None else states[group].fair_share_cu
        denominator = inp.usage.group_capacity_cu_s.get(group, 0.0)
        if denominator > 0.0:  # `weights.usage_share`, inline: it runs for every queue
            for member in members:
                member.usage_share = usage_cu_s.get(member.name, 0.0) / denominator
        _divide_group(group_capacity_cu, members, policy, inp.previous_effective_weights, unit_cu)
    _grant_type_guarantees(tree, states, capacity_by_type)

    single_type = next(iter(capacity_by_type)) if len(capacity_by_type) == 1 else None
    return FairShareResult(
        pool=inp.pool,
        capacity_cu=capacity_cu,
        whole_gpu_unit_cu=unit_cu,
        shares=ShareRecords(
            states, tree.preorder, tree.children, inp.usage, compute_weights, single_type
        ),
    )


def _validate(inp: FairShareInput) -> None:
    violations = [
        Violation(f"policy.{v.field_path}", v.message) for v in validate_policy(inp.policy)
    ]
    types = list(inp.gpu_types.values())
    violations.extend(
        Violation(f"gpu_types{v.field_path}", v.message) for v in validate_gpu_types(types)
    )
    for key, gpu_type in inp.gpu_types.items():
        if key != gpu_type.name:
            violations.append(Violation(f'gpu_types["{key}"]', f"is named {gpu_type.name!r}"))
    for type_name, gpus in inp.capacity_gpus_by_type.items():
        path = f'capacity_gpus_by_type["{type_name}"]'
        if type_name not in inp.gpu_types:
            violations.append(Violation(path, f"unknown GPU type {type_name!r}"))
        elif not (math.isfinite(gpus) and gpus >= 0.0):
            violations.append(Violation(path, f"must be a finite number ≥ 0, got {gpus!r}"))
    violations.extend(
        Violation(f"queues{v.field_path}", v.message)
        for v in validate_pool_quotas(
            inp.queues,
            inp.pool,
            gpu_types=inp.gpu_types,
            limit_below_deserved=inp.policy.division == Division.KAI,
        )
    )
    history: tuple[tuple[str, Mapping[Any, float]], ...] = (
        ("usage.usage_cu_s", inp.usage.usage_cu_s),
        ("usage.group_capacity_cu_s", inp.usage.group_capacity_cu_s),
        ("previous_effective_weights", inp.previous_effective_weights),
    )
    for map_path, numbers in history:
        values = list(numbers.values())
        # C-speed passes for the common case; the loop below only words what is wrong.
        if not values or (all(map(math.isfinite, values)) and min(values) >= 0.0):
            continue
        for map_key, value in numbers.items():
            if not (math.isfinite(value) and value >= 0.0):
                violations.append(
                    Violation(
                        f'{map_path}["{map_key}"]', f"must be a finite number ≥ 0, got {value!r}"
                    )
                )
    if violations:
        raise InvalidInputError(violations)


def _validate_demands(inp: FairShareInput, tree: QueueTree) -> None:
    gpu_types = inp.gpu_types
    children = tree.children
    queues = tree.queues
    inf = math.inf
    for name, demand in inp.demands.items():
        if name in queues and name not in children:
            for by_type in (demand.allocated_gpus_by_type, demand.pending_gpus_by_type):
                for type_name, gpus in by_type.items():
                    if not (type_name in gpu_types and 0.0 <= gpus < inf):
                        break
                else:
                    continue
                break
            else:
                continue
        # Something is wrong with this demand: the full check finds and words it.
        _raise_demand_violations(inp, tree)


def _raise_demand_violations(inp: FairShareInput, tree: QueueTree) -> None:
    violations: list[Violation] = []
    for name, demand in inp.demands.items():
        if name not in tree.queues:
            violations.append(Violation(f'demands["{name}"]', f"unknown queue {name!r}"))
            continue
        if not tree.is_leaf(name):
            violations.append(
                Violation(f'demands["{name}"]', "demand is given for leaf queues only")
            )
        for field_name, by_type in (
            ("allocated_gpus_by_type", demand.allocated_gpus_by_type),
            ("pending_gpus_by_type", demand.pending_gpus_by_type),
        ):
            for type_name, gpus in by_type.items():
                if type_name in inp.gpu_types and math.isfinite(gpus) and gpus >= 0.0:
                    continue
                type_path = f'demands["{name}"].{field_name}["{type_name}"]'
                if type_name not in inp.gpu_types:
                    violations.append(Violation(type_path, f"unknown GPU type {type_name!r}"))
                else:
                    violations.append(
                        Violation(type_path, f"must be a finite number ≥ 0, got {gpus!r}")
                    )
    if violations:
        raise InvalidInputError(violations)


def _aggregate_demand(
    inp: FairShareInput,
    tree: QueueTree,
    compute_weights: dict[str, float],
    capacity_by_type: dict[str, float],
) -> dict[str, QueueState]:
    """Every queue's working record with its demand, allowed demand and per-type claims, made
    children before parents (the returned dict is in post-order).

    The hot loop of a large pool (one pass over every queue): written with local names and
    plain dict operations rather than helpers, since a call per queue and type is most of its
    cost. Sums run over children in name order, so they are deterministic.
    """
    demands = inp.demands
    children = tree.children
    queues = tree.queues
    pool = inp.pool
    inf = math.inf
    states: dict[str, QueueState] = {}
    for name in reversed(tree.preorder):
        kids = children.get(name)
        state = QueueState(queues[name], pool, kids is None, compute_weights)
        states[name] = state
        quota = state.quota
        claims: Mapping[str, float] = NO_GPUS
        if kids is None:
            demand = demands.get(name)
            if demand is None:
                may_hold: Mapping[str, float] = NO_GPUS
                state.allocated_by_type = state.demand_by_type = NO_GPUS
            else:
                # The leaf's demand (allocated + pending) is summed into what becomes its
                # allowed demand; its explain record sums it again (`ShareRecords`).
                allocated = demand.allocated_gpus_by_type
                state.allocated_by_type = allocated
                state.pending_by_type = demand.pending_gpus_by_type
                state.claims_by_type = NO_GPUS
                summed = dict(allocated)
                for type_name, gpus in demand.pending_gpus_by_type.items():
                    summed[type_name] = summed.get(type_name, 0.0) + gpus
                state.allowed_by_type = summed
                allowed_cu = 0.0
                dropped: list[str] | None = None
                type_limits = quota.limit_gpus_by_type
                for type_name, gpus in summed.items():
                    capacity = capacity_by_type.get(type_name, 0.0)
                    bound = gpus if gpus < capacity else capacity  # min(), without the call
                    if type_limits and type_name in type_limits:
                        bound = min(bound, type_limits[type_name])
                    if bound > 0.0:
                        if bound != gpus:
                            summed[type_name] = bound
                        allowed_cu += bound * compute_weights[type_name]
                    else:
                        dropped = [type_name] if dropped is None else [*dropped, type_name]
                if dropped is not None:
                    for type_name in dropped:
                        del summed[type_name]
                _finish(state, quota, summed, allowed_cu, inf)
                continue
            children_allowed_cu = inf
        else:
            # An inner queue's demand and allocation are its children's sums; only its explain
            # record shows them, so they are summed there (`ShareRecords`), not here.
            holds: dict[str, float] = {}
            claimed: dict[str, float] = {}
            children_allowed_cu = 0.0
            for child_name in kids:
                child = states[child_name]
                for type_name, gpus in child.allowed_by_type.items():
                    holds[type_name] = holds.get(type_name, 0.0) + gpus
                for type_name, gpus in child.claims_by_type.items():
                    claimed[type_name] = claimed.get(type_name, 0.0) + gpus
                children_allowed_cu += child.allowed_cu
            may_hold = holds
            claims = claimed
        allowed: dict[str, float] = {}
        allowed_cu = 0.0
        type_limits = quota.limit_gpus_by_type
        for type_name, gpus in may_hold.items():
            bound = capacity_by_type.get(type_name, 0.0)
            bound = min(bound, gpus)
            if type_limits and type_name in type_limits and type_limits[type_name] < bound:
                bound = type_limits[type_name]
            if bound > 0.0:
                allowed[type_name] = bound
                allowed_cu += bound * compute_weights[type_name]
        state.allowed_by_type = allowed
        state.claims_by_type = claims
        _finish(state, quota, allowed, allowed_cu, children_allowed_cu)
    return states


def _finish(
    state: QueueState,
    quota: QueueQuota,
    allowed: Mapping[str, float],
    allowed_cu: float,
    children_allowed_cu: float,
) -> None:
    """A queue's per-type claims and allowed demand in CU, from its allowed demand by type."""
    if quota.deserved_gpus_by_type:  # most queues declare none: they share one empty map
        own = dict(state.claims_by_type)
        for type_name, deserved_gpus in quota.deserved_gpus_by_type.items():
            claim = min(deserved_gpus, allowed.get(type_name, 0.0))
            if claim > 0.0:
                own[type_name] = claim
            else:
                own.pop(type_name, None)
        state.claims_by_type = own
    allowed_cu = min(allowed_cu, children_allowed_cu)
    limit_cu = quota.limit_cu
    if limit_cu is not None and limit_cu < allowed_cu:
        allowed_cu = limit_cu
    state.allowed_cu = allowed_cu


def _divide_group(
    capacity_cu: float,
    members: list[QueueState],
    policy: FairSharePolicy,
    previous: Mapping[str, float],
    unit_cu: float | None,
) -> None:
    """Phases 1 and 2 for one sibling group; writes guaranteed, over-quota and fair shares."""
    bases = [min(m.deserved_cu, m.allowed_cu) for m in members]
    total_base = math.fsum(bases)
    if total_base <= capacity_cu:
        guaranteed = bases
        remaining = capacity_cu - total_base
    else:
        guaranteed = water_fill(capacity_cu, [m.deserved_cu for m in members], bases).shares
        remaining = 0.0
        if unit_cu is not None:
            guaranteed = round_scaled_guarantees(
                guaranteed,
                base_cu=bases,
                unit_cu=unit_cu,
                created_at_s=[m.created_at_s for m in members],
                names=[m.name for m in members],
            )
    for member, amount in zip(members, guaranteed, strict=True):
        member.guaranteed_cu = amount
        member.over_quota_cu = 0.0
        member.satisfied = amount >= member.allowed_cu

    if policy.division == Division.KAI:
        _divide_kai(remaining, members, policy, unit_cu)
    else:
        _divide_gpufair(remaining, members, policy, previous, unit_cu)
    for member in members:
        # A satisfied queue holds its allowed demand exactly, not guaranteed + need in floats.
        member.fair_share_cu = (
            member.allowed_cu if member.satisfied else member.guaranteed_cu + member.over_quota_cu
        )


def _divide_kai(
    remaining: float, members: list[QueueState], policy: FairSharePolicy, unit_cu: float | None
) -> None:
    """Phase 2 by KAI-Scheduler's rules (`kai_division`): weights per round, rounding inside."""
    division = kai_over_quota(
        remaining,
        needs=[0.0 if m.satisfied else m.allowed_cu - m.guaranteed_cu for m in members],
        weights=[m.over_quota_weight for m in members],
        usage_shares=[m.usage_share for m in members],
        priorities=[m.priority for m in members],
        created_at_s=[m.created_at_s for m in members],
        names=[m.name for m in members],
        k=policy.k,
        unit_cu=unit_cu,
    )
    for i, member in enumerate(members):
        if member.satisfied:
            continue
        member.over_quota_cu = division.shares[i]
        member.satisfied = member.guaranteed_cu + division.shares[i] >= member.allowed_cu
        if division.competed[i]:
            member.competes = True
            member.weight_share = division.weight_shares[i]
            member.priority_weight = division.priority_weights[i]
            member.effective_weight = division.effective_weights[i]


def _divide_gpufair(
    remaining: float,
    members: list[QueueState],
    policy: FairSharePolicy,
    previous: Mapping[str, float],
    unit_cu: float | None,
) -> None:
    """Phase 2 by gpufair's rules (module docstring), then whole-GPU rounding."""
    # Weighted queues of every tier first, then best effort (weight 0) of every tier.
    for best_effort in (False, True):
        tiers: dict[int, list[QueueState]] = {}
        for member in members:
            if not member.satisfied and (member.over_quota_weight <= 0.0) is best_effort:
                tiers.setdefault(member.priority, []).append(member)
        for priority in sorted(tiers, reverse=True):
            if remaining <= 0.0:
                break
            remaining = _divide_tier(remaining, tiers[priority], policy, previous)

    if unit_cu is not None:
        rounded = round_over_quota(
            [m.over_quota_cu for m in members],
            over_quota_need_cu=[m.allowed_cu - m.guaranteed_cu for m in members],
            satisfied=[m.satisfied for m in members],
            unit_cu=unit_cu,
            created_at_s=[m.created_at_s for m in members],
            names=[m.name for m in members],
        )
        for member, amount in zip(members, rounded, strict=True):
            member.over_quota_cu = amount


def _divide_tier(
    amount_cu: float,
    competing: list[QueueState],
    policy: FairSharePolicy,
    previous: Mapping[str, float],
) -> float:
    """Water-fill one priority tier in stages (module docstring); returns what is left."""
    first_stage = True
    while competing and amount_cu > 0.0:
        weights = stage_weights(
            [m.over_quota_weight for m in competing],
            [m.usage_share for m in competing],
            policy.k,
            [previous.get(m.name) for m in competing] if first_stage else [None] * len(competing),
            policy.dead_band,
        )
        needs = [m.allowed_cu - m.guaranteed_cu for m in competing]
        fill = water_fill(amount_cu, weights.effective_weights, needs)
        for i, member in enumerate(competing):
            if first_stage:
                member.competes = True
                member.weight_share = weights.weight_shares[i]
                member.priority_weight = weights.priority_weights[i]
                member.effective_weight = weights.effective_weights[i]
            member.over_quota_cu = fill.shares[i]
            member.satisfied = fill.capped[i]
        amount_cu = fill.leftover
        competing = [
            m for m, w in zip(competing, weights.effective_weights, strict=True) if w <= 0.0
        ]
        first_stage = False
    return amount_cu


def _grant_type_guarantees(
    tree: QueueTree, states: dict[str, QueueState], capacity_by_type: dict[str, float]
) -> None:
    """Per-type claims shrunk, group by group, to what is available (module docstring)."""
    for group in tree.inner_groups():
        members = [states[name] for name in tree.children_of(group)]
        # A parent that declares no guarantee for a type claimed its children's sum, so its
        # grant bounds them either way.
        available = capacity_by_type if group is None else states[group].guaranteed_by_type
        for type_name in _type_names(members):
            claims = [m.claims_by_type.get(type_name, 0.0) for m in members]
            total = math.fsum(claims)
            scale = min(1.0, available.get(type_name, 0.0) / total) if total > 0.0 else 0.0
            for member, claim in zip(members, claims, strict=True):
                if claim > 0.0:
                    # Few queues hold per-type guarantees: a new map for those only.
                    granted = dict(member.guaranteed_by_type)
                    granted[type_name] = claim * scale
                    member.guaranteed_by_type = granted


def _type_names(members: list[QueueState]) -> list[str]:
    return sorted({t for m in members for t in m.claims_by_type})
