"""What one scheduling cycle takes and what it returns (DESIGN §4).

**Input** — a `CycleSnapshot` of one node pool at one instant:

- `nodes`: the pool's nodes; nodes of other pools and nodes not ready are ignored.
- `gpu_types`, `queues` (the leaf queues: their `QueueQuota` in this pool gives deserved CU,
  per-type guarantees, limits and the priority tier; the service resolves any inheritance down the
  tree before building the snapshot), and `fair_share_cu` per leaf queue, computed elsewhere
  (`domain/fairshare`); a queue missing from it has a fair share of 0 and gets only capacity
  nobody within their share can use.
- `inner_queues`: the inner queues of the tree (departments), each leaf naming its parent: their
  limits in the pool (`limit_cu`, `limit_gpus_by_type`) bind the leaves below them together.
  Empty: only the leaves' own limits apply.
- `running`: allocations as the batch system reported them. Free capacity is the nodes minus these.
- `pending`: workloads waiting in this pool.
- `evicting`: evictions decided earlier whose workloads have not stopped yet (see below).
- `now_s`: the instant the cycle decides at; it is the only clock the cycle reads.

**Output** — a `CycleResult`: `binds`, `evicts`, a `PendingReason` for every pending workload
not bound, the `reservations` in force, and a `QueueSummary` per queue.

**Evictions take time.** An evicted workload keeps its GPUs until the batch system reports it
stopped, so a workload that reclaim (or preempt) evicts for is *not* bound in the same cycle: it
stays pending with `WAITING_FOR_EVICTED_CAPACITY` and the GPUs (with their CPU and memory) its
planned placement uses are held for it (`ReservationKind.EVICTED_CAPACITY`, `Reservation.held`):
no other workload may use them. Only those are held: the rest of a node stays free for others,
so a second workload may reclaim the next victim on the same node in the same cycle. The service
records each `EvictDecision` and passes it back as an `EvictionInFlight` (victim → beneficiary)
in every later snapshot while the victim is still running. Each cycle then re-derives the hold,
statelessly: it plans the beneficiary on free capacity plus its victims' capacity, holds those
GPUs, and binds the beneficiary as soon as it fits on free capacity alone. In-flight victims are
never chosen again, count as gone from their queue's allocation, and still occupy their GPUs, so
nothing is ever oversubscribed. If the beneficiary is gone (bound, cancelled) the entry only marks
the victim as leaving. The service passes the entry once more in the first cycle after the victim
stopped (it is then not in `running`): a standing claim, served first on the freed capacity
whatever the beneficiary's share has become since (`cycle_claims`).

**Moves.** An `EvictDecision` with reason `DEFRAGMENT` carries where the workload goes
(`move_to`, `move_gpu_type`; `cycle_defrag`). The service passes it back as an
`EvictionInFlight` with the same `move_to`: while the victim runs, those GPUs are held for it;
in the first cycle after it stopped (it is pending again), it binds there before anything else.
`moved_gpus_last_hour` is what the pool's moves took in the hour before `now_s`: the cycle moves
no more than `max_moved_share_per_hour` of the pool's GPUs minus that.

**Long-waiting gangs.** A workload within its queue's fair share that has waited at least the
pool's `gang_reservation_after_s` and still does not fit gets `ReservationKind.GANG_WAIT` nodes
(one such workload per queue, the first in queue order): they keep taking work within fair share
but no more beyond-fair-share work, so small jobs cannot keep refilling the hole it needs.

**Gang entitlement.** `standing` carries each leaf queue's W' and U' from the fair-share
computation the shares came from; with the pool's `gang_entitlement`, a long-waiting gang of the
most under-served queue of its tier that no reachable share can hold is admitted beyond its
queue's share (`cycle_entitlement`), its evictions marked `EvictReason.ENTITLEMENT`.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field

from gpufair.domain.model import (
    Allocation,
    GpuType,
    Node,
    NodePool,
    PodBinding,
    Queue,
    Workload,
    frozen_map,
)


@dataclass(frozen=True, slots=True)
class EvictionInFlight:
    """A workload told to stop that still holds its capacity, and whom it was evicted for."""

    victim_uid: str
    beneficiary_uid: str | None = None
    # A move (defragmentation): where the victim goes once it has stopped. While it still runs
    # these GPUs are held for it; in the first cycle after it stopped it binds there first.
    move_to: tuple[PodBinding, ...] = ()
    move_gpu_type: str = ""


@dataclass(frozen=True, slots=True)
class UsageStanding:
    """A queue's place in its group's time-based fair share: `weight_share` W' (its configured
    over-quota weight, normalised) and `usage_share` U' (its decayed usage over the decayed
    capacity it competed for), both fractions of what the group divides."""

    weight_share: float
    usage_share: float


@dataclass(frozen=True, slots=True)
class CycleSnapshot:
    pool: NodePool
    nodes: tuple[Node, ...]
    gpu_types: tuple[GpuType, ...]
    queues: tuple[Queue, ...]
    fair_share_cu: Mapping[str, float]
    running: tuple[Allocation, ...]
    pending: tuple[Workload, ...]
    now_s: float
    evicting: tuple[EvictionInFlight, ...] = ()
    inner_queues: tuple[Queue, ...] = ()
    # GPUs moved by defragmentation in the hour before `now_s` (the pool's move budget).
    moved_gpus_last_hour: float = 0.0
    # Per leaf queue, W' and U' of the fair share these shares came from (`fairshare.QueueShare`):
    # what the gang entitlement rule reads (`cycle_entitlement`). Missing: the rule stays off
    # for that queue.
    standing: Mapping[str, UsageStanding] = field(default_factory=dict)


class PendingCode(enum.StrEnum):
    OVER_FAIR_SHARE = "over_fair_share"  # beyond the queue's share, and no spare capacity fits
    NO_CAPACITY = "no_capacity"  # within share, but nothing fits and reclaim cannot free enough
    WAITING_FOR_EVICTED_CAPACITY = "waiting_for_evicted_capacity"
    QUEUE_LIMIT = "queue_limit"  # the queue's limit (CU or per GPU type) would be exceeded
    NON_PREEMPTIBLE_OVER_DESERVED = "non_preemptible_over_deserved"
    NEVER_FITS = "never_fits"  # the pool could not hold it even empty
    UNKNOWN_QUEUE = "unknown_queue"
    OTHER_POOL = "other_pool"
    # Set by the service, not the cycle: the workload stopped being pending while it was decided.
    CHANGED_DURING_CYCLE = "changed_during_cycle"
    # Set by the service: withdrawn, the batch system started other work on its GPUs meanwhile
    # (domain/overlap.py).
    GPUS_TAKEN_DURING_CYCLE = "gpus_taken_during_cycle"


class EvictReason(enum.StrEnum):
    RECLAIM = "reclaim"  # for a queue below its fair share, from a queue above its own
    PREEMPT = "preempt"  # for higher-priority work of the same queue
    DEFRAGMENT = "defragment"  # a move: re-placed elsewhere at once, to make room for a gang
    # for a gang of the most under-served queue of its tier, beyond that queue's fair share
    # (`cycle_entitlement`)
    ENTITLEMENT = "entitlement"


class ReservationKind(enum.StrEnum):
    EVICTED_CAPACITY = "evicted_capacity"  # held for the workload evictions were made for
    GANG_WAIT = "gang_wait"  # takes no new beyond-fair-share work
    MOVE_TARGET = "move_target"  # held for a moved workload until it stops where it was


@dataclass(frozen=True, slots=True)
class BindDecision:
    workload_uid: str
    queue: str
    gpu_type: str
    bindings: tuple[PodBinding, ...]
    cu: float
    # Bound with capacity nobody within their share could use: the first to be reclaimed.
    over_fair_share: bool
    # A compute-unit request bound to a mix of types (`cycle_cu_mix`): GPUs per type; `gpu_type`
    # is the one giving the most CU. Empty for all other binds (all on `gpu_type`).
    gpus_by_type: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class EvictDecision:
    workload_uid: str
    queue: str
    reason: EvictReason
    message: str
    beneficiary_uid: str  # the workload the capacity is freed for
    cu: float
    # DEFRAGMENT: where the workload goes, decided with the eviction (never left pending).
    move_to: tuple[PodBinding, ...] = ()
    move_gpu_type: str = ""


@dataclass(frozen=True, slots=True)
class PendingReason:
    code: PendingCode
    message: str


@dataclass(frozen=True, slots=True)
class Reservation:
    workload_uid: str
    kind: ReservationKind
    gpu_type: str
    nodes: tuple[str, ...]
    # EVICTED_CAPACITY: the GPUs held, as the pods would be bound once the victims stop. Only
    # these are held; the rest of each node stays free for others. GANG_WAIT: empty.
    held: tuple[PodBinding, ...] = ()


@dataclass(frozen=True, slots=True)
class QueueSummary:
    """One queue's CU through the cycle. `reserved_cu` is held for its waiting workloads."""

    queue: str
    priority: int
    deserved_cu: float
    fair_share_cu: float
    allocated_cu_before: float  # everything running, in-flight evictions included
    bound_cu: float
    evicted_cu: float  # decided this cycle
    evicting_cu: float  # decided earlier, still stopping
    reserved_cu: float

    @property
    def allocated_cu_after(self) -> float:
        """What the queue holds once this cycle's binds start and all evictions complete."""
        return self.allocated_cu_before + self.bound_cu - self.evicted_cu - self.evicting_cu


@dataclass(frozen=True, slots=True)
class CycleResult:
    binds: tuple[BindDecision, ...] = ()
    evicts: tuple[EvictDecision, ...] = ()
    pending: Mapping[str, PendingReason] = field(default_factory=frozen_map)
    reservations: tuple[Reservation, ...] = ()
    queues: Mapping[str, QueueSummary] = field(default_factory=frozen_map)
