"""What a fair-share computation returns: shares, and explain records built on request.

`compute_fair_shares` leaves one `QueueState` per queue; `FairShareResult` reads the numbers most
callers need (fair shares, effective weights, who competed) straight from them, and turns a
queue's state into its explain record `QueueShare` only when `shares[name]` is read, once. A pool
of 10,000 queues whose recompute only needs the shares never pays for 10,000 records.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from gpufair.domain.model import Queue
from gpufair.domain.policy import deserved_cu_with_types
from gpufair.domain.snapshot import UsageStanding
from gpufair.domain.usage import UsageInputs


@dataclass(frozen=True, slots=True)
class QueueShare:
    """Why a queue's fair share is what it is: every number the division used.

    W', P and the effective weight are 0 for a queue that did not compete for over-quota
    capacity (its allowed demand was met by its guarantee).
    """

    queue: str
    parent: str | None
    is_leaf: bool
    priority: int
    over_quota_weight: float  # configured w
    created_at_s: float
    deserved_cu: float  # the CU guarantee, per-type quotas included
    limit_cu: float | None  # configured; None = unlimited
    demand_cu: float  # allocated + pending
    allocated_cu: float
    allowed_demand_cu: float  # demand after every limit: the most the queue may hold
    guaranteed_cu: float  # phase 1: min(deserved, allowed demand), shrunk only under scarcity
    competes_over_quota: bool
    weight_share: float  # W'
    decayed_usage_cu_s: float  # decayed usage numerator
    group_capacity_cu_s: float  # decayed capacity denominator of the queue's sibling group
    usage_share: float  # U'
    priority_weight: float  # P = max(0, W' + k (W' - U'))
    effective_weight: float  # P normalised in its stage, after the dead band
    fair_share_cu: float
    demand_gpus_by_type: Mapping[str, float]
    allocated_gpus_by_type: Mapping[str, float]
    guaranteed_gpus_by_type: Mapping[str, float]
    fair_share_gpus_by_type: Mapping[str, float]  # empty where not well defined

    @property
    def over_quota_share_cu(self) -> float:
        return self.fair_share_cu - self.guaranteed_cu


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
        """What the next computation takes as `previous_effective_weights`."""
        states = self.shares.states
        return {name: states[name].effective_weight for name in self.shares.order}

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
