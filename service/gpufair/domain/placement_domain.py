"""Room by topology domain: which domain of a level takes a gang (`_choose_domain`, rule 4 of
`placement`), from each domain's pods counted node by node (`_domain_room`) or kept from one
search to the next on the same capacity (`_DomainRoom`); and how many pods an *empty* pool, or
its largest domain of a level, holds (`PoolRoom`, the yardstick of `placement_rejection`).
"""

from __future__ import annotations

import weakref
from collections.abc import Collection, Mapping
from itertools import filterfalse

from gpufair.domain.capacity import Capacity, NodeState
from gpufair.domain.model import PlacementStrategy
from gpufair.domain.placement_ask import Ask, Exclusion, PodShape
from gpufair.domain.placement_fit import _ordered_nodes, pods_fit, pods_fit_empty


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
