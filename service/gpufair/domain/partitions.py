"""Placing pods that each ask for one MIG-style partition (`Workload.partition_profile`).

Rules (the placement rules of `domain/placement.py` hold too: filters, cheapest adequate type,
one type per gang, topology, node order):

1. **Adequate types** are those that declare the profile with a geometry, whose instance has at
   least `min_gpu_memory_gib`; cheapest first, as for any workload.
2. **Either partitions or not.** A GPU holds whole-GPU pods, plain shares (`0 < gpus_per_pod < 1`
   without a profile) or partitions, never two of these (`domain/capacity.py`). A partition goes
   on a GPU that already holds partitions, or on an untouched one.
3. **Slices.** On a GPU, an instance takes the highest free start its profile allows
   (`domain/partition_geometry.py`); instances never share a slice.
4. **Order.** Binpack fills GPUs that already hold partitions first (fullest node first), then
   opens untouched GPUs on the fullest nodes; spread takes untouched GPUs on the emptiest nodes
   first. On a node, binpack uses the most occupied GPU with room, spread the least.
5. **CU.** A partition counts its profile's `gpu_fraction` of the type's `compute_weight`: the
   workload's `gpus_per_pod` is that fraction (`with_profile_share` sets it at submit).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Iterator, Mapping

from gpufair.domain.capacity import EPS, Capacity, NodeState, PodUse
from gpufair.domain.model import GpuType, PlacementStrategy, Workload
from gpufair.domain.partition_geometry import Geometry, geometry


def offering_types(workload: Workload, gpu_types: Mapping[str, GpuType]) -> dict[str, float]:
    """The types that offer the workload's profile with geometry, with its fraction on each."""
    found: dict[str, float] = {}
    for name, gpu_type in gpu_types.items():
        for profile in gpu_type.partition_profiles:
            if profile.name == workload.partition_profile and geometry(profile) is not None:
                found[name] = profile.gpu_fraction
    return found


def adequate_partition_types(
    workload: Workload, gpu_types: Mapping[str, GpuType], present: Collection[str]
) -> list[GpuType]:
    """Types present in the pool offering the profile with enough memory per instance,
    unordered."""
    allowed = set(workload.allowed_gpu_types)
    found = []
    for name, gpu_type in gpu_types.items():
        if name not in present or (allowed and name not in allowed):
            continue
        for profile in gpu_type.partition_profiles:
            if (
                profile.name == workload.partition_profile
                and geometry(profile) is not None
                and profile.memory_gib >= workload.min_gpu_memory_gib - EPS
            ):
                found.append(gpu_type)
    return found


def with_profile_share(
    workload: Workload, gpu_types: Mapping[str, GpuType]
) -> tuple[Workload, str | None]:
    """The workload with `gpus_per_pod` set to its profile's fraction, or why that cannot be:
    no type offers the profile, the types offering it disagree on its fraction, or the request
    gave another `gpus_per_pod`."""
    if not workload.partition_profile:
        return workload, None
    offered = offering_types(workload, gpu_types)
    if not offered:
        return workload, (
            f"no GPU type declares partition profile {workload.partition_profile!r} with its "
            "slice geometry (memory_slices, starts)"
        )
    fractions = sorted(set(offered.values()))
    if fractions[-1] - fractions[0] > EPS:
        return workload, (
            f"the GPU types offering {workload.partition_profile!r} give it different shares "
            f"({', '.join(f'{f:g}' for f in fractions)}); name one in allowed_gpu_types"
        )
    fraction = fractions[0]
    if workload.gpus_per_pod and abs(workload.gpus_per_pod - fraction) > EPS:
        return workload, (
            f"gpus_per_pod {workload.gpus_per_pod:g} is not the share of "
            f"{workload.partition_profile!r} ({fraction:g}); leave it 0"
        )
    return dataclasses.replace(workload, gpus_per_pod=fraction), None


def pods_fit(state: NodeState, profile: str, cpu: int, memory: int, empty: bool) -> int:
    """How many pods of one instance each fit on the node (as if empty when `empty`)."""
    shape = state.geometry.get(profile)
    if shape is None:
        return 0
    if empty:
        count = shape.per_empty_gpu * state.gpu_count
        cpu_free, memory_free = state.cpu_total, state.memory_total
    else:
        # Untouched GPUs (`free_whole`) each hold the full count; a partitioned GPU counts as
        # used for everything else (`capacity`), so it is only in `slices`.
        count = shape.per_empty_gpu * state.free_whole
        if state.slices is not None:
            count += sum(
                shape.count(occupied)
                for occupied, used in zip(state.slices, state.gpu_used, strict=True)
                if occupied and used <= 1.0 + EPS  # above 1.0: other work shares the GPU
            )
        cpu_free, memory_free = state.cpu_free, state.memory_free
    if cpu > 0:
        count = min(count, cpu_free // cpu)
    if memory > 0:
        count = min(count, memory_free // memory)
    return max(count, 0)


def ordered_nodes(
    capacity: Capacity, profile: str, gpu_type: str, strategy: PlacementStrategy
) -> Iterator[int]:
    """Nodes of `gpu_type` that may hold an instance, in the order of rule 4: read from the
    capacity's indexes (nodes with partitions, nodes by untouched GPUs), never a scan."""
    members = capacity.by_type.get(gpu_type)
    if not members or profile not in capacity.nodes[members[0]].geometry:
        return  # the type does not offer the profile
    nodes = capacity.nodes
    partitioned = capacity.partitioned_nodes(gpu_type)
    top = capacity.max_gpus[gpu_type]
    if strategy is PlacementStrategy.BINPACK:
        yield from sorted(partitioned, key=lambda index: (nodes[index].free_whole, index))
        for free in range(1, top + 1):
            yield from (i for i in capacity.bucket(gpu_type, free) if i not in partitioned)
    else:
        for free in range(top, 0, -1):
            yield from capacity.bucket(gpu_type, free)
        yield from (i for i in partitioned if nodes[i].free_whole == 0)


def assign(
    state: NodeState, profile: str, cpu: int, memory: int, count: int, strategy: PlacementStrategy
) -> list[PodUse]:
    """Instances for `count` pods on one node (the node is known to hold them)."""
    shape: Geometry = state.geometry[profile]
    slices = state.slices or [0] * state.gpu_count
    # Per GPU: its slices in use, or -1 when it holds other work (with or without partitions:
    # a hold taken over a victim still running there, `capacity._apply_partition`).
    occupied = [
        slices[gpu] if used - (1.0 if slices[gpu] else 0.0) <= EPS else -1
        for gpu, used in enumerate(state.gpu_used)
    ]
    binpack = strategy is PlacementStrategy.BINPACK
    uses: list[PodUse] = []
    for _ in range(count):
        fitting = [
            gpu for gpu, taken in enumerate(occupied) if taken >= 0 and shape.first_fit(taken)
        ]
        if binpack:
            gpu = max(fitting, key=lambda g: (occupied[g].bit_count(), -g))
        else:
            gpu = min(fitting, key=lambda g: (occupied[g].bit_count(), g))
        mask = shape.first_fit(occupied[gpu])
        occupied[gpu] |= mask
        uses.append(PodUse(state.index, (gpu,), shape.gpu_fraction, cpu, memory, mask))
    return uses
