"""The fair-share division as it was before the compiled plan (issue 17), kept as a test oracle.

`compute_fair_shares` here is the previous engine, unchanged apart from living in one file: the
randomized comparison in `test_fairshare_plan.py` checks that the current engine returns the
same numbers, to the last bit, on random trees. It is not used by the service.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from gpufair.domain.errors import InvalidInputError, Violation
from gpufair.domain.fairshare import FairShareInput
from gpufair.domain.fairshare_result import QueueShare
from gpufair.domain.model import (
    Division,
    FairSharePolicy,
    Queue,
    QueueQuota,
    Rounding,
)
from gpufair.domain.policy import (
    deserved_cu_with_types,
    validate_gpu_types,
    validate_policy,
    validate_pool_quotas,
)
from gpufair.domain.rounding import round_over_quota, round_scaled_guarantees, whole_gpu_unit_cu
from gpufair.domain.snapshot import UsageStanding
from gpufair.domain.tree import QueueTree
from gpufair.domain.usage import UsageInputs


class ShareRecords(Mapping[str, QueueShare]):
    """The explain records of one computation, by queue name in tree pre-order, each built from
    its working state the first time it is read (and kept)."""

    __slots__ = (
        "_built",
        "_children",
        "_compute_weights",
        "_single_type",
        "_summed",
        "_usage",
        "order",
        "states",
    )

    def __init__(
        self,
        states: dict[str, QueueState],
        order: tuple[str, ...],
        children: Mapping[str | None, tuple[str, ...]],
        usage: UsageInputs,
        compute_weights: dict[str, float],
        single_type: str | None,
    ) -> None:
        self.states = states  # children before parents
        self.order = order  # the tree's pre-order: how records are listed
        self._children = children
        self._summed = False
        self._usage = usage
        self._compute_weights = compute_weights
        self._single_type = single_type
        self._built: dict[str, QueueShare] = {}

    def __getitem__(self, name: str) -> QueueShare:
        record = self._built.get(name)
        if record is None:
            if not self._summed:
                self._sum_inner_demand()
            record = _explain(
                self.states[name], self._usage, self._compute_weights, self._single_type
            )
            self._built[name] = record
        return record

    def _sum_inner_demand(self) -> None:
        """Every queue's demand (a leaf's allocated + pending) and every inner queue's
        allocation: its children's sums, children in name order, once for all records."""
        states = self.states
        for name in states:  # children before parents
            kids = self._children.get(name)
            if kids is None:
                leaf = states[name]
                if leaf.demand_by_type is None:
                    assert leaf.allocated_by_type is not None
                    leaf_demand = dict(leaf.allocated_by_type)
                    for type_name, gpus in leaf.pending_by_type.items():
                        leaf_demand[type_name] = leaf_demand.get(type_name, 0.0) + gpus
                    leaf.demand_by_type = leaf_demand
                continue
            allocated: dict[str, float] = {}
            wanted: dict[str, float] = {}
            for child_name in kids:
                child = states[child_name]
                assert child.allocated_by_type is not None and child.demand_by_type is not None
                for type_name, gpus in child.allocated_by_type.items():
                    allocated[type_name] = allocated.get(type_name, 0.0) + gpus
                for type_name, gpus in child.demand_by_type.items():
                    wanted[type_name] = wanted.get(type_name, 0.0) + gpus
            states[name].allocated_by_type = allocated
            states[name].demand_by_type = wanted
        self._summed = True

    def __iter__(self) -> Iterator[str]:
        return iter(self.order)

    def __len__(self) -> int:
        return len(self.states)

    def __contains__(self, name: object) -> bool:
        return name in self.states


@dataclass(frozen=True, slots=True)
class FairShareResult:
    pool: str
    capacity_cu: float
    whole_gpu_unit_cu: float | None  # the rounding step in `whole_gpus` mode, else None
    shares: ShareRecords  # explain records by queue name, in tree pre-order, built on request

    @property
    def fair_share_cu(self) -> Mapping[str, float]:
        """Every queue's fair share in CU, without building explain records."""
        states = self.shares.states
        return {name: states[name].fair_share_cu for name in self.shares.order}

    @property
    def effective_weights(self) -> Mapping[str, float]:
        """What the next computation takes as `previous_effective_weights`: the queues that
        competed only."""
        states = self.shares.states
        return {
            name: states[name].effective_weight
            for name in self.shares.order
            if states[name].competes
        }

    @property
    def standing(self) -> Mapping[str, UsageStanding]:
        """Every queue's W' and U', what the cycle's gang entitlement rule reads."""
        states = self.shares.states
        return {
            name: UsageStanding(states[name].weight_share, states[name].usage_share)
            for name in self.shares.order
        }

    @property
    def competing(self) -> frozenset[str]:
        """The queues that took part in the over-quota division."""
        return frozenset(name for name, state in self.shares.states.items() if state.competes)

    @property
    def idle_cu(self) -> float:
        """Capacity no queue may use: the pool minus the top-level fair shares."""
        top = math.fsum(s.fair_share_cu for s in self.shares.states.values() if s.parent is None)
        return max(0.0, self.capacity_cu - top)


NO_GPUS: Mapping[str, float] = MappingProxyType({})  # one read-only empty map, shared


class QueueState:
    """The engine's working record of one queue; the explain record is built from it on request."""

    __slots__ = (
        "allocated_by_type",
        "allowed_by_type",
        "allowed_cu",
        "claims_by_type",
        "competes",
        "created_at_s",
        "demand_by_type",
        "deserved_cu",
        "effective_weight",
        "fair_share_cu",
        "guaranteed_by_type",
        "guaranteed_cu",
        "is_leaf",
        "limit_cu",
        "name",
        "over_quota_cu",
        "over_quota_weight",
        "parent",
        "pending_by_type",
        "priority",
        "priority_weight",
        "quota",
        "satisfied",
        "usage_share",
        "weight_share",
    )

    def __init__(self, queue: Queue, pool: str, is_leaf: bool, compute_weights: dict[str, float]):
        quota = queue.quotas.get(pool) or queue.quota(pool)
        self.quota = quota
        self.name = queue.name
        self.parent = queue.parent
        self.is_leaf = is_leaf
        self.created_at_s = queue.created_at_s
        self.priority = quota.priority
        self.over_quota_weight = quota.over_quota_weight
        self.deserved_cu = (
            deserved_cu_with_types(quota, compute_weights)
            if quota.deserved_gpus_by_type
            else quota.deserved_cu
        )
        self.limit_cu = quota.limit_cu
        # Demand, allocation, allowed demand and per-type claims (the `*_by_type` maps and their
        # CU) are set by the demand aggregation, for every queue, before anything reads them.
        # Demand (allocated + pending) stays None until an explain record sums it; an inner
        # queue's allocation too.
        self.demand_by_type: Mapping[str, float] | None = None
        self.allocated_by_type: Mapping[str, float] | None = None
        self.pending_by_type: Mapping[str, float] = NO_GPUS  # a leaf's, as given
        self.allowed_by_type: dict[str, float]
        self.claims_by_type: Mapping[str, float]
        self.allowed_cu: float
        # Shared and empty until a per-type guarantee is granted (most queues have none).
        self.guaranteed_by_type: Mapping[str, float] = NO_GPUS
        self.guaranteed_cu = 0.0
        self.over_quota_cu = 0.0
        self.fair_share_cu = 0.0
        self.satisfied = False
        self.competes = False
        self.weight_share = 0.0
        self.usage_share = 0.0
        self.priority_weight = 0.0
        self.effective_weight = 0.0


def _explain(
    state: QueueState,
    usage: UsageInputs,
    compute_weights: dict[str, float],
    single_type: str | None,
) -> QueueShare:
    demand, allocated = state.demand_by_type, state.allocated_by_type
    assert demand is not None and allocated is not None  # summed by ShareRecords
    only_type = single_type
    if only_type is None and len(state.allowed_by_type) == 1:
        only_type = next(iter(state.allowed_by_type))
    fair_share_gpus_by_type: Mapping[str, float] = {}
    if only_type is not None:
        fair_share_gpus_by_type = {only_type: state.fair_share_cu / compute_weights[only_type]}
    return QueueShare(
        queue=state.name,
        parent=state.parent,
        is_leaf=state.is_leaf,
        priority=state.priority,
        over_quota_weight=state.over_quota_weight,
        created_at_s=state.created_at_s,
        deserved_cu=state.deserved_cu,
        limit_cu=state.limit_cu,
        demand_cu=_cu(demand, compute_weights),
        allocated_cu=_cu(allocated, compute_weights),
        allowed_demand_cu=state.allowed_cu,
        guaranteed_cu=state.guaranteed_cu,
        competes_over_quota=state.competes,
        weight_share=state.weight_share,
        decayed_usage_cu_s=usage.usage_cu_s.get(state.name, 0.0),
        group_capacity_cu_s=usage.group_capacity_cu_s.get(state.parent, 0.0),
        usage_share=state.usage_share,
        priority_weight=state.priority_weight,
        effective_weight=state.effective_weight,
        fair_share_cu=state.fair_share_cu,
        demand_gpus_by_type=MappingProxyType(demand),
        allocated_gpus_by_type=MappingProxyType(allocated),
        guaranteed_gpus_by_type=MappingProxyType(state.guaranteed_by_type),
        fair_share_gpus_by_type=MappingProxyType(fair_share_gpus_by_type),
    )


def _cu(gpus_by_type: Mapping[str, float], compute_weights: Mapping[str, float]) -> float:
    total = 0.0
    for type_name, gpus in gpus_by_type.items():
        total += gpus * compute_weights[type_name]
    return total


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
        for v in validate_pool_quotas(inp.queues, inp.pool, gpu_types=inp.gpu_types)
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
                _finish(state, quota, summed, allowed_cu, inf, compute_weights)
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
        _finish(state, quota, allowed, allowed_cu, children_allowed_cu, compute_weights)
    return states


def _finish(
    state: QueueState,
    quota: QueueQuota,
    allowed: Mapping[str, float],
    allowed_cu: float,
    children_allowed_cu: float,
    compute_weights: Mapping[str, float],
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
    if state.claims_by_type:  # claims worth at most the allowed demand in CU
        claims = state.claims_by_type
        worth = math.fsum(gpus * compute_weights[t] for t, gpus in claims.items())
        if worth > allowed_cu:
            scale = allowed_cu / worth
            state.claims_by_type = {t: gpus * scale for t, gpus in claims.items()}


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


# The water-filling and stage weights as they were, so that the oracle shares no arithmetic
# with the engine it checks.


@dataclass(frozen=True, slots=True)
class WaterFill:
    shares: list[float]  # what each item receives
    capped: list[bool]  # True: the item received exactly its cap
    leftover: float  # amount no positive-weight item could take


def water_fill(amount: float, weights: Sequence[float], caps: Sequence[float]) -> WaterFill:
    """Divide `amount` in proportion to `weights`, nobody above their cap.

    The rounds of DESIGN §3.2 (split by weight; a satisfied item keeps its cap; the leftover goes
    round again) converge to one water level λ: item i gets min(cap_i, λ · w_i) with
    Σ_i min(cap_i, λ · w_i) = amount, or its cap when the amount covers every cap. Sorting by
    cap_i / w_i finds λ in one pass, O(n log n), with no tolerance loop: items are visited from
    the lowest ratio; one whose ratio is at or below the level the remaining items would share
    takes its cap, and the first one above it fixes λ for all the rest.

    Items with weight 0 get nothing (the caller decides what they may have of the leftover), and
    so do items with cap ≤ 0. Capped items receive their cap exactly, not a float near it.
    """
    count = len(weights)
    shares = [0.0] * count
    capped = [False] * count
    order = [i for i in range(count) if weights[i] > 0.0 and caps[i] > 0.0]
    order.sort(key=lambda i: caps[i] / weights[i])
    # Suffix sums rather than a running difference: subtracting weights one by one drifts, and the
    # last few items would then share an amount divided by a float residue.
    weight_after = [0.0] * (len(order) + 1)
    for position in range(len(order) - 1, -1, -1):
        weight_after[position] = weight_after[position + 1] + weights[order[position]]
    remaining = amount
    for position, i in enumerate(order):
        level = remaining / weight_after[position]
        if caps[i] <= level * weights[i]:
            shares[i] = caps[i]
            capped[i] = True
            remaining -= caps[i]
            continue
        for j in order[position:]:
            shares[j] = level * weights[j]
        return WaterFill(shares=shares, capped=capped, leftover=0.0)
    return WaterFill(shares=shares, capped=capped, leftover=max(0.0, remaining))


def priority_weight(weight_share: float, usage_share: float, k: float) -> float:
    """P = max(0, W' + k · (W' - U')): below-share users gain, above-share users give way."""
    return max(0.0, weight_share + k * (weight_share - usage_share))


@dataclass(frozen=True, slots=True)
class StageWeights:
    """One division stage's weights, index-aligned with the queues passed in."""

    weight_shares: list[float]  # W'
    priority_weights: list[float]  # P
    effective_weights: list[float]  # P / ΣP (W' if every P is 0), after the dead band


def stage_weights(
    over_quota_weights: Sequence[float],
    usage_shares: Sequence[float],
    k: float,
    previous_effective_weights: Sequence[float | None],
    dead_band: float,
) -> StageWeights:
    """The effective weights of the queues competing in one over-quota stage.

    W'_q = w_q / Σ w over the competing queues; when every configured weight is 0 (best-effort
    queues only) they share equally, so leftover capacity is still used. If every P is 0 the
    division falls back to W' (DESIGN §3.3). Effective weights are P normalised to sum to 1.

    Dead band (absolute, on the normalised weight): a queue whose new effective weight is within
    `dead_band` of its previous one keeps the previous value, so shares do not jitter between
    recomputes. Should that leave every weight at 0, the unbanded weights are used instead —
    stability must never idle capacity. A queue whose weight falls to 0 (P = 0: it is to give
    way entirely) always moves: keeping a sliver of its old weight would keep the others a sliver
    short for as long as its P stays pinned at 0, so a gang needing all they are due would wait
    forever.
    """
    count = len(over_quota_weights)
    total_weight = math.fsum(over_quota_weights)
    if total_weight > 0.0:
        weight_shares = [w / total_weight for w in over_quota_weights]
    else:
        weight_shares = [1.0 / count] * count
    priority_weights = [
        priority_weight(w, u, k) for w, u in zip(weight_shares, usage_shares, strict=True)
    ]
    total_priority = math.fsum(priority_weights)
    if total_priority > 0.0:
        unbanded = [p / total_priority for p in priority_weights]
    else:
        unbanded = list(weight_shares)
    banded = [
        previous if previous is not None and new > 0.0 and abs(new - previous) < dead_band else new
        for new, previous in zip(unbanded, previous_effective_weights, strict=True)
    ]
    if not any(weight > 0.0 for weight in banded):
        banded = unbanded
    return StageWeights(
        weight_shares=weight_shares,
        priority_weights=priority_weights,
        effective_weights=banded,
    )


# The previous `kai_division` function, unchanged, so that the oracle does not follow the
# engine's rewrites of it (the whole-GPU rounding, `domain/rounding.py`, is the engine's own:
# unchanged since the oracle was made).
_KAI_UNIT_SLACK = 1e-9


@dataclass(frozen=True, slots=True)
class KaiOverQuota:
    """The over-quota shares of one group, index-aligned with the queues passed in, and the
    weights of the first round each queue competed in (for the explain record)."""

    shares: list[float]
    competed: list[bool]
    weight_shares: list[float]  # W'
    priority_weights: list[float]  # P
    effective_weights: list[float]  # P / ΣP
    leftover: float


def kai_over_quota(
    amount: float,
    *,
    needs: Sequence[float],
    weights: Sequence[float],
    usage_shares: Sequence[float],
    priorities: Sequence[int],
    created_at_s: Sequence[float],
    names: Sequence[str],
    k: float,
    unit_cu: float | None,
) -> KaiOverQuota:
    """Divide `amount` over-quota among one group's queues by KAI's rounds (module docstring).

    `needs[i]` is what queue i may still take above its guarantee (allowed demand − guarantee).
    """
    count = len(needs)
    given = [0.0] * count
    competed = [False] * count
    weight_shares = [0.0] * count
    priority_weights = [0.0] * count
    effective_weights = [0.0] * count
    remainders: dict[int, dict[int, float]] = {}
    tiers: dict[int, list[int]] = {}
    for i in range(count):
        tiers.setdefault(priorities[i], []).append(i)
    order = sorted(tiers, reverse=True)
    for priority in order:
        tier_remainders = remainders.setdefault(priority, {})
        members = tiers[priority]
        while True:
            unsatisfied = [i for i in members if given[i] < needs[i]]
            total_weight = math.fsum(weights[i] for i in unsatisfied)
            if total_weight <= 0.0:
                break
            round_p: dict[int, float] = {}
            for i in unsatisfied:
                share_w = weights[i] / total_weight
                round_p[i] = max(0.0, share_w + k * (share_w - usage_shares[i]))
                if not competed[i] and weights[i] > 0.0:
                    weight_shares[i] = share_w
                    priority_weights[i] = round_p[i]
            total_p = math.fsum(round_p.values())
            if total_p <= 0.0:
                break
            round_amount = amount
            another_round = False
            for i in unsatisfied:
                if amount <= 0.0:
                    break
                if weights[i] <= 0.0:
                    continue
                if not competed[i]:
                    competed[i] = True
                    effective_weights[i] = round_p[i] / total_p
                offer = round_amount * (round_p[i] / total_p)
                requested = needs[i] - given[i]
                if requested <= offer:
                    take = requested
                    tier_remainders.pop(i, None)
                else:
                    take = offer
                    if unit_cu is not None:
                        take = unit_cu * math.floor(offer / unit_cu + _KAI_UNIT_SLACK)
                        if offer - take > 0.0:
                            tier_remainders[i] = offer - take
                take = min(take, amount, requested)
                if take <= 0.0:
                    continue
                given[i] += take
                amount -= take
                another_round = another_round or requested < offer
            if not another_round or amount <= 0.0:
                break
    if unit_cu is not None:
        for priority in order:
            if amount <= unit_cu * _KAI_UNIT_SLACK:
                break
            pending = sorted(
                remainders.get(priority, {}).items(),
                key=lambda item: (-item[1], created_at_s[item[0]], names[item[0]]),
            )
            for i, _ in pending:
                if amount <= unit_cu * _KAI_UNIT_SLACK:
                    break
                grant = min(unit_cu, amount, needs[i] - given[i])
                if grant > 0.0:
                    given[i] += grant
                    amount -= grant
    return KaiOverQuota(
        shares=given,
        competed=competed,
        weight_shares=weight_shares,
        priority_weights=priority_weights,
        effective_weights=effective_weights,
        leftover=max(0.0, amount),
    )
