"""Where a workload's pods go (DESIGN §4.2), and whether they could ever go anywhere.

Rules, in the order they apply:

1. **Filters.** A node qualifies when its GPU type is allowed, the GPU memory the pod gets is at
   least `min_gpu_memory_gib`, and it has the free GPUs (or GPU fraction), CPU and memory for a pod.
   GPU memory per pod is the card's memory for whole-GPU pods and `fraction × memory` for a pod
   that shares a GPU: half an 80 GiB card gives 40 GiB, so a 30 GiB job may take it, while half a
   24 GiB card (12 GiB) does not qualify.
2. **Cheapest adequate type.** Types are tried in order of `compute_weight`, then memory, then name;
   the first type on which the whole gang fits wins. A pricier type is used only when no cheaper
   one fits now: a job a 4090 serves takes an A100 only while no 4090 is free. One exception, in
   the allocate passes (`cycle_contention`): a workload with several types tries last a type
   whose free GPUs, less its own, would not cover what pending work that can use only that type
   waits for, so flexible work does not starve single-type work of the one type it can use.
3. **One type per gang.** All pods of a workload are placed on nodes of one GPU type.
4. **Topology.** Levels are tried from the smallest domain up (`topology`: the pool's
   `topology_levels`, bounded by a required `TopologyConstraint`); at each level nodes are
   grouped by the value of that label, and the gang goes into the domain that holds it with the
   least room to spare (binpack) or the most (spread). No domain at any level: the pool, unless
   the constraint is required. Nodes without the label belong to no domain. Without a constraint,
   binpack first puts a multi-pod gang of whole-GPU pods on the one node that holds it whole with
   the least room to spare, rather than split it over part-full nodes.
5. **Node order.** `binpack` (default) fills the fullest qualifying nodes first, which keeps whole
   nodes free for gangs; `spread` deals pods one at a time over the emptiest nodes.
6. **Fractional pods** (`0 < gpus_per_pod < 1`) each take a share of one GPU; a GPU's shares never
   add up to more than 1.0. Binpack puts a share on the fullest GPU with room, spread on the
   emptiest. Whole-GPU pods need `gpus_per_pod` to be a whole number and take untouched GPUs only.
7. **Partitions** (`Workload.partition_profile`): each pod takes one MIG-style instance; the rules
   of `domain/partitions.py` decide which GPUs and slices. **Compute-unit requests**
   (`Workload.compute_units`) are turned into a gang of one type before placement
   (`domain/cu_request.py`).
8. **Distinct nodes** (`Workload.pods_on_distinct_nodes`, a batch system's multi-node job): a
   node holds at most one of the workload's pods (`fit_on` counts at most one), so such a gang
   needs as many qualifying nodes as pods, and the one-node rule of 4 never applies to it.

An elastic workload (`min_pods < pods`) gets between `pods_min` and `pods_max` pods, as many as
fit; fewer than `pods_min` is no placement at all (gang all-or-nothing).
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Collection, Iterable, Iterator, Mapping, Set
from dataclasses import dataclass, field
from itertools import filterfalse
from operator import attrgetter
from typing import NamedTuple

from gpufair.domain import cu_request, partitions
from gpufair.domain.capacity import EPS, Capacity, NodeState, PodUse
from gpufair.domain.model import (
    GpuType,
    Node,
    PlacementStrategy,
    TopologyConstraint,
    Workload,
)
from gpufair.domain.partition_geometry import geometries
from gpufair.domain.topology import ladder

# "No limit from this resource" when a pod asks for none of it.
_UNBOUNDED = 1 << 30


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


@dataclass(frozen=True, slots=True)
class FitRejection:
    """Why a workload can never fit a pool: the offending workload field and a sentence."""

    field: str
    message: str


def gpu_memory_per_pod_gib(gpu_type: GpuType, gpus_per_pod: float) -> float:
    """The GPU memory one pod gets on a GPU of `gpu_type` (see the module docstring)."""
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


def place(
    capacity: Capacity, ask: Ask, strategy: PlacementStrategy, exclusion: Exclusion
) -> list[PodUse] | None:
    """Pods on nodes of `ask.gpu_type`: between `pods_min` and `pods_max`, or None. Pure: the
    capacity is read, never changed; the caller takes the returned uses if it binds them."""
    if ask.gpu_type not in capacity.by_type or ask.pods_max < ask.pods_min:
        return None
    whole = ask.shape.whole_gpus
    if (
        whole
        and not ask.shape.profile
        and capacity.free_whole_by_type[ask.gpu_type] < ask.pods_min * whole
    ):
        return None  # cheap reject: a full type is the common case in a busy pool
    binpack = strategy is PlacementStrategy.BINPACK
    if ask.topology is None and binpack and whole and ask.pods_max > 1:
        node = _one_node(capacity, ask, exclusion)
        if node is not None:
            return _fill(capacity, ask, (node,), strategy, exclusion)
    if ask.topology is not None or ask.pool_levels:
        steps = ladder(ask.pool_levels, ask.topology)
        for level in steps.levels:
            members = _choose_domain(capacity, ask, level, strategy, exclusion)
            if members is not None:
                return _fill(capacity, ask, members, strategy, exclusion)
        if steps.bounded:
            return None
    order = _ordered_nodes(capacity, ask.shape, ask.gpu_type, strategy)
    return _fill(capacity, ask, order, strategy, exclusion)


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


def _one_node(capacity: Capacity, ask: Ask, exclusion: Exclusion) -> int | None:
    """The usable node with the fewest untouched GPUs that holds all `pods_max` whole-GPU pods,
    or None. Reads the free-GPU buckets from the gang's size up: usually one node."""
    need = ask.pods_max * ask.shape.whole_gpus
    buckets = capacity.max_gpus[ask.gpu_type]
    for free in range(need, buckets + 1):
        for index in capacity.bucket(ask.gpu_type, free):
            if not exclusion.blocks(index) and pods_fit(capacity.nodes[index], ask.shape) >= (
                ask.pods_max
            ):
                return index
    return None


def place_on_nodes(
    capacity: Capacity,
    ask: Ask,
    order: Iterable[int],
    strategy: PlacementStrategy,
    exclusion: Exclusion,
) -> list[PodUse] | None:
    """`place` restricted to the nodes of `order`, taken in that order (`cycle_cu_mix`)."""
    return _fill(capacity, ask, order, strategy, exclusion)


def _choose_domain(
    capacity: Capacity, ask: Ask, level: str, strategy: PlacementStrategy, exclusion: Exclusion
) -> list[int] | None:
    """The nodes with room in the domain of label `level` that holds the gang tightest
    (binpack) or loosest (spread). Reads only nodes with room, from the indexes: a busy pool
    has few. The order they are read in does not matter: a domain's room is a sum, the domain
    is the least (room, label) and its nodes are sorted by a key that ends in the index."""
    nodes = capacity.nodes
    shape = ask.shape
    blocking = exclusion.blocks_any()
    spread = strategy is PlacementStrategy.SPREAD
    # Whole-GPU pods (no partition) are counted as `fit_on` counts them, without its call.
    # With CPU and memory asked and nothing excluded (the common case) the count is the one
    # kept from the last such search on this capacity, only the nodes changed since read
    # again (`_DomainRoom`); otherwise every node with room is read.
    whole = 0 if shape.profile else shape.whole_gpus
    cpu, memory = shape.cpu_millicores, shape.memory_mib
    room: Mapping[str, int]
    members: Mapping[str, Collection[int]]
    if whole and cpu > 0 and memory > 0 and not blocking:
        room, members = _DomainRoom.of(capacity, ask.gpu_type, level, shape).counted(capacity)
    else:
        room, members = _domain_room(capacity, ask, level, strategy, exclusion, whole)
    pods_min = ask.pods_min
    fitting = [
        (-total if spread else total, value) for value, total in room.items() if total >= pods_min
    ]
    if not fitting:
        return None
    chosen = members[min(fitting)[1]]
    return sorted(
        chosen,
        key=lambda index: (
            -_free_gpus(nodes[index]) if spread else _free_gpus(nodes[index]),
            index,
        ),
    )


def _free_gpus(state: NodeState) -> float:
    """`state.free_gpus()`, read from the node's counts where they give it exactly: no GPU
    part-used and every GPU counted free unused (0.0), so its free GPUs sum `free_whole`
    ones and no GPU adds a fraction."""
    if not state.partial_gpus and state.gpu_used.count(0.0) == state.free_whole:
        return float(state.free_whole)
    return state.free_gpus()


class _DomainRoom:
    """`_choose_domain`'s count for whole-GPU pods of one shape (CPU and memory asked) on one
    GPU type at one level, kept from one search to the next on the same capacity: per node
    with room, its version when read, its domain and its pods; per domain, its pods and its
    nodes with pods. A search re-reads only the nodes whose version changed since (a change
    gives a node a fresh version, `restore` the one of the state it brings back, so a node
    of the version read is as read) and the nodes that came into the free-GPU buckets it
    reads; the others are as counted. Between two searches of a victim search a few nodes
    change (about 3 of 22 with room at 4,000 nodes)."""

    __slots__ = ("fits", "gpu_type", "level", "members", "room", "seen", "shape")

    def __init__(self, gpu_type: str, level: str, shape: PodShape) -> None:
        self.gpu_type = gpu_type
        self.level = level
        self.shape = shape
        self.seen: dict[int, int] = {}  # node with room read → its version then
        self.fits: dict[int, tuple[str | None, int]] = {}  # such a node → domain, pods
        self.room: dict[str, int] = {}  # domain with pods → its pods
        self.members: dict[str, dict[int, None]] = {}  # such a domain → its nodes with pods

    @staticmethod
    def of(capacity: Capacity, gpu_type: str, level: str, shape: PodShape) -> _DomainRoom:
        """The count kept for `capacity` (a new one for a capacity whose nodes were replaced,
        `Capacity.copy_state_from`: their versions name other states)."""
        kept = _domain_rooms.get(capacity)
        if kept is None or kept[0] is not capacity.nodes:
            kept = _domain_rooms[capacity] = (capacity.nodes, {})
        key = (
            gpu_type,
            level,
            shape.whole_gpus,
            shape.cpu_millicores,
            shape.memory_mib,
            shape.one_per_node,
        )
        found = kept[1].get(key)
        if found is None:
            found = kept[1][key] = _DomainRoom(gpu_type, level, shape)
        return found

    def counted(self, capacity: Capacity) -> tuple[dict[str, int], dict[str, dict[int, None]]]:
        """Pods per domain and nodes with pods per domain, brought up to the capacity now."""
        nodes = capacity.nodes
        seen, fits_of, room, members = self.seen, self.fits, self.room, self.members
        stale = [index for index, version in seen.items() if nodes[index].version != version]
        for index in stale:
            del seen[index]
            value, fits = fits_of.pop(index)
            if value is not None and fits:
                left = room[value] - fits
                if left:
                    room[value] = left
                    del members[value][index]
                else:
                    del room[value]
                    del members[value]
        shape = self.shape
        level = self.level
        whole, cpu, memory = shape.whole_gpus, shape.cpu_millicores, shape.memory_mib
        gpu_type = self.gpu_type
        domain_of = capacity.domain_of(level)
        for free in range(whole, capacity.max_gpus[gpu_type] + 1):
            bucket = capacity.bucket(gpu_type, free)
            if not bucket:
                continue
            most = 1 if shape.one_per_node else free // whole
            for index in filterfalse(seen.__contains__, bucket):
                state = nodes[index]
                seen[index] = state.version
                # A node's pods: as `fit_on` counts them, without its call.
                fits = min(state.cpu_free // cpu, state.memory_free // memory, most)
                value = domain_of[index]
                if value is None or fits <= 0:
                    fits_of[index] = (value, 0)
                    continue
                fits_of[index] = (value, fits)
                found = members.get(value)
                if found is None:
                    room[value] = fits
                    members[value] = {index: None}
                else:
                    room[value] += fits
                    found[index] = None
        return room, members


# Per capacity, its nodes list (the versions' namespace) and its kept counts by (GPU type,
# level, shape); weak, so a capacity's counts go with it.
_domain_rooms: weakref.WeakKeyDictionary[
    Capacity, tuple[list[NodeState], dict[tuple[object, ...], _DomainRoom]]
] = weakref.WeakKeyDictionary()


def _domain_room(
    capacity: Capacity,
    ask: Ask,
    level: str,
    strategy: PlacementStrategy,
    exclusion: Exclusion,
    whole: int,
) -> tuple[dict[str, int], dict[str, list[int]]]:
    """`_choose_domain`'s pods per domain and nodes with pods per domain, node by node."""
    room: dict[str, int] = {}
    members: dict[str, list[int]] = {}
    nodes = capacity.nodes
    shape = ask.shape
    blocking = exclusion.blocks_any()
    cpu, memory, one_per_node = shape.cpu_millicores, shape.memory_mib, shape.one_per_node
    domain_of = capacity.domain_of(level)
    for index in _ordered_nodes(capacity, shape, ask.gpu_type, strategy):
        value = domain_of[index]
        if value is None or (blocking and exclusion.blocks(index)):
            continue
        state = nodes[index]
        if whole:
            fits = state.free_whole // whole
            if cpu > 0 and state.cpu_free // cpu < fits:
                fits = state.cpu_free // cpu
            if memory > 0 and state.memory_free // memory < fits:
                fits = state.memory_free // memory
            if one_per_node and fits > 1:
                fits = 1
        else:
            fits = pods_fit(state, shape)
        if fits > 0:
            found = members.get(value)
            if found is None:
                room[value] = fits
                members[value] = [index]
            else:
                room[value] += fits
                found.append(index)
    return room, members


def _fill(
    capacity: Capacity,
    ask: Ask,
    order: Iterable[int],
    strategy: PlacementStrategy,
    exclusion: Exclusion,
) -> list[PodUse] | None:
    """Take nodes in `order`: binpack fills each before the next, spread deals pods round-robin."""
    shape, pods_min, pods_max = ask.shape, ask.pods_min, ask.pods_max
    spread = strategy is PlacementStrategy.SPREAD
    chosen: list[tuple[NodeState, int]] = []
    total = 0
    blocking = exclusion.blocks_any()
    for index in order:
        if blocking and exclusion.blocks(index):
            continue
        state = capacity.nodes[index]
        fits = pods_fit(state, shape)
        if fits <= 0:
            continue
        if spread:
            chosen.append((state, fits))
            total += fits
            if len(chosen) >= pods_max and total >= pods_max:
                break
        else:
            take = min(fits, pods_max - total)
            chosen.append((state, take))
            total += take
            if total >= pods_max:
                break
    if total < pods_min:
        return None
    if spread:
        chosen = _deal(chosen, min(total, pods_max))
    uses: list[PodUse] = []
    for state, count in chosen:
        uses.extend(_assign(state, shape, count, strategy))
    return uses


def _deal(candidates: list[tuple[NodeState, int]], pods: int) -> list[tuple[NodeState, int]]:
    """One pod per node per round, emptiest first, until `pods` are dealt."""
    counts = [0] * len(candidates)
    dealt = 0
    while dealt < pods:
        for position, (_, fits) in enumerate(candidates):
            if counts[position] < fits:
                counts[position] += 1
                dealt += 1
                if dealt == pods:
                    break
    return [(state, count) for (state, _), count in zip(candidates, counts, strict=True) if count]


def _assign(
    state: NodeState, shape: PodShape, count: int, strategy: PlacementStrategy
) -> list[PodUse]:
    """GPU indices for `count` pods on one node (the node is known to hold them)."""
    cpu, memory = shape.cpu_millicores, shape.memory_mib
    if shape.profile:
        return partitions.assign(state, shape.profile, cpu, memory, count, strategy)
    if shape.gpus_per_pod >= 1.0:
        whole = shape.whole_gpus
        free = [gpu for gpu, used in enumerate(state.gpu_used) if used <= EPS]
        return [
            PodUse(state.index, tuple(free[pod * whole : (pod + 1) * whole]), 1.0, cpu, memory)
            for pod in range(count)
        ]
    if not shape.shares_gpu:
        return [PodUse(state.index, (), 0.0, cpu, memory) for _ in range(count)]
    fraction = shape.gpus_per_pod
    used = state.gpu_used.copy()
    fullest_first = strategy is PlacementStrategy.BINPACK
    uses: list[PodUse] = []
    for _ in range(count):
        fitting = [gpu for gpu, amount in enumerate(used) if 1.0 - amount >= fraction - EPS]
        if fullest_first:
            gpu = max(fitting, key=lambda index: (used[index], -index))
        else:
            gpu = min(fitting, key=lambda index: (used[index], index))
        used[gpu] += fraction
        uses.append(PodUse(state.index, (gpu,), fraction, cpu, memory))
    return uses


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


class PoolRoom:
    """How many pods of a shape an *empty* pool holds, per GPU type (in one topology domain when
    `level` is given): the yardstick for "can never fit". Memoised: nodes do not change.

    What an empty node holds depends only on its type's partition geometry (one per type), its
    GPU count, CPU and memory, so the nodes of a type (of a domain) are counted once per such
    class of hardware, not one by one: pools are made of few kinds of machine."""

    def __init__(self, capacity: Capacity) -> None:
        self._capacity = capacity
        self._room: dict[tuple[str, PodShape, str | None], int] = {}
        # Per (GPU type, level, domain): one node of each class of hardware, and how many.
        self._classes: dict[tuple[str, str | None, str | None], list[tuple[int, int]]] = {}

    @property
    def capacity(self) -> Capacity:
        return self._capacity

    def room(self, gpu_type: str, shape: PodShape, level: str | None) -> int:
        key = (gpu_type, shape, level)
        found = self._room.get(key)
        if found is None:
            capacity = self._capacity
            if level is None:
                found = self._held(
                    (gpu_type, None, None), capacity.by_type.get(gpu_type, []), shape
                )
            else:
                found = max(
                    (
                        self._held((gpu_type, level, value), group, shape)
                        for value, group in capacity.domains(level).get(gpu_type, {}).items()
                    ),
                    default=0,
                )
            self._room[key] = found
        return found

    def _held(
        self, where: tuple[str, str | None, str | None], members: list[int], shape: PodShape
    ) -> int:
        """Pods of `shape` the empty nodes `members` hold: each class of hardware once."""
        nodes = self._capacity.nodes
        classes = self._classes.get(where)
        if classes is None:
            first: dict[tuple[int, int, int], list[int]] = {}
            for index in members:
                state = nodes[index]
                hardware = (state.gpu_count, state.cpu_total, state.memory_total)
                found = first.get(hardware)
                if found is None:
                    first[hardware] = [index, 1]
                else:
                    found[1] += 1
            classes = self._classes[where] = [(index, count) for index, count in first.values()]
        return sum(pods_fit_empty(nodes[index], shape) * count for index, count in classes)


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
