"""What a fair-share computation returns: shares, and explain records built on request.

`compute_fair_shares` leaves its working numbers in `ShareColumns`, one list per quantity indexed
like its `FairSharePlan`'s queues; `FairShareResult` reads the numbers most callers need (fair
shares, effective weights, who competed) straight from those columns, and turns a queue's entries
into its explain record `QueueShare` only when `shares[name]` is read, once. A pool of 10,000
queues whose recompute only needs the shares never pays for 10,000 records.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from itertools import compress
from types import MappingProxyType

import numpy as np

from gpufair.domain.fairshare_demand import LeafDemands
from gpufair.domain.fairshare_plan import FairSharePlan
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
    the division's columns the first time it is read (and kept)."""

    __slots__ = ("_built", "_single_type", "_summed", "_usage", "columns", "plan")

    def __init__(
        self,
        plan: FairSharePlan,
        columns: ShareColumns,
        usage: UsageInputs,
        single_type: str | None,
    ) -> None:
        self.plan = plan
        self.columns = columns
        self._summed = False
        self._usage = usage
        self._single_type = single_type
        self._built: dict[str, QueueShare] = {}

    def __getitem__(self, name: str) -> QueueShare:
        record = self._built.get(name)
        if record is None:
            i = self.plan.index[name]
            if not self._summed:
                self._sum_inner_demand()
            record = _explain(i, self.plan, self.columns, self._usage, self._single_type)
            self._built[name] = record
        return record

    def _sum_inner_demand(self) -> None:
        """Every queue's demand (a leaf's allocated + pending) and allocation by type: a leaf's
        from its demand row, an inner queue's its children's sums, children in name order, once
        for all records."""
        columns = self.columns
        allocated_col, demand_col = columns.allocated_by_type, columns.demand_by_type
        leaf_demands = columns.leaf_demands
        assert leaf_demands is not None
        for row, i in enumerate(self.plan.leaf_numbers.tolist()):
            allocated_col[i], demand_col[i] = leaf_demands.row_maps(row)
        for i in self.plan.inner_postorder:  # children before parents
            allocated: dict[str, float] = {}
            wanted: dict[str, float] = {}
            for child in self.plan.children[i] or ():
                child_demand = demand_col[child]
                assert child_demand is not None
                for type_name, gpus in allocated_col[child].items():
                    allocated[type_name] = allocated.get(type_name, 0.0) + gpus
                for type_name, gpus in child_demand.items():
                    wanted[type_name] = wanted.get(type_name, 0.0) + gpus
            allocated_col[i] = allocated
            demand_col[i] = wanted
        self._summed = True

    def __iter__(self) -> Iterator[str]:
        names = self.plan.names
        return (names[i] for i in self.plan.preorder)

    def __len__(self) -> int:
        return len(self.plan.names)

    def __contains__(self, name: object) -> bool:
        return name in self.plan.index


@dataclass(frozen=True, slots=True)
class FairShareResult:
    pool: str
    capacity_cu: float
    whole_gpu_unit_cu: float | None  # the rounding step in `whole_gpus` mode, else None
    shares: ShareRecords  # explain records by queue name, in tree pre-order, built on request

    @property
    def fair_share_cu(self) -> Mapping[str, float]:
        """Every queue's fair share in CU, without building explain records."""
        return self._by_name(self.shares.columns.fair_share_cu)

    @property
    def effective_weights(self) -> Mapping[str, float]:
        """What the next computation takes as `previous_effective_weights`: the effective
        weight of every queue that competed for over-quota capacity, in tree pre-order.

        A queue that did not compete (its allowed demand met by its guarantee, or its tier
        reached with nothing left) has none. Its record says 0, but that 0 was never its weight:
        were it remembered, the dead band would hold the queue at 0 when it competes again with
        a weight within the band of 0 (weight 1 against 300: 1/301), and it would get nothing
        while any other queue wanted more. A queue that competed and gave way entirely (P = 0)
        keeps its 0, which the band holds while its usage slips within the band (DESIGN §3.6).
        """
        names = self.shares.plan.names
        columns = self.shares.columns
        weight, competes = columns.effective_weight, columns.competes
        return {names[i]: weight[i] for i in self.shares.plan.preorder if competes[i]}

    @property
    def standing(self) -> Mapping[str, UsageStanding]:
        """Every queue's W' and U', what the cycle's gang entitlement rule reads."""
        names = self.shares.plan.names
        weight_share = self.shares.columns.weight_share
        usage_share = self.shares.columns.usage_share
        return {
            names[i]: UsageStanding(weight_share[i], usage_share[i])
            for i in self.shares.plan.preorder
        }

    def _by_name(self, column: list[float]) -> dict[str, float]:
        """One column as a map by queue name, in tree pre-order."""
        names = self.shares.plan.names
        return {names[i]: column[i] for i in self.shares.plan.preorder}

    @property
    def competing(self) -> frozenset[str]:
        """The queues that took part in the over-quota division."""
        return frozenset(compress(self.shares.plan.names, self.shares.columns.competes))

    @property
    def idle_cu(self) -> float:
        """Capacity no queue may use: the pool minus the top-level fair shares."""
        fair = self.shares.columns.fair_share_cu
        top = math.fsum(fair[i] for i, parent in enumerate(self.shares.plan.parents) if parent < 0)
        return max(0.0, self.capacity_cu - top)


NO_GPUS: Mapping[str, float] = MappingProxyType({})  # one read-only empty map, shared


class ShareColumns:
    """The division's working numbers, one list per quantity, indexed like the plan's queues
    (pre-order positions); the explain record of a queue is built from its entries on request.

    The leaves' demands (`leaf_demands`), every queue's allowed demand by type (`allowed_gpus`,
    a row per queue, a column per `FairSharePlan.type_names`, 0 where none) and in CU, and the
    per-type claims of the queues that can claim, are set by the demand pass
    (`fairshare_aggregate`) before anything reads them. Demand (allocated + pending) and
    allocation maps stay empty until an explain record sums them.
    """

    __slots__ = (
        "allocated_by_type",
        "allowed_cu",
        "allowed_gpus",
        "claims_by_type",
        "competes",
        "demand_by_type",
        "effective_weight",
        "fair_share_cu",
        "guaranteed_by_type",
        "guaranteed_cu",
        "leaf_demands",
        "over_quota_cu",
        "priority_weight",
        "satisfied",
        "usage_share",
        "weight_share",
    )

    def __init__(self, count: int) -> None:
        self.demand_by_type: list[Mapping[str, float] | None] = [None] * count
        self.allocated_by_type: list[Mapping[str, float]] = [NO_GPUS] * count
        self.leaf_demands: LeafDemands | None = None
        self.allowed_gpus: np.ndarray = np.zeros((count, 0))
        self.claims_by_type: list[Mapping[str, float]] = [NO_GPUS] * count
        self.allowed_cu: list[float] = [0.0] * count
        # Shared and empty until a per-type guarantee is granted (most queues have none).
        self.guaranteed_by_type: list[Mapping[str, float]] = [NO_GPUS] * count
        self.guaranteed_cu: list[float] = [0.0] * count
        self.over_quota_cu: list[float] = [0.0] * count
        self.fair_share_cu: list[float] = [0.0] * count
        self.satisfied: list[bool] = [False] * count
        self.competes: list[bool] = [False] * count
        self.weight_share: list[float] = [0.0] * count
        self.usage_share: list[float] = [0.0] * count
        self.priority_weight: list[float] = [0.0] * count
        self.effective_weight: list[float] = [0.0] * count


def _explain(
    i: int,
    plan: FairSharePlan,
    columns: ShareColumns,
    usage: UsageInputs,
    single_type: str | None,
) -> QueueShare:
    demand, allocated = columns.demand_by_type[i], columns.allocated_by_type[i]
    assert demand is not None  # summed by ShareRecords
    compute_weights = plan.compute_weights
    only_type = single_type
    if only_type is None:
        row = columns.allowed_gpus[i].tolist()
        held = [t for t, gpus in zip(plan.type_names, row, strict=True) if gpus > 0.0]
        if len(held) == 1:
            only_type = held[0]
    fair_share_cu = columns.fair_share_cu[i]
    fair_share_gpus_by_type: Mapping[str, float] = {}
    if only_type is not None:
        fair_share_gpus_by_type = {only_type: fair_share_cu / compute_weights[only_type]}
    name = plan.names[i]
    parent = None if plan.parents[i] < 0 else plan.names[plan.parents[i]]
    return QueueShare(
        queue=name,
        parent=parent,
        is_leaf=plan.children[i] is None,
        priority=plan.priorities[i],
        over_quota_weight=plan.over_quota_weights[i],
        created_at_s=plan.created_at_s[i],
        deserved_cu=plan.deserved_cu[i],
        limit_cu=plan.limit_cu[i],
        demand_cu=_cu(demand, compute_weights),
        allocated_cu=_cu(allocated, compute_weights),
        allowed_demand_cu=columns.allowed_cu[i],
        guaranteed_cu=columns.guaranteed_cu[i],
        competes_over_quota=columns.competes[i],
        weight_share=columns.weight_share[i],
        decayed_usage_cu_s=usage.usage_cu_s.get(name, 0.0),
        group_capacity_cu_s=usage.group_capacity_cu_s.get(parent, 0.0),
        usage_share=columns.usage_share[i],
        priority_weight=columns.priority_weight[i],
        effective_weight=columns.effective_weight[i],
        fair_share_cu=fair_share_cu,
        demand_gpus_by_type=MappingProxyType(demand),
        allocated_gpus_by_type=MappingProxyType(allocated),
        guaranteed_gpus_by_type=MappingProxyType(columns.guaranteed_by_type[i]),
        fair_share_gpus_by_type=MappingProxyType(fair_share_gpus_by_type),
    )


def _cu(gpus_by_type: Mapping[str, float], compute_weights: Mapping[str, float]) -> float:
    total = 0.0
    for type_name, gpus in gpus_by_type.items():
        total += gpus * compute_weights[type_name]
    return total
