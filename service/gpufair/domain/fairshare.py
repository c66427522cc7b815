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

Static and per-call parts (issue 17). What only the configuration decides — the tree, each
queue's quota, weights, limits and per-type guarantees, the sibling groups and their tiers — is
compiled into a `FairSharePlan` (`fairshare_plan`), which a caller keeps across calls (the
recompute does, per pool). A call reads the demands and the history into `ShareColumns`, one list
per quantity indexed like the plan, divides group by group (`fairshare_groups`) and returns a
result that reads those columns. Every sum and comparison is the one the division has always
made, in the same order, so the numbers do not depend on whether a plan was passed.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpufair.domain.errors import InvalidInputError, Violation
from gpufair.domain.fairshare_groups import divide_group
from gpufair.domain.fairshare_plan import (
    TOP,
    FairSharePlan,
    quota_violations,
    type_violations,
)
from gpufair.domain.fairshare_result import (
    NO_GPUS,
    FairShareResult,
    QueueShare,
    ShareColumns,
    ShareRecords,
)
from gpufair.domain.model import (
    FairSharePolicy,
    GpuType,
    Queue,
    Rounding,
    frozen_map,
)
from gpufair.domain.rounding import whole_gpu_unit_cu
from gpufair.domain.usage import UsageInputs

__all__ = [
    "FairShareInput",
    "FairSharePlan",
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


def compute_fair_shares(inp: FairShareInput, plan: FairSharePlan | None = None) -> FairShareResult:
    """Divide one pool's capacity among its queues (module docstring).

    `plan` is the pool's compiled configuration (`fairshare_plan`), kept by the caller across
    calls; without one, or with one compiled from another configuration, a plan is compiled
    for this input (the result is the same either way).

    Raises `InvalidInputError` for an invalid policy, GPU type, quota, tree, demand or history.
    """
    if plan is None or not plan.fits(inp.pool, inp.policy, inp.gpu_types, inp.queues):
        _validate(inp)
        plan = FairSharePlan.compile_checked(inp.pool, inp.policy, inp.gpu_types, inp.queues)
    else:
        call_violations = [*_capacity_violations(inp), *_history_violations(inp)]
        if call_violations:
            raise InvalidInputError(call_violations)
    compute_weights = plan.compute_weights
    capacity_by_type = {t: g for t, g in inp.capacity_gpus_by_type.items() if g > 0.0}
    capacity_cu = math.fsum(g * compute_weights[t] for t, g in capacity_by_type.items())
    columns = ShareColumns(len(plan.names))
    _aggregate_demand(inp, plan, columns, capacity_by_type)

    policy = inp.policy
    unit_cu = None
    if policy.rounding == Rounding.WHOLE_GPUS:
        unit_cu = whole_gpu_unit_cu(list(inp.gpu_types.values()), capacity_by_type)
    usage_cu_s = inp.usage.usage_cu_s
    group_capacity_cu_s = inp.usage.group_capacity_cu_s
    usage_share = columns.usage_share
    fair_share = columns.fair_share_cu
    names = plan.names
    for group in plan.groups:
        parent = group.parent
        if parent == TOP:
            group_capacity_cu = capacity_cu
            denominator = group_capacity_cu_s.get(None, 0.0)
        else:
            group_capacity_cu = fair_share[parent]
            denominator = group_capacity_cu_s.get(names[parent], 0.0)
        if denominator > 0.0:  # `weights.usage_share`, inline: it runs for every queue
            usage_share[group.start : group.end] = [
                usage_cu_s.get(name, 0.0) / denominator for name in group.names
            ]
        divide_group(
            group_capacity_cu, group, columns, policy, inp.previous_effective_weights, unit_cu
        )
    _grant_type_guarantees(plan, columns, capacity_by_type)

    single_type = next(iter(capacity_by_type)) if len(capacity_by_type) == 1 else None
    return FairShareResult(
        pool=inp.pool,
        capacity_cu=capacity_cu,
        whole_gpu_unit_cu=unit_cu,
        shares=ShareRecords(plan, columns, inp.usage, single_type),
    )


def _validate(inp: FairShareInput) -> None:
    """Every check of an input, in the order of its messages: policy and GPU types, capacity,
    quotas, history (the tree and the demands are checked next)."""
    violations = type_violations(inp.policy, inp.gpu_types)
    violations.extend(_capacity_violations(inp))
    violations.extend(quota_violations(inp.pool, inp.policy, inp.gpu_types, inp.queues))
    violations.extend(_history_violations(inp))
    if violations:
        raise InvalidInputError(violations)


def _capacity_violations(inp: FairShareInput) -> list[Violation]:
    violations = []
    for type_name, gpus in inp.capacity_gpus_by_type.items():
        path = f'capacity_gpus_by_type["{type_name}"]'
        if type_name not in inp.gpu_types:
            violations.append(Violation(path, f"unknown GPU type {type_name!r}"))
        elif not (math.isfinite(gpus) and gpus >= 0.0):
            violations.append(Violation(path, f"must be a finite number ≥ 0, got {gpus!r}"))
    return violations


def _history_violations(inp: FairShareInput) -> list[Violation]:
    violations = []
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
    return violations


def _raise_demand_violations(inp: FairShareInput, plan: FairSharePlan) -> None:
    violations: list[Violation] = []
    for name, demand in inp.demands.items():
        if name not in plan.index:
            violations.append(Violation(f'demands["{name}"]', f"unknown queue {name!r}"))
            continue
        if plan.children[plan.index[name]] is not None:
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
    plan: FairSharePlan,
    columns: ShareColumns,
    capacity_by_type: dict[str, float],
) -> None:
    """Every queue's demand, allowed demand and per-type claims into `columns`, leaves first,
    then inner queues children before parents; the demands are checked on the way.

    The hot loop of a large pool (one pass over every queue): written with local names and
    plain dict operations rather than helpers, since a call per queue and type is most of its
    cost. Sums run over children in name order, and over a leaf's types in the order of its
    maps (allocated, then pending), so they are deterministic.
    """
    demands = inp.demands
    compute_weights = plan.compute_weights
    allocated_col = columns.allocated_by_type
    pending_col = columns.pending_by_type
    demand_col = columns.demand_by_type
    allowed_col = columns.allowed_by_type
    claims_col = columns.claims_by_type
    allowed_cu_col = columns.allowed_cu
    inf = math.inf
    found = 0
    for i, name, type_limits, deserved_by_type, limit_cu in plan.leaves:
        demand = demands.get(name)
        if demand is None:
            allocated_col[i] = demand_col[i] = NO_GPUS
            allowed: dict[str, float] = {}
            allowed_cu = 0.0
        else:
            found += 1
            # The leaf's demand (allocated + pending) is summed into what becomes its allowed
            # demand; its explain record sums it again (`ShareRecords`).
            allocated = demand.allocated_gpus_by_type
            pending = demand.pending_gpus_by_type
            allocated_col[i] = allocated
            pending_col[i] = pending
            for gpus in allocated.values():
                if not 0.0 <= gpus < inf:
                    _raise_demand_violations(inp, plan)
            allowed = dict(allocated)
            for type_name, gpus in pending.items():
                if not 0.0 <= gpus < inf:
                    _raise_demand_violations(inp, plan)
                allowed[type_name] = allowed.get(type_name, 0.0) + gpus
            allowed_cu = 0.0
            dropped: list[str] | None = None
            for type_name, gpus in allowed.items():
                capacity = capacity_by_type.get(type_name)
                if capacity is None:  # a type without capacity, or an unknown one
                    if type_name not in compute_weights:
                        _raise_demand_violations(inp, plan)
                    capacity = 0.0
                bound = gpus if gpus < capacity else capacity  # min(), without the call
                if type_limits and type_name in type_limits:
                    bound = min(bound, type_limits[type_name])
                if bound > 0.0:
                    if bound != gpus:
                        allowed[type_name] = bound
                    allowed_cu += bound * compute_weights[type_name]
                else:
                    dropped = [type_name] if dropped is None else [*dropped, type_name]
            if dropped is not None:
                for type_name in dropped:
                    del allowed[type_name]
        allowed_col[i] = allowed
        if deserved_by_type:  # most queues declare none: they share one empty claims map
            claims_col[i] = _claims(NO_GPUS, deserved_by_type, allowed)
        if limit_cu is not None and limit_cu < allowed_cu:
            allowed_cu = limit_cu
        allowed_cu_col[i] = allowed_cu
    if found != len(demands):  # a demand for an unknown or inner queue
        _raise_demand_violations(inp, plan)

    # An inner queue's demand and allocation are its children's sums; only its explain record
    # shows them, so they are summed there (`ShareRecords`), not here.
    children = plan.children
    type_limits_of = plan.limit_gpus_by_type
    for i in plan.inner_postorder:
        holds: dict[str, float] = {}
        claimed: dict[str, float] = {}
        children_allowed_cu = 0.0
        for child in children[i] or ():
            for type_name, gpus in allowed_col[child].items():
                holds[type_name] = holds.get(type_name, 0.0) + gpus
            child_claims = claims_col[child]
            if child_claims is not NO_GPUS:  # most queues claim no type
                for type_name, gpus in child_claims.items():
                    claimed[type_name] = claimed.get(type_name, 0.0) + gpus
            children_allowed_cu += allowed_cu_col[child]
        type_limits = type_limits_of[i]
        allowed = {}
        allowed_cu = 0.0
        for type_name, gpus in holds.items():
            bound = capacity_by_type.get(type_name, 0.0)
            bound = min(bound, gpus)
            if type_limits and type_name in type_limits and type_limits[type_name] < bound:
                bound = type_limits[type_name]
            if bound > 0.0:
                allowed[type_name] = bound
                allowed_cu += bound * compute_weights[type_name]
        allowed_col[i] = allowed
        deserved_by_type = plan.deserved_gpus_by_type[i]
        claims_col[i] = _claims(claimed, deserved_by_type, allowed) if deserved_by_type else claimed
        allowed_cu = min(allowed_cu, children_allowed_cu)
        limit_cu = plan.limit_cu[i]
        if limit_cu is not None and limit_cu < allowed_cu:
            allowed_cu = limit_cu
        allowed_cu_col[i] = allowed_cu


def _claims(
    children_claims: Mapping[str, float],
    deserved_by_type: Mapping[str, float],
    allowed: Mapping[str, float],
) -> dict[str, float]:
    """A queue's per-type claims: its children's, where it declares a per-type guarantee
    replaced by min(deserved GPUs, allowed demand) of the type (dropped at 0)."""
    own = dict(children_claims)
    for type_name, deserved_gpus in deserved_by_type.items():
        claim = min(deserved_gpus, allowed.get(type_name, 0.0))
        if claim > 0.0:
            own[type_name] = claim
        else:
            own.pop(type_name, None)
    return own


def _grant_type_guarantees(
    plan: FairSharePlan, columns: ShareColumns, capacity_by_type: dict[str, float]
) -> None:
    """Per-type claims shrunk, group by group, to what is available (module docstring).

    Only the groups and members whose subtrees declare a per-type guarantee are visited: no
    other queue claims a type (`FairSharePlan.typed_groups`)."""
    claims_col = columns.claims_by_type
    granted_col = columns.guaranteed_by_type
    for parent, claiming in plan.typed_groups:
        # A parent that declares no guarantee for a type claimed its children's sum, so its
        # grant bounds them either way.
        available = capacity_by_type if parent == TOP else granted_col[parent]
        for type_name in sorted({t for i in claiming for t in claims_col[i]}):
            claims = [claims_col[i].get(type_name, 0.0) for i in claiming]
            total = math.fsum(claims)
            scale = min(1.0, available.get(type_name, 0.0) / total) if total > 0.0 else 0.0
            for i, claim in zip(claiming, claims, strict=True):
                if claim > 0.0:
                    # Few queues hold per-type guarantees: a new map for those only.
                    granted = dict(granted_col[i])
                    granted[type_name] = claim * scale
                    granted_col[i] = granted
