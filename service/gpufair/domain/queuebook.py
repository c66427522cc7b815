"""One leaf queue's running account during a cycle: what it holds against what it may hold.

`allocated_cu` is the queue's *effective* allocation: running work, minus evictions in flight
(they are going away), plus what this cycle binds, minus what it evicts, plus capacity held for its
workloads that wait for evicted capacity. Every admission and reclaim rule reads this number, so a
queue is never credited twice for the same capacity nor charged for capacity it is losing.

Admission (DESIGN §4.1), per GPU type the workload might land on, as a maximum pod count:

- `limit_cu` and `limit_gpus_by_type` are hard caps, the queue's own and those of every inner
  queue above it (DESIGN §2: every node of the tree has its limit): a department's limit binds
  its teams together, in the work-conserving pass too. Each inner queue with a limit in the pool
  has one `LimitBook`, shared by the books of its leaves, which keep it current;
- non-preemptible work stays within `deserved_cu` (it can never be taken back) and within the
  fair share; `deserved_cu` is the quota's CU guarantee raised to cover its per-type guarantees
  (`policy.deserved_cu_with_types`), the same number the fair share starts from;
- other work stays within `fair_share_cu` in the first pass; the work-conserving pass lifts that.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from gpufair.domain.capacity import EPS
from gpufair.domain.model import Queue
from gpufair.domain.policy import deserved_cu_with_types
from gpufair.domain.snapshot import PendingCode, QueueSummary

# "No cap": more pods than any workload has.
_NO_CAP = 1 << 30
# `QueueBook.max_pods` of an `unlimited` book for preemptible work beyond its share.
UNCAPPED: tuple[int, PendingCode | None] = (_NO_CAP, None)
# Below any configured priority tier: the eviction rank of best-effort queues.
_BEST_EFFORT = 1 << 20


class LimitBook:
    """What the leaves under one inner queue hold together, against the inner queue's limits."""

    __slots__ = ("allocated_cu", "gpus_by_type", "limit_cu", "limit_gpus_by_type", "name")

    def __init__(self, queue: Queue, pool: str) -> None:
        quota = queue.quota(pool)
        self.name = queue.name
        self.limit_cu = quota.limit_cu
        self.limit_gpus_by_type = dict(quota.limit_gpus_by_type)
        self.allocated_cu = 0.0
        self.gpus_by_type: dict[str, float] = {}

    @staticmethod
    def has_limits(queue: Queue, pool: str) -> bool:
        quota = queue.quota(pool)
        return quota.limit_cu is not None or bool(quota.limit_gpus_by_type)

    def pods_within(self, cu_per_pod: float, gpus_per_pod: float, gpu_type: str) -> int:
        """The most pods of this size the leaves below may still add on `gpu_type`."""
        best = _NO_CAP
        if cu_per_pod > EPS and self.limit_cu is not None:
            best = math.floor((self.limit_cu - self.allocated_cu + EPS) / cu_per_pod)
        type_limit = self.limit_gpus_by_type.get(gpu_type)
        if type_limit is not None and gpus_per_pod > EPS:
            room = type_limit - self.gpus_by_type.get(gpu_type, 0.0)
            best = min(best, math.floor((room + EPS) / gpus_per_pod))
        return best


class QueueBook:
    __slots__ = (
        "allocated_cu",
        "allocated_cu_before",
        "ancestors",
        "answers",
        "bound_cu",
        "claimed_cu",
        "created_at_s",
        "deserved_cu",
        "deserved_gpus_by_type",
        "evicted_cu",
        "evicting_cu",
        "fair_share_cu",
        "gpus_by_type",
        "limit_cu",
        "limit_gpus_by_type",
        "max_borrow_s",
        "name",
        "nonpreemptible_cu",
        "reserved_cu",
        "tier",
        "unlimited",
        "victim_rank",
    )

    def reset(
        self,
        queue: Queue,
        pool: str,
        fair_share_cu: float,
        compute_weights: Mapping[str, float],
        ancestors: tuple[LimitBook, ...] = (),
        max_borrow_s: float | None = None,
    ) -> None:
        """Every field as a new book of these arguments has it: a cycle with carried records
        makes the last cycle's book of a queue new again this way, so the queue's carried
        items keep theirs (`CycleState`, `cycle_load_pending._fill`)."""
        quota = queue.quota(pool)
        self.name = queue.name
        self.tier = quota.priority
        # Where the queue's work stands in the eviction order (`victim_search.Victim.tier`): its
        # tier, and below every tier when it is best effort (weight 0, DESIGN §3.3: reclaimed
        # first).
        self.victim_rank = quota.priority - (_BEST_EFFORT if quota.over_quota_weight <= 0 else 0)
        # Per-type guarantees count at their CU, as in the fair share: "4 A100" is 40 CU.
        self.deserved_cu = deserved_cu_with_types(quota, compute_weights)
        self.deserved_gpus_by_type = dict(quota.deserved_gpus_by_type)
        self.limit_cu = quota.limit_cu
        self.limit_gpus_by_type = dict(quota.limit_gpus_by_type)
        self.fair_share_cu = fair_share_cu
        self.created_at_s = queue.created_at_s
        self.allocated_cu = 0.0
        self.nonpreemptible_cu = 0.0
        self.gpus_by_type: dict[str, float] = {}
        self.allocated_cu_before = 0.0
        self.bound_cu = 0.0
        self.claimed_cu = 0.0  # bound or held this cycle on claims (`cycle_claims`)
        self.evicted_cu = 0.0
        self.evicting_cu = 0.0
        self.reserved_cu = 0.0
        self.ancestors = ancestors  # inner queues above with limits in the pool, nearest first
        self.max_borrow_s = max_borrow_s  # `policy.max_borrow_s`: when loans are called back
        # `max_pods` answers since the book last changed, by (GPUs per pod, GPU type,
        # preemptible, within share) (`CycleState.max_pods`): everything they read changes only
        # in `add`, which drops them, or in the ancestors, whose books are never memoised.
        self.answers: dict[tuple[float, str, bool, bool], tuple[int, PendingCode | None]] | None
        self.answers = None
        # No limit of its own nor above it: `max_pods` of preemptible work beyond the share
        # reads nothing and caps nothing (`UNCAPPED`).
        self.unlimited = self.limit_cu is None and not self.limit_gpus_by_type and not ancestors

    __init__ = reset  # a new book is one reset with its arguments

    def add(self, cu: float, gpus: float, gpu_type: str, preemptible: bool) -> None:
        self.answers = None
        self.allocated_cu += cu
        if not preemptible:
            self.nonpreemptible_cu += cu
        by_type = self.gpus_by_type
        by_type[gpu_type] = by_type.get(gpu_type, 0.0) + gpus
        if self.ancestors:
            for ancestor in self.ancestors:
                ancestor.allocated_cu += cu
                ancestor.gpus_by_type[gpu_type] = ancestor.gpus_by_type.get(gpu_type, 0.0) + gpus

    def remove(self, cu: float, gpus: float, gpu_type: str, preemptible: bool) -> None:
        """`add` of the negated amounts, written out (one call, not two): `x - y` is
        `x + -y` exactly, so the sums are those `add(-cu, -gpus, ...)` makes."""
        self.answers = None
        self.allocated_cu -= cu
        if not preemptible:
            self.nonpreemptible_cu -= cu
        by_type = self.gpus_by_type
        by_type[gpu_type] = by_type.get(gpu_type, 0.0) - gpus
        if self.ancestors:
            for ancestor in self.ancestors:
                ancestor.allocated_cu -= cu
                ancestor.gpus_by_type[gpu_type] = ancestor.gpus_by_type.get(gpu_type, 0.0) - gpus

    def never_caps(self, preemptible: bool) -> bool:
        """Whether no limit can cap such work beyond the share: preemptible work of a book
        without limits, its own or above it (`max_pods` beyond the share is then `UNCAPPED`).
        The rule's one statement: `CycleState.max_pods` and the phases that skip asking it
        (claims, allocate beyond the share, preemption) read it here."""
        return preemptible and self.unlimited

    def ratio(self) -> float:
        """Allocated over fair share: the queue order key; a queue without a share sorts last."""
        if self.fair_share_cu <= EPS:
            return math.inf
        return self.allocated_cu / self.fair_share_cu

    def headroom_cu(self) -> float:
        return self.fair_share_cu - self.allocated_cu

    def surplus_cu(self) -> float:
        """How far above max(deserved, fair share) the queue is: what reclaim may take. What
        its claims took this cycle does not count: capacity freed for the queue's workload does
        not make the queue's other work a victim in the same cycle."""
        return self.allocated_cu - self.claimed_cu - max(self.deserved_cu, self.fair_share_cu)

    def gpus_above_type_guarantee(self, gpu_type: str) -> float:
        guarantee = self.deserved_gpus_by_type.get(gpu_type)
        if guarantee is None:
            return math.inf
        return self.gpus_by_type.get(gpu_type, 0.0) - guarantee

    def max_pods(
        self,
        cu_per_pod: float,
        gpus_per_pod: float,
        gpu_type: str,
        preemptible: bool,
        within_share: bool,
    ) -> tuple[int, PendingCode | None]:
        """The most pods of this size the queue may add on `gpu_type`, and the first rule that
        caps it (None when nothing does). Hot: called for every workload tried."""
        best = _NO_CAP
        code: PendingCode | None = None
        if cu_per_pod > EPS and self.limit_cu is not None:
            pods = math.floor((self.limit_cu - self.allocated_cu + EPS) / cu_per_pod)
            if pods < best:
                best, code = pods, PendingCode.QUEUE_LIMIT
        if self.limit_gpus_by_type and gpus_per_pod > EPS:
            type_limit = self.limit_gpus_by_type.get(gpu_type)
            if type_limit is not None:
                room = type_limit - self.gpus_by_type.get(gpu_type, 0.0)
                pods = math.floor((room + EPS) / gpus_per_pod)
                if pods < best:
                    best, code = pods, PendingCode.QUEUE_LIMIT
        for ancestor in self.ancestors:
            pods = ancestor.pods_within(cu_per_pod, gpus_per_pod, gpu_type)
            if pods < best:
                best, code = pods, PendingCode.QUEUE_LIMIT
        if cu_per_pod > EPS:
            if not preemptible:
                room = self.deserved_cu - self.nonpreemptible_cu
                pods = math.floor((room + EPS) / cu_per_pod)
                if pods < best:
                    best, code = pods, PendingCode.NON_PREEMPTIBLE_OVER_DESERVED
            if within_share or not preemptible:
                room = self.fair_share_cu - self.allocated_cu
                pods = math.floor((room + EPS) / cu_per_pod)
                if pods < best:
                    best, code = pods, PendingCode.OVER_FAIR_SHARE
        return max(best, 0), code

    def limit_reached(self, needed_cu: float) -> LimitBook | None:
        """The nearest inner queue whose CU limit `needed_cu` more would pass, if any (for the
        pending message; per-type limits are named by the caller's type-free sentence)."""
        for ancestor in self.ancestors:
            if ancestor.limit_cu is not None and (
                ancestor.allocated_cu + needed_cu > ancestor.limit_cu + EPS
            ):
                return ancestor
        return None

    def summary(self) -> QueueSummary:
        return QueueSummary(
            queue=self.name,
            priority=self.tier,
            deserved_cu=self.deserved_cu,
            fair_share_cu=self.fair_share_cu,
            allocated_cu_before=self.allocated_cu_before,
            bound_cu=self.bound_cu,
            evicted_cu=self.evicted_cu,
            evicting_cu=self.evicting_cu,
            reserved_cu=self.reserved_cu,
        )
