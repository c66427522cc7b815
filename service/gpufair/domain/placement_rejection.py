"""Why a workload could never run in a pool, even empty (`never_fits`; `rejection_in` against a
prepared `PoolRoom`): a malformed shape, a type or a GPU memory the pool lacks, a pod bigger than
any node, a gang no GPU type or topology domain holds, a compute-unit request none of its options
(nor a mix of types, `cu_request.mix`) satisfies. The answer names the workload field at fault.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from gpufair.domain import cu_request, partitions
from gpufair.domain.capacity import EPS, Capacity, NodeState
from gpufair.domain.model import GpuType, Node, Workload
from gpufair.domain.partition_geometry import geometries
from gpufair.domain.placement_ask import PodShape, adequate_types, gpu_memory_per_pod_gib
from gpufair.domain.placement_domain import PoolRoom
from gpufair.domain.placement_fit import pods_fit_empty


@dataclass(frozen=True, slots=True)
class FitRejection:
    """Why a workload can never fit a pool: the offending workload field and a sentence."""

    field: str
    message: str


def never_fits(
    workload: Workload, nodes: Iterable[Node], gpu_types: Iterable[GpuType]
) -> FitRejection | None:
    """Why `workload` could not run in a pool of `nodes` even if the pool were empty, or None.

    Submit-time validation: more GPUs than the pool has of one adequate type, a type the pool
    lacks, more GPU memory than its cards carry, a pod bigger than any node, a gang no topology
    domain holds. Pass every node of the pool, ready or not: they are its hardware.
    """
    by_name = {gpu_type.name: gpu_type for gpu_type in gpu_types}
    return rejection_in(workload, by_name, PoolRoom(Capacity(nodes, geometries(by_name.values()))))


def rejection_in(
    workload: Workload, gpu_types: Mapping[str, GpuType], pool: PoolRoom
) -> FitRejection | None:
    """`never_fits` against a prepared `PoolRoom` (the cycle checks many workloads)."""
    if workload.compute_units > 0.0:
        return _cu_rejection(workload, gpu_types, pool)
    rejection = _shape_rejection(workload)
    if rejection is not None:
        return rejection
    capacity = pool.capacity
    present = sorted(capacity.by_type)
    if workload.partition_profile and not adequate_types(workload, gpu_types, present):
        offered = sorted(partitions.offering_types(workload, gpu_types))
        return FitRejection(
            "partition_profile",
            f"no GPU type of this pool offers partition profile {workload.partition_profile!r}"
            + (f" with {workload.min_gpu_memory_gib:g} GiB" if workload.min_gpu_memory_gib else "")
            + (f" (offered by {', '.join(offered)})" if offered else ""),
        )
    if workload.allowed_gpu_types and not set(workload.allowed_gpu_types) & set(present):
        return FitRejection(
            "allowed_gpu_types",
            f"the pool has no GPU of type {', '.join(workload.allowed_gpu_types)}; "
            f"it has {', '.join(present) or 'no GPUs'}",
        )
    types = adequate_types(workload, gpu_types, present)
    if not types:
        largest = max(
            (gpu_types[name] for name in present if name in gpu_types),
            key=lambda gpu_type: gpu_memory_per_pod_gib(gpu_type, workload.gpus_per_pod),
            default=None,
        )
        have = (
            f"{gpu_memory_per_pod_gib(largest, workload.gpus_per_pod):g} GiB on {largest.name}"
            if largest is not None
            else "no known GPU type"
        )
        return FitRejection(
            "min_gpu_memory_gib",
            f"a pod needs {workload.min_gpu_memory_gib:g} GiB of GPU memory; the most a pod can "
            f"get in this pool is {have}",
        )
    shape = PodShape.of(workload)
    pods_min = workload.gang_min_pods
    required = workload.topology if workload.topology and workload.topology.required else None
    best_room = 0
    pod_fits_somewhere = False
    for gpu_type in types:
        pod_fits_somewhere = pod_fits_somewhere or pool.room(gpu_type, shape, None) > 0
        room = pool.room(gpu_type, shape, required.level if required else None)
        best_room = max(best_room, room)
        if room >= pods_min:
            return None
    if not pod_fits_somewhere:
        return _pod_rejection(
            workload, [capacity.nodes[index] for name in types for index in capacity.by_type[name]]
        )
    if required is not None:
        return FitRejection(
            "topology",
            f"no {required.level} domain holds {pods_min} pods of "
            f"{workload.gpus_per_pod:g} GPU; the largest holds {best_room}",
        )
    return FitRejection(
        "pods",
        f"the gang needs {pods_min} pods of {workload.gpus_per_pod:g} GPU on one GPU type; "
        f"the pool holds at most {best_room} such pods of one type ({', '.join(types)})",
    )


def _cu_rejection(
    workload: Workload, gpu_types: Mapping[str, GpuType], pool: PoolRoom
) -> FitRejection | None:
    """A compute-unit request fits when one of its options does (`cu_request`)."""
    choices = cu_request.options(workload, gpu_types, tuple(pool.capacity.by_type))
    if not choices:
        return FitRejection(
            "compute_units",
            "no GPU type of this pool passes the workload's filters (allowed_gpu_types, "
            "min_gpu_memory_gib)",
        )
    first: FitRejection | None = None
    for option in choices:
        rejection = rejection_in(cu_request.concrete(workload, option), gpu_types, pool)
        if rejection is None:
            return None
        first = first or rejection
    assert first is not None
    if workload.mixed_gpu_types and _mix_fits(workload, gpu_types, pool.capacity):
        return None
    return FitRejection(
        "compute_units",
        f"{workload.compute_units:g} CU fits no GPU type of this pool: as "
        f"{cu_request.describe(choices[0])}, {first.message}",
    )


def _mix_fits(workload: Workload, gpu_types: Mapping[str, GpuType], capacity: Capacity) -> bool:
    """Whether some domain of the workload's topology level, empty, holds a mix of its
    accepted types giving its CU (`cu_request.mix`)."""
    if workload.topology is None:
        return False
    accepted = cu_request.options(workload, gpu_types, tuple(capacity.by_type))
    shape = PodShape(1.0, workload.cpu_millicores_per_pod, workload.memory_mib_per_pod)
    weights = {name: gpu_type.compute_weight for name, gpu_type in gpu_types.items()}
    by_value: dict[str, dict[str, int]] = {}
    domains = capacity.domains(workload.topology.level)
    for option in accepted:
        for value, members in domains.get(option.gpu_type, {}).items():
            room = sum(pods_fit_empty(capacity.nodes[index], shape) for index in members)
            by_value.setdefault(value, {})[option.gpu_type] = room
    return any(
        cu_request.mix(workload.compute_units, free, weights) is not None
        for free in by_value.values()
    )


def _shape_rejection(workload: Workload) -> FitRejection | None:
    if workload.pods < 1:
        return FitRejection("pods", "a workload needs at least one pod")
    if not 1 <= workload.gang_min_pods <= workload.pods:
        return FitRejection("min_pods", "the gang minimum must be between 1 and pods")
    gpus = workload.gpus_per_pod
    if gpus < 0.0 or math.isnan(gpus) or math.isinf(gpus):
        return FitRejection("gpus_per_pod", "GPUs per pod must be zero or more")
    if gpus >= 1.0 and abs(gpus - round(gpus)) > EPS:
        return FitRejection(
            "gpus_per_pod", "GPUs per pod above 1 must be whole; fractions share one GPU"
        )
    if workload.cpu_millicores_per_pod < 0 or workload.memory_mib_per_pod < 0:
        return FitRejection("cpu_millicores_per_pod", "CPU and memory requests cannot be negative")
    return None


def _pod_rejection(workload: Workload, states: list[NodeState]) -> FitRejection:
    shape = PodShape.of(workload)
    most_gpus = max((state.gpu_count for state in states), default=0)
    if shape.whole_gpus > most_gpus:
        return FitRejection(
            "gpus_per_pod",
            f"a pod needs {shape.whole_gpus} GPUs; the largest adequate node has {most_gpus}",
        )
    most_cpu = max((state.cpu_total for state in states), default=0)
    if workload.cpu_millicores_per_pod > most_cpu:
        return FitRejection(
            "cpu_millicores_per_pod",
            f"a pod needs {workload.cpu_millicores_per_pod} millicores; the largest adequate "
            f"node has {most_cpu}",
        )
    return FitRejection(
        "memory_mib_per_pod",
        f"a pod needs {workload.memory_mib_per_pod} MiB of memory, GPUs and CPU on one node; "
        "no adequate node has them all",
    )
