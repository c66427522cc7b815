"""What a placement is asked for: one pod's shape (`PodShape`), the gang of one GPU type to place
(`Ask`), the nodes it may not use (`Exclusion`), and which GPU types a workload may use, cheapest
first (`adequate_types`: the filters and type order of rules 1 and 2 of `placement`).

`signature` says when two workloads are the same placement problem (what the cycle memoises
placement failures by).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Set
from dataclasses import dataclass, field
from operator import attrgetter
from typing import NamedTuple

from gpufair.domain import cu_request, partitions
from gpufair.domain.capacity import EPS
from gpufair.domain.model import GpuType, TopologyConstraint, Workload


@dataclass(frozen=True, slots=True)
class PodShape:
    """What one pod of a workload needs; identical shapes share failed-placement memos."""

    gpus_per_pod: float
    cpu_millicores: int
    memory_mib: int
    profile: str = ""  # a partition profile: one instance per pod (`domain/partitions.py`)
    one_per_node: bool = False  # `Workload.pods_on_distinct_nodes`: at most one pod a node

    # Derived once (placement reads them in its innermost loops): GPUs per pod for whole-GPU
    # pods (0 for shared or GPU-less pods), and whether a pod takes part of one GPU.
    whole_gpus: int = field(init=False, compare=False, repr=False)
    shares_gpu: bool = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        gpus = self.gpus_per_pod
        object.__setattr__(self, "whole_gpus", round(gpus) if gpus >= 1.0 else 0)
        object.__setattr__(self, "shares_gpu", 0.0 < gpus < 1.0)

    @staticmethod
    def of(workload: Workload) -> PodShape:
        return PodShape(
            workload.gpus_per_pod,
            workload.cpu_millicores_per_pod,
            workload.memory_mib_per_pod,
            workload.partition_profile,
            workload.pods_on_distinct_nodes,
        )


class Ask(NamedTuple):
    """A placement request: `pods_min` to `pods_max` pods of `shape`, all on `gpu_type`. A named
    tuple: the cycle makes one per placement it tries."""

    shape: PodShape
    gpu_type: str
    pods_min: int
    pods_max: int
    topology: TopologyConstraint | None = None
    pool_levels: tuple[str, ...] = ()  # the pool's topology levels, smallest domain first


@dataclass(frozen=True, slots=True)
class Exclusion:
    """Nodes a placement may not use.

    `held` maps a node to the workload it is held for (capacity freed by evictions made for that
    workload); only `owner` may use it. `gang_held` nodes are promised to a long-waiting gang and
    take no beyond-fair-share work; `beyond_share` says whether this placement is such work.
    """

    held: Mapping[int, str] = field(default_factory=dict)
    gang_held: Set[int] = frozenset()
    beyond_share: bool = False
    owner: str | None = None

    def blocks(self, node: int) -> bool:
        holder = self.held.get(node)
        if holder is not None and holder != self.owner:
            return True
        return self.beyond_share and node in self.gang_held

    def blocks_any(self) -> bool:
        """False when `blocks` is false for every node now, so hot loops may skip it; True
        means it may be true for some (held nodes, even if only for the owner)."""
        return bool(self.held) or (self.beyond_share and bool(self.gang_held))


def gpu_memory_per_pod_gib(gpu_type: GpuType, gpus_per_pod: float) -> float:
    """The GPU memory one pod gets on a GPU of `gpu_type` (rule 1 of `placement`)."""
    return gpu_type.memory_gib * gpus_per_pod if gpus_per_pod < 1.0 else gpu_type.memory_gib


def type_order_key(gpu_type: GpuType) -> tuple[float, float, str]:
    """Cheapest first: lowest compute weight, then least memory, then name."""
    return (gpu_type.compute_weight, gpu_type.memory_gib, gpu_type.name)


def adequate_types(
    workload: Workload, gpu_types: Mapping[str, GpuType], present: Collection[str]
) -> tuple[str, ...]:
    """The GPU types present in the pool that pass the type and GPU-memory filters, cheapest
    first (for a compute-unit request: in the order of `cu_request.options`)."""
    if workload.compute_units > 0.0:
        return tuple(o.gpu_type for o in cu_request.options(workload, gpu_types, present))
    if workload.partition_profile:
        offered = partitions.adequate_partition_types(workload, gpu_types, present)
        return tuple(gpu_type.name for gpu_type in sorted(offered, key=type_order_key))
    allowed = workload.allowed_gpu_types or tuple(present)
    found = [
        gpu_types[name]
        for name in set(allowed)
        if name in present
        and name in gpu_types
        and (
            workload.gpus_per_pod <= 0.0
            or gpu_memory_per_pod_gib(gpu_types[name], workload.gpus_per_pod)
            >= workload.min_gpu_memory_gib - EPS
        )
    ]
    found.sort(key=type_order_key)
    return tuple(gpu_type.name for gpu_type in found)


# What makes two workloads the same placement problem: everything placement and admission read
# of a workload but its identity, queue, times and priority (a compute-unit request's amount and
# mix are resolved before placement and read apart). One C call builds the tuple.
signature = attrgetter(
    "pods",
    "min_pods",
    "gpus_per_pod",
    "allowed_gpu_types",
    "min_gpu_memory_gib",
    "cpu_millicores_per_pod",
    "memory_mib_per_pod",
    "topology",
    "partition_profile",
    "pods_on_distinct_nodes",
)
