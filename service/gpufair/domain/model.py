"""The cluster as gpufair sees it: plain, immutable values with units in their names.

Nothing here does I/O. The store, the API and the simulator all convert to and from these types,
so every rule in `domain/` is written once against them.

Units: compute units (CU) are the currency of fairness — one GPU of type t is
`compute_weight(t)` CU. Times are seconds (wall-clock instants are POSIX seconds as floats).
Memory is GiB for GPU memory and MiB for host memory; CPU is millicores.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TypeVar

from gpufair.domain.errors import NotFound
from gpufair.domain.record_fill import fill_class

K = TypeVar("K")
V = TypeVar("V")

DEFAULT_WINDOW_S = 7 * 24 * 3600.0
DEFAULT_RECOMPUTE_INTERVAL_S = 60.0
DEFAULT_DEAD_BAND = 0.01


def frozen_map(values: Mapping[K, V] | None = None) -> Mapping[K, V]:
    """A read-only copy, so frozen dataclasses really are immutable."""
    return MappingProxyType(dict(values or {}))


class WindowKind(enum.StrEnum):
    SLIDING = "sliding"  # the last `window_s` seconds, moving with the clock
    TUMBLING = "tumbling"  # fixed periods from an anchor; usage restarts at each boundary
    NONE = "none"  # all history counts (usually with a half-life)


class UsageBasis(enum.StrEnum):
    OVER_QUOTA = (
        "over_quota"  # only allocation above deserved, over the group's over-quota capacity
    )
    TOTAL = "total"  # the whole allocation, over the pool's whole capacity


class Division(enum.StrEnum):
    """Whose rules divide over-quota capacity (docs/kai-compatibility.md)."""

    GPUFAIR = "gpufair"  # weights fixed per tier, weight 0 best effort, limit ≥ deserved
    KAI = "kai"  # KAI-Scheduler's: weights recomputed every round, weight 0 gets no over-quota


class Rounding(enum.StrEnum):
    CONTINUOUS = "continuous"
    WHOLE_GPUS = "whole_gpus"


class PlacementStrategy(enum.StrEnum):
    BINPACK = "binpack"  # fullest node first: keeps whole nodes free for gangs
    SPREAD = "spread"  # emptiest node first


@dataclass(frozen=True, slots=True)
class PartitionProfile:
    """A MIG-style slice of one GPU, e.g. `1g.10gb` = 1/7 of an A100 with 10 GiB.

    `gpu_fraction` is its compute share (the CU it counts: `gpu_fraction × compute_weight`).
    Its geometry says where it may sit on a GPU: the GPU's memory is cut into slices numbered
    from 0 (8 on an A100 or H100), an instance covers `memory_slices` consecutive slices, and it
    may begin only at one of `starts`. Two instances on one GPU never share a slice. A profile
    without geometry (`memory_slices == 0`) is declared but cannot be asked for by a workload
    (see `domain/partition_geometry.py` for the A100 / H100 table).
    """

    name: str
    gpu_fraction: float
    memory_gib: float
    memory_slices: int = 0
    starts: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class GpuType:
    name: str
    memory_gib: float
    compute_weight: float  # CU per GPU of this type
    partition_profiles: tuple[PartitionProfile, ...] = ()


@dataclass(frozen=True, slots=True)
class FairSharePolicy:
    """How one node pool turns history into effective weights (DESIGN §3.3)."""

    window_kind: WindowKind = WindowKind.SLIDING
    window_s: float = DEFAULT_WINDOW_S  # sliding length, or tumbling period
    window_anchor_unix_s: float = 0.0  # tumbling only: an instant on a period boundary
    half_life_s: float | None = None  # None: no decay inside the window
    k: float = 1.0  # correction strength; 0 = classic fair share
    usage_basis: UsageBasis = UsageBasis.OVER_QUOTA
    recompute_interval_s: float = DEFAULT_RECOMPUTE_INTERVAL_S
    rounding: Rounding = Rounding.CONTINUOUS
    dead_band: float = DEFAULT_DEAD_BAND  # effective-weight changes below this are ignored
    # Division profile (issue 22): `kai` reproduces KAI-Scheduler's per-round weights, weight-0
    # rule, limits below the quota and tumbling-window boundary; see docs/kai-compatibility.md.
    division: Division = Division.GPUFAIR


@dataclass(frozen=True, slots=True)
class NodePool:
    name: str
    policy: FairSharePolicy = field(default_factory=FairSharePolicy)
    placement: PlacementStrategy = PlacementStrategy.BINPACK
    # A gang pending longer than this gets a reservation (DESIGN §4.1); None = never.
    gang_reservation_after_s: float | None = 600.0
    # Loans of idle capacity are called back after this many seconds: work of a queue above its
    # share that has run this long may be reclaimed before its `min_runtime_s`. None = no limit.
    # A queue's own `QueueQuota.max_borrow_s` overrides it.
    max_borrow_s: float | None = None
    # Topology levels, smallest domain first (node label keys, e.g. nvlink-domain, rack, zone):
    # a gang goes into the smallest domain that holds it (`domain/topology.py`).
    topology_levels: tuple[str, ...] = ()
    # Defragmentation (`domain/cycle_defrag.py`): at most this share of the pool's GPUs is moved
    # per hour to make room for a waiting gang; None = no moves.
    max_moved_share_per_hour: float | None = None
    # Gang entitlement (docs/GANG_ENTITLEMENT.md, `cycle_entitlement`): a gang of the most
    # under-served queue of its tier that has waited `gang_reservation_after_s` may be admitted
    # beyond its queue's fair share, so a gang larger than any share the formula can reach runs.
    # Off by default: it costs evictions where fair share already works (three-teams scenario).
    gang_entitlement: bool = False


@dataclass(frozen=True, slots=True)
class Node:
    name: str
    pool: str
    gpu_type: str
    gpu_count: int
    cpu_millicores: int
    memory_mib: int
    labels: Mapping[str, str] = field(default_factory=frozen_map)  # topology: rack, nvlink-domain…
    ready: bool = True


@dataclass(frozen=True, slots=True)
class QueueQuota:
    """One queue's terms in one node pool."""

    pool: str
    deserved_cu: float = 0.0
    # Guarantees for one GPU type, in GPUs of that type (DESIGN §3.5).
    deserved_gpus_by_type: Mapping[str, float] = field(default_factory=frozen_map)
    over_quota_weight: float = 1.0
    limit_cu: float | None = None  # None: unlimited
    limit_gpus_by_type: Mapping[str, float] = field(default_factory=frozen_map)
    priority: int = 0  # higher tiers are served first
    # The queue's own loan limit in this pool (see `NodePool.max_borrow_s`); None = the pool's.
    max_borrow_s: float | None = None


@dataclass(frozen=True, slots=True)
class Queue:
    """A node of the queue tree; leaves receive workloads."""

    name: str
    parent: str | None = None
    quotas: Mapping[str, QueueQuota] = field(default_factory=frozen_map)  # by pool name
    created_at_s: float = 0.0  # older queues win rounding ties

    def quota(self, pool: str) -> QueueQuota:
        """The queue's terms in `pool`; a queue without terms there is best effort."""
        return self.quotas.get(pool) or QueueQuota(pool=pool, over_quota_weight=0.0)


class BudgetPeriod(enum.StrEnum):
    DAY = "day"
    WEEK = "week"
    MONTH = "month"


@dataclass(frozen=True, slots=True)
class Budget:
    """A planned consumption for a queue: CU-hours per period (optionally in one pool)."""

    queue: str
    period: BudgetPeriod
    cu_hours: float
    pool: str | None = None  # None: all pools


@dataclass(frozen=True, slots=True)
class ClusterConfig:
    """The whole declared state, as `ApplyConfig` takes it."""

    gpu_types: tuple[GpuType, ...] = ()
    pools: tuple[NodePool, ...] = ()
    nodes: tuple[Node, ...] = ()
    queues: tuple[Queue, ...] = ()
    budgets: tuple[Budget, ...] = ()

    def pool(self, name: str) -> NodePool:
        """The pool called `name`; `NotFound` when there is none."""
        for pool in self.pools:
            if pool.name == name:
                return pool
        raise NotFound("pool", name)

    def leaf_queues(self) -> tuple[Queue, ...]:
        """The queues that receive workloads: those no other queue names as its parent, in the
        order of `queues`."""
        return leaf_queues(self.queues)


def leaf_queues(queues: Iterable[Queue]) -> tuple[Queue, ...]:
    """The queues of `queues` that are nobody's parent, in their given order: the one
    definition of a leaf (the tree in `domain/tree.py` agrees; it also checks the structure)."""
    queue_list = tuple(queues)
    parents = {q.parent for q in queue_list if q.parent}
    return tuple(q for q in queue_list if q.name not in parents)


@dataclass(frozen=True, slots=True)
class TopologyConstraint:
    """Keep a gang inside one domain of `level` (a node label key, e.g. `nvlink-domain`)."""

    level: str
    required: bool = False  # False: preferred, placement may fall back to a wider domain


@dataclass(frozen=True, slots=True)
class Workload:
    """A job from a batch system, identified by its stable `uid`."""

    uid: str
    queue: str
    pool: str
    pods: int
    gpus_per_pod: float  # fractions below 1 share one GPU
    submit_time_s: float
    min_pods: int | None = None  # gang minimum; None = all pods
    allowed_gpu_types: tuple[str, ...] = ()  # empty = any type
    min_gpu_memory_gib: float = 0.0
    cpu_millicores_per_pod: int = 0
    memory_mib_per_pod: int = 0
    topology: TopologyConstraint | None = None
    priority_class: int = 0  # inside one queue, higher first
    preemptible: bool = True
    min_runtime_s: float = 0.0  # may not be reclaimed before running this long
    # Each pod takes one instance of this partition profile (`gpus_per_pod` is its fraction,
    # `domain/partitions.py`); "" = whole GPUs or a plain share.
    partition_profile: str = ""
    # An amount of compute instead of a GPU count: placement picks the GPU type and how many
    # one-GPU pods (`domain/cu_request.py`); 0 = `pods × gpus_per_pod` as given.
    compute_units: float = 0.0
    # A compute-unit request that may take GPUs of several accepted types at once, all inside
    # one domain of `topology.level` (`domain/cycle_cu_mix.py`), when no single type has room.
    mixed_gpu_types: bool = False
    # Each pod on a node of its own (a batch system's multi-node job, e.g. Slurm's --nodes=N):
    # placement puts at most one of its pods on any node (`placement_fit.fit_on`).
    pods_on_distinct_nodes: bool = False

    @property
    def gang_min_pods(self) -> int:
        return self.pods if self.min_pods is None else self.min_pods

    @property
    def total_gpus(self) -> float:
        return self.pods * self.gpus_per_pod


@dataclass(frozen=True, slots=True)
class PodBinding:
    """One pod on one node: whole GPU indices, or a fraction of one GPU."""

    pod_index: int
    node: str
    gpu_indices: tuple[int, ...]
    gpu_fraction: float = 1.0  # < 1 for shared GPUs: the share of gpu_indices[0]
    # For a partition (`Workload.partition_profile`): the first memory slice of its instance on
    # gpu_indices[0]; None otherwise, or when the batch system did not say.
    partition_start: int | None = None


_PodBindingFill = fill_class(
    PodBinding, ("pod_index", "node", "gpu_indices", "gpu_fraction", "partition_start")
)


def pod_binding(
    pod_index: int,
    node: str,
    gpu_indices: tuple[int, ...],
    gpu_fraction: float,
    partition_start: int | None,
) -> PodBinding:
    """`PodBinding(pod_index, node, gpu_indices, gpu_fraction, partition_start)`, the same
    value, built in about a third of the time: filled as its plain twin and then made a
    `PodBinding` (`record_fill`), not through the frozen class's `__init__` (one
    `object.__setattr__` per field). The cycle makes one per pod it binds or holds."""
    record = _PodBindingFill()
    record.pod_index = pod_index
    record.node = node
    record.gpu_indices = gpu_indices
    record.gpu_fraction = gpu_fraction
    record.partition_start = partition_start
    record.__class__ = PodBinding
    binding: PodBinding = record
    return binding


@dataclass(frozen=True, slots=True)
class Allocation:
    """A workload's pods bound to nodes, from `started_at_s` until it stops."""

    workload: Workload
    bindings: tuple[PodBinding, ...]
    started_at_s: float
    gpu_type: str
