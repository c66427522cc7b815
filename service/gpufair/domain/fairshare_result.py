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

    __slots__ = ("_built", "_compute_weights", "_single_type", "_usage", "states")

    def __init__(
        self,
        states: dict[str, QueueState],
        usage: UsageInputs,
        compute_weights: dict[str, float],
        single_type: str | None,
    ) -> None:
        self.states = states  # pre-order
        self._usage = usage
        self._compute_weights = compute_weights
        self._single_type = single_type
        self._built: dict[str, QueueShare] = {}

    def __getitem__(self, name: str) -> QueueShare:
        record = self._built.get(name)
        if record is None:
            record = _explain(
                self.states[name], self._usage, self._compute_weights, self._single_type
            )
            self._built[name] = record
        return record

    def __iter__(self) -> Iterator[str]:
        return iter(self.states)

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
        return {name: state.fair_share_cu for name, state in self.shares.states.items()}

    @property
    def effective_weights(self) -> Mapping[str, float]:
        """What the next computation takes as `previous_effective_weights`."""
        return {name: state.effective_weight for name, state in self.shares.states.items()}

    @property
    def competing(self) -> frozenset[str]:
        """The queues that took part in the over-quota division."""
        return frozenset(name for name, state in self.shares.states.items() if state.competes)

    @property
    def idle_cu(self) -> float:
        """Capacity no queue may use: the pool minus the top-level fair shares."""
        top = math.fsum(s.fair_share_cu for s in self.shares.states.values() if s.parent is None)
        return max(0.0, self.capacity_cu - top)


class QueueState:
    """The engine's working record of one queue; the explain record is built from it on request."""

    __slots__ = (
        "allocated_by_type",
        "allocated_cu",
        "allowed_by_type",
        "allowed_cu",
        "claims_by_type",
        "competes",
        "created_at_s",
        "demand_by_type",
        "demand_cu",
        "deserved_by_type",
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
        "priority",
        "priority_weight",
        "quota",
        "satisfied",
        "usage_share",
        "weight_share",
    )

    def __init__(self, queue: Queue, pool: str, is_leaf: bool, compute_weights: dict[str, float]):
        quota = queue.quota(pool)
        self.quota = quota
        self.name = queue.name
        self.parent = queue.parent
        self.is_leaf = is_leaf
        self.created_at_s = queue.created_at_s
        self.priority = quota.priority
        self.over_quota_weight = quota.over_quota_weight
        self.deserved_cu = deserved_cu_with_types(quota, compute_weights)
        self.deserved_by_type: Mapping[str, float] = quota.deserved_gpus_by_type
        self.limit_cu = quota.limit_cu
        # Demand, allocation, allowed demand and per-type claims (the `*_by_type` maps and their
        # CU) are set by the demand aggregation, for every queue, before anything reads them.
        self.demand_by_type: dict[str, float]
        self.allocated_by_type: dict[str, float]
        self.allowed_by_type: dict[str, float]
        self.claims_by_type: dict[str, float]
        self.demand_cu: float
        self.allocated_cu: float
        self.allowed_cu: float
        self.guaranteed_by_type: dict[str, float] = {}
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
        demand_cu=state.demand_cu,
        allocated_cu=state.allocated_cu,
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
        demand_gpus_by_type=MappingProxyType(state.demand_by_type),
        allocated_gpus_by_type=MappingProxyType(state.allocated_by_type),
        guaranteed_gpus_by_type=MappingProxyType(state.guaranteed_by_type),
        fair_share_gpus_by_type=MappingProxyType(fair_share_gpus_by_type),
    )
