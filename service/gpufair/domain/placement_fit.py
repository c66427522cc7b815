"""How many pods of a shape fit on a node (`fit_on`, `pods_fit`; `pods_fit_empty` on the node
empty) and on the usable nodes of a GPU type (`free_pods`), and the order placement reads a
type's nodes in (`_ordered_nodes`: from the capacity's free-GPU buckets, fullest first for
binpack, emptiest first for spread).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from gpufair.domain import partitions
from gpufair.domain.capacity import EPS, Capacity, NodeState
from gpufair.domain.model import PlacementStrategy
from gpufair.domain.placement_ask import Exclusion, PodShape

# "No limit from this resource" when a pod asks for none of it.
_UNBOUNDED = 1 << 30


def fit_on(
    used: list[float], free_whole: int, cpu_free: int, memory_free: int, shape: PodShape
) -> int:
    """How many pods of `shape` fit in the given free resources."""
    gpus = shape.gpus_per_pod
    if gpus >= 1.0:
        count = free_whole // shape.whole_gpus
    elif gpus > 0.0:
        count = 0
        for gpu_used in used:
            room = 1.0 - gpu_used
            if room >= gpus - EPS:
                count += int((room + EPS) / gpus)
    else:
        count = _UNBOUNDED
    if shape.cpu_millicores > 0:
        count = min(count, cpu_free // shape.cpu_millicores)
    if shape.memory_mib > 0:
        count = min(count, memory_free // shape.memory_mib)
    if shape.one_per_node and count > 1:
        return 1
    return max(count, 0)


def pods_fit(state: NodeState, shape: PodShape) -> int:
    """How many pods of `shape` fit on the node now."""
    if shape.profile:
        count = partitions.pods_fit(
            state, shape.profile, shape.cpu_millicores, shape.memory_mib, empty=False
        )
        return min(count, 1) if shape.one_per_node else count
    return fit_on(state.gpu_used, state.free_whole, state.cpu_free, state.memory_free, shape)


def pods_fit_empty(state: NodeState, shape: PodShape) -> int:
    """How many pods of `shape` the node holds when nothing runs on it."""
    if shape.profile:
        count = partitions.pods_fit(
            state, shape.profile, shape.cpu_millicores, shape.memory_mib, empty=True
        )
        return min(count, 1) if shape.one_per_node else count
    return fit_on(
        [0.0] * state.gpu_count, state.gpu_count, state.cpu_total, state.memory_total, shape
    )


def free_pods(capacity: Capacity, shape: PodShape, gpu_type: str, exclusion: Exclusion) -> int:
    """How many pods of `shape` fit on the usable nodes of `gpu_type` now; memoised per
    capacity state (reclaim asks this of unchanged states many times)."""
    key = (
        capacity.version,
        gpu_type,
        shape,
        id(exclusion.held),
        len(exclusion.held),
        exclusion.owner,
        exclusion.beyond_share and len(exclusion.gang_held),
    )
    found = capacity.memo.get(key)
    if found is None:
        found = capacity.memo[key] = _count_free_pods(capacity, shape, gpu_type, exclusion)
    return found


def _count_free_pods(
    capacity: Capacity, shape: PodShape, gpu_type: str, exclusion: Exclusion
) -> int:
    """`free_pods` without the memo. The order of nodes does not matter for a count, so it
    reads the buckets as they are (no sort of part-used nodes); whole-GPU pods are counted per
    bucket (a node of bucket `k` holds `k // whole` pods before CPU and memory), node by node
    only where CPU, memory or an exclusion can lower that."""
    if gpu_type not in capacity.by_type:
        return 0
    nodes = capacity.nodes
    blocking = exclusion.blocks_any()
    top = capacity.max_gpus[gpu_type]
    whole = shape.whole_gpus
    if shape.profile or not whole:
        if shape.shares_gpu and not shape.profile:
            partial = capacity.partial_nodes(gpu_type)
            members: Iterable[int] = [
                *partial,
                *(
                    index
                    for free in range(1, top + 1)
                    for index in capacity.bucket(gpu_type, free)
                    if index not in partial
                ),
            ]
        else:
            members = nodes_with_room(capacity, shape, gpu_type)
        return sum(
            pods_fit(nodes[index], shape)
            for index in members
            if not (blocking and exclusion.blocks(index))
        )
    cpu, memory = shape.cpu_millicores, shape.memory_mib
    total = 0
    for free in range(whole, top + 1):
        bucket = capacity.bucket(gpu_type, free)
        if not bucket:
            continue
        per_node = 1 if shape.one_per_node else free // whole
        if cpu <= 0 and memory <= 0 and not blocking:
            total += per_node * len(bucket)
            continue
        for index in bucket:
            if blocking and exclusion.blocks(index):
                continue
            state = nodes[index]
            count = per_node
            if cpu > 0 and state.cpu_free // cpu < count:
                count = state.cpu_free // cpu
            if memory > 0 and state.memory_free // memory < count:
                count = state.memory_free // memory
            if count > 0:
                total += count
    return total


def nodes_with_room(capacity: Capacity, shape: PodShape, gpu_type: str) -> Iterator[int]:
    """Nodes of `gpu_type` that may have GPU room for a pod of `shape` (a superset for shared
    GPUs, read from the indexes, so a busy pool yields few)."""
    if gpu_type not in capacity.by_type:
        return iter(())
    return _ordered_nodes(capacity, shape, gpu_type, PlacementStrategy.BINPACK)


def _ordered_nodes(
    capacity: Capacity, shape: PodShape, gpu_type: str, strategy: PlacementStrategy
) -> Iterator[int]:
    if shape.profile:
        yield from partitions.ordered_nodes(capacity, shape.profile, gpu_type, strategy)
        return
    top = capacity.max_gpus[gpu_type]
    binpack = strategy is PlacementStrategy.BINPACK
    if shape.gpus_per_pod >= 1.0:
        whole = shape.whole_gpus
        frees = range(whole, top + 1) if binpack else range(top, whole - 1, -1)
        for free in frees:
            yield from capacity.bucket(gpu_type, free)
        return
    if not shape.shares_gpu:
        for free in range(top + 1) if binpack else range(top, -1, -1):
            yield from capacity.bucket(gpu_type, free)
        return
    partial = capacity.partial_nodes(gpu_type)
    by_room = sorted(partial, key=lambda index: (capacity.nodes[index].free_gpus(), index))
    if binpack:
        yield from by_room
        for free in range(1, top + 1):
            yield from (index for index in capacity.bucket(gpu_type, free) if index not in partial)
    else:
        for free in range(top, 0, -1):
            yield from capacity.bucket(gpu_type, free)
        yield from (index for index in reversed(by_room) if capacity.nodes[index].free_whole == 0)
