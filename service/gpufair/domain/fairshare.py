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
without over-quota, no dead band). In both, a limit below the deserved quota caps the
guarantee (min(deserved, demand, limit)). docs/kai-compatibility.md lists the differences with
examples.

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
recompute does, per pool). The demands come as columns in the plan's leaf order
(`fairshare_demand.LeafDemands`, which the recompute and the simulator build from their rows,
`demand.leaf_demand_columns`) or as maps by name, which the call turns into columns. The demand
pass bounds them on arrays (`fairshare_aggregate`); the call reads the history into
`ShareColumns`, one list per quantity indexed like the plan, divides group by group
(`fairshare_groups`) and returns a result that reads those columns; explain records are built
only when read. Every sum and comparison is the one the division has always made, in the same
order, so the numbers do not depend on whether a plan was passed or how the demands came.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from itertools import repeat
from typing import Any

from gpufair.domain.errors import InvalidInputError, Violation
from gpufair.domain.fairshare_aggregate import aggregate_demand
from gpufair.domain.fairshare_demand import LeafDemands, QueueDemand
from gpufair.domain.fairshare_groups import divide_group
from gpufair.domain.fairshare_plan import (
    TOP,
    FairSharePlan,
    quota_violations,
    type_violations,
)
from gpufair.domain.fairshare_result import (
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
    "LeafDemands",
    "QueueDemand",
    "QueueShare",
    "compute_fair_shares",
]


@dataclass(frozen=True, slots=True)
class FairShareInput:
    """One pool's snapshot and history, everything `compute_fair_shares` reads."""

    pool: str
    policy: FairSharePolicy
    gpu_types: Mapping[str, GpuType]  # by name; at least the types in the pool and in demands
    capacity_gpus_by_type: Mapping[str, float]  # GPUs of each type on the pool's ready nodes
    queues: Sequence[Queue]  # the whole tree; a queue without terms in the pool is best effort
    # Leaves only, by name, or as columns (`LeafDemands`, what the recompute passes).
    demands: Mapping[str, QueueDemand] | LeafDemands = field(default_factory=frozen_map)
    usage: UsageInputs = field(default_factory=UsageInputs)  # empty: no history
    # The last computation's `FairShareResult.effective_weights`, for the dead band: the queues
    # that competed then; a queue absent here is not held by the band.
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
    columns.leaf_demands = _leaf_demands(inp, plan)
    aggregate_demand(plan, columns.leaf_demands, capacity_by_type, columns)

    policy = inp.policy
    unit_cu = None
    if policy.rounding == Rounding.WHOLE_GPUS:
        unit_cu = whole_gpu_unit_cu(list(inp.gpu_types.values()), capacity_by_type)
    usage_cu_s = inp.usage.usage_cu_s
    group_capacity_cu_s = inp.usage.group_capacity_cu_s
    usage_share = columns.usage_share
    fair_share = columns.fair_share_cu
    names = plan.names
    # Every queue's decayed usage in one pass (C-level lookups), divided group by group below.
    usage_of = list(map(usage_cu_s.get, names, repeat(0.0, len(names))))
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
                usage / denominator for usage in usage_of[group.start : group.end]
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


def _leaf_demands(inp: FairShareInput, plan: FairSharePlan) -> LeafDemands:
    """The input's demands as columns in the plan's leaf and type order; raises
    `InvalidInputError` for a demand of an unknown or inner queue, of an unknown type, or a
    number that is not finite and ≥ 0."""
    demands = inp.demands
    if isinstance(demands, LeafDemands):
        if demands.leaves == plan.leaf_names and demands.types == plan.type_names:
            if demands.valid():
                return demands
            _raise_demand_violations(inp, plan, demands.as_maps())
        demands = demands.as_maps()  # another leaf or type order: read again
    columns = LeafDemands.from_maps(plan.leaf_names, plan.type_names, demands)
    if columns is None:
        _raise_demand_violations(inp, plan, demands)
        raise AssertionError("demands refused without a reason")  # pragma: no cover
    return columns


def _raise_demand_violations(
    inp: FairShareInput, plan: FairSharePlan, demands: Mapping[str, QueueDemand]
) -> None:
    violations: list[Violation] = []
    for name, demand in demands.items():
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
