"""Free capacity of one pool while one cycle runs: a mutable index, private to the cycle.

The snapshot's values are immutable; a cycle needs to take capacity as it binds and to try
"what if these workloads were gone" while it reclaims. `Capacity` holds, per ready node, the used
fraction of each GPU, free CPU millicores and free memory MiB, and keeps two indexes current so a
placement never scans every node:

- `bucket(gpu_type, free_whole)`: the nodes of a type with exactly that many untouched GPUs;
- `partial_nodes(gpu_type)`: the nodes with a GPU partly used by fractional pods;
- `partitioned_nodes(gpu_type)`: the nodes with a GPU holding partitions.

Partitions (`domain/partition_geometry.py`): a GPU holding MIG-style instances keeps their slice
masks in `NodeState.slices` and counts as one whole GPU used (its first instance adds 1.0 to
`gpu_used`, its last one out takes it back) for every other kind of pod, so whole-GPU and plain
shared pods never land on it, and a partition never lands on a GPU they use: a GPU takes a
partition only while `gpu_used` holds nothing but its partitions' 1.0. (Both at once happens
only for a hold taken over a victim that still runs there until it stops.) Nodes that never held a partition
carry `slices = None`, and pods without a partition never look at it.

Trials (reclaim's "release these victims and see") write a `Journal`: the first time a trial
touches a node its prior state is saved, and `restore` puts it back exactly, so no floating-point
residue from add-then-subtract ever leaks into the real state. `released` works out what a
release would leave on the nodes it touches without making it (the claims' holds,
`placement_release`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from operator import attrgetter
from typing import NamedTuple

from gpufair.domain.model import Node, PodBinding, Workload
from gpufair.domain.partition_geometry import Geometry

# Tolerance for comparing GPU fractions and CU: sums of fractions such as 0.1 + 0.2 are inexact.
EPS = 1e-9


class PodUse(NamedTuple):
    """What one pod holds on one node: GPU indices, each used by `gpu_amount` (1.0 = whole).
    A named tuple rather than a frozen dataclass: the cycle makes one per pod it places or
    reads, and a tuple is built in a third of the time."""

    node: int
    gpu_indices: tuple[int, ...]
    gpu_amount: float
    cpu_millicores: int
    memory_mib: int
    slice_mask: int = 0  # a partition: the slices it covers on gpu_indices[0]


_NO_GEOMETRY: Mapping[str, Geometry] = {}
_slice_mask = attrgetter("slice_mask")


class NodeState:
    """One ready node's capacity; mutated only through `Capacity`."""

    __slots__ = (
        "cpu_free",
        "cpu_total",
        "free_whole",
        "geometry",
        "gpu_count",
        "gpu_type",
        "gpu_used",
        "index",
        "labels",
        "memory_free",
        "memory_total",
        "name",
        "partial_gpus",
        "slices",
        "version",
    )

    def __init__(
        self, index: int, node: Node, geometry: Mapping[str, Geometry] = _NO_GEOMETRY
    ) -> None:
        self.index = index
        self.name = node.name
        self.gpu_type = node.gpu_type
        self.gpu_count = node.gpu_count
        self.labels: Mapping[str, str] = node.labels
        self.gpu_used: list[float] = [0.0] * node.gpu_count
        self.free_whole = node.gpu_count
        self.partial_gpus = 0  # GPUs partly used (more than EPS, less than 1 - EPS)
        self.cpu_total = node.cpu_millicores
        self.cpu_free = node.cpu_millicores
        self.memory_total = node.memory_mib
        self.memory_free = node.memory_mib
        self.geometry = geometry  # partition profiles of its GPU type, by name
        self.slices: list[int] | None = None  # per GPU, slices held by partitions
        # Names the node's current state, as `Capacity.version` names the pool's: every change
        # of the node gets a fresh number and `Capacity.restore` gives the old one back, so a
        # result computed from this node alone (the victim search's options) stays valid
        # whenever the number comes back.
        self.version = 0

    def free_gpus(self) -> float:
        """Free GPU capacity in GPUs, counting the unused part of shared GPUs."""
        return sum(1.0 - used for used in self.gpu_used if used < 1.0 - EPS)


class Journal:
    """Prior states (and versions) of the nodes a trial touched, and the capacity's version
    before it."""

    __slots__ = ("nodes", "version")

    def __init__(self) -> None:
        # By node index, in the order first touched: the node's state and its prior
        # (gpu_used, cpu_free, memory_free, slices, version, free_whole, partial_gpus).
        self.nodes: dict[
            int, tuple[NodeState, list[float], int, int, list[int] | None, int, int, int]
        ] = {}
        self.version: int | None = None


class ReleasedNode:
    """A node as a release would leave it (`Capacity.released`): never part of the capacity."""

    __slots__ = ("cpu_free", "free_whole", "memory_free", "moved", "partial", "state", "used")

    def __init__(self, state: NodeState) -> None:
        self.state = state
        self.used = state.gpu_used.copy()
        self.cpu_free = state.cpu_free
        self.memory_free = state.memory_free
        self.free_whole = state.free_whole
        self.partial = state.partial_gpus
        self.moved = 0  # 0: kept its place in its bucket; else the order of its last move


class Capacity:
    """Free capacity of the ready nodes of one pool, indexed by GPU type and free GPUs."""

    def __init__(
        self,
        nodes: Iterable[Node],
        geometry: Mapping[str, Mapping[str, Geometry]] | None = None,
    ) -> None:
        self.nodes: list[NodeState] = []
        self.index_of: dict[str, int] = {}
        self.by_type: dict[str, list[int]] = {}
        self.max_gpus: dict[str, int] = {}
        # bucket[type][k]: nodes with exactly k untouched GPUs (a dict used as an ordered set).
        self._buckets: dict[str, list[dict[int, None]]] = {}
        self._partial: dict[str, dict[int, None]] = {}
        self._partitioned: dict[str, dict[int, None]] = {}
        self.free_whole_by_type: dict[str, int] = {}
        self._domains: dict[str, dict[str, dict[str, list[int]]]] = {}
        self._domain_of: dict[str, list[str | None]] = {}
        # `version` names the current state: every change gets a fresh number, and `restore`
        # gives back the number of the state it restores, so results computed on a state
        # (`memo`) stay valid whenever that state comes back.
        self.version = 0
        self._next_version = 1
        self.memo: dict[tuple[object, ...], int] = {}
        for node in nodes:
            if node.name in self.index_of:
                continue  # a duplicate name would double-count one machine
            shapes = geometry.get(node.gpu_type, _NO_GEOMETRY) if geometry else _NO_GEOMETRY
            state = NodeState(len(self.nodes), node, shapes)
            self.index_of[node.name] = state.index
            self.nodes.append(state)
            self.by_type.setdefault(node.gpu_type, []).append(state.index)
            self.max_gpus[node.gpu_type] = max(self.max_gpus.get(node.gpu_type, 0), node.gpu_count)
        for gpu_type, members in self.by_type.items():
            buckets: list[dict[int, None]] = [{} for _ in range(self.max_gpus[gpu_type] + 1)]
            for index in members:
                buckets[self.nodes[index].gpu_count][index] = None
            self._buckets[gpu_type] = buckets
            self._partial[gpu_type] = {}
            self._partitioned[gpu_type] = {}
            self.free_whole_by_type[gpu_type] = sum(self.nodes[i].gpu_count for i in members)

    def copy(self, base: Capacity | None = None) -> Capacity:
        """A capacity over the same nodes in exactly this one's state (`copy_state_from`, with
        `base` as there), without building its nodes first: what is fixed once a capacity is
        built (the node indices by name and by type, the largest GPU count per type) is shared,
        never changed after construction; the topology domains are found again on need.
        Loading keeps a copy of the capacity after its running work this way, and starts the
        next cycle's capacity from a copy of that one (`cycle_memory`)."""
        copy = Capacity.__new__(Capacity)
        copy.index_of = self.index_of
        copy.by_type = self.by_type
        copy.max_gpus = self.max_gpus
        copy._domains = {}
        copy._domain_of = {}
        copy.copy_state_from(self, base)
        return copy

    def copy_state_from(self, other: Capacity, base: Capacity | None = None) -> None:
        """Make this capacity's state exactly `other`'s, a capacity made over the same nodes
        (equal, in the same order): every node's use, the buckets and node sets in their order,
        `free_whole_by_type` and the version numbers; the placement memo starts empty, as
        before any placement. `other` is read, not changed, and shares nothing mutable with
        this one afterwards. Loading carries the capacity after the running work two cycles
        share this way (`cycle_memory`). Every mutable field of a `Capacity` or `NodeState`
        is copied here: one added to either must be added here too.

        `base`: a capacity never changed, whose state `other` was given by this method and
        has changed since only through its own methods, outside trials (loading's takes).
        Every change gives a node a number `base` never held, so a node whose version is the
        one it has in `base` is as there: its state is shared with `base`, not copied. This
        capacity is then never changed either (the load's kept copy: at 4,000 nodes the
        running work new in a cycle touches a few hundred)."""
        if base is None:
            self.nodes = [_copied(state) for state in other.nodes]
        else:
            self.nodes = [
                kept if kept.version == state.version else _copied(state)
                for kept, state in zip(base.nodes, other.nodes, strict=True)
            ]
        self._buckets = {
            gpu_type: [dict(bucket) for bucket in buckets]
            for gpu_type, buckets in other._buckets.items()
        }
        self._partial = {gpu_type: dict(found) for gpu_type, found in other._partial.items()}
        self._partitioned = {
            gpu_type: dict(found) for gpu_type, found in other._partitioned.items()
        }
        self.free_whole_by_type = dict(other.free_whole_by_type)
        self.version = other.version
        self._next_version = other._next_version
        self.memo = {}

    def bucket(self, gpu_type: str, free_whole: int) -> dict[int, None]:
        return self._buckets[gpu_type][free_whole]

    def partial_nodes(self, gpu_type: str) -> dict[int, None]:
        return self._partial.get(gpu_type, {})

    def partitioned_nodes(self, gpu_type: str) -> dict[int, None]:
        return self._partitioned.get(gpu_type, {})

    def last_in_bucket(self, index: int) -> None:
        """Put node `index` last in its free-GPU bucket: where a release that changed its
        untouched GPUs leaves it once `restore` undoes it. A placement worked out without that
        release (`victim_search`) keeps the buckets' order as the release would have."""
        state = self.nodes[index]
        bucket = self._buckets[state.gpu_type][state.free_whole]
        del bucket[index]
        bucket[index] = None

    def domains(self, level: str) -> dict[str, dict[str, list[int]]]:
        """Nodes by GPU type, then by the value of topology label `level`; unlabelled nodes
        belong to no domain. Built once per level and cycle: labels do not change mid-cycle."""
        found = self._domains.get(level)
        if found is None:
            found = {}
            for state in self.nodes:
                value = state.labels.get(level)
                if value is not None:
                    found.setdefault(state.gpu_type, {}).setdefault(value, []).append(state.index)
            self._domains[level] = found
        return found

    def domain_of(self, level: str) -> list[str | None]:
        """Per node (by index), its value of topology label `level`, None if unlabelled: read
        by node index from one list, not from each node's labels (a dict per node, wherever in
        memory it lies). Built once per level and cycle, as `domains`."""
        found = self._domain_of.get(level)
        if found is None:
            found = self._domain_of[level] = [state.labels.get(level) for state in self.nodes]
        return found

    def take(self, uses: Sequence[PodUse], journal: Journal | None = None) -> None:
        if journal is None and len(uses) == 1 and self.nodes[uses[0].node].slices is None:
            self.take_one(uses[0])  # the same change, cheaper (a bind or hold of one pod)
            return
        self._apply(uses, 1, journal)

    def take_one(self, use: PodUse) -> None:
        """`take((use,))`, outside any trial: what loading running work does once per running
        workload. Whole GPUs on a node with no part-used GPU (the common case) are counted out
        of its free GPUs as they are taken (each GPU free before is used after, and none is
        left part-used), without the full re-count of `_reindex`; other pods go through
        `take`. The node changes bucket at the same moment either way, so the buckets' order
        is the same."""
        state = self.nodes[use.node]
        gpu_type = state.gpu_type
        if use.gpu_amount != 1.0 or use.slice_mask or use.node in self._partial[gpu_type]:
            self._apply((use,), 1, None)
            return
        self.version = state.version = self._next_version
        self._next_version += 1
        used = state.gpu_used  # no GPU of the node is part-used: `partial_gpus` stays 0
        free_whole = before = state.free_whole
        for gpu in use.gpu_indices:
            was = used[gpu]
            if was <= EPS:
                free_whole -= 1
            # A GPU taken whole from free holds the one 1.0 object (`_move`).
            used[gpu] = 1.0 if was == 0.0 else was + 1.0
        state.cpu_free -= use.cpu_millicores
        state.memory_free -= use.memory_mib
        if free_whole != before:
            buckets = self._buckets[gpu_type]
            del buckets[before][use.node]
            buckets[free_whole][use.node] = None
            self.free_whole_by_type[gpu_type] += free_whole - before
            state.free_whole = free_whole

    def take_pod(
        self, index: int, gpus: tuple[int, ...], amount: float, cpu: int, memory: int
    ) -> NodeState:
        """`take((PodUse(index, gpus, amount, cpu, memory),))` outside any trial, without the
        `PodUse`: `_apply`'s one-pod change (no partition) made in place, the GPUs' classes
        moved by `_move`, the node re-indexed only where its counts changed (or
        it ever held a partition). The claims' hold of one pod (`CycleState.hold_one`);
        returns the node's state."""
        state = self.nodes[index]
        self.version = state.version = self._next_version
        self._next_version += 1
        state.cpu_free -= cpu
        state.memory_free -= memory
        free_whole, partial = _move(
            state.gpu_used, gpus, amount, state.free_whole, state.partial_gpus
        )
        self._index_moved(state, free_whole, partial)
        return state

    def take_pods(self, uses: Sequence[PodUse]) -> dict[int, NodeState] | None:
        """`take(uses)` outside any trial, for pods without a partition (None, nothing taken,
        if one has: `take` then): `_apply`'s change of several pods made in place, one
        version for the whole take, each node's counts moved by `_move` as its
        pods come, and the node re-indexed once at the end, in the order first touched, only
        where they changed or it ever held a partition. The holds of gangs
        (`CycleState.hold`); returns the nodes touched, by index in the order first touched."""
        if any(map(_slice_mask, uses)):
            return None
        self.version = version = self._next_version
        self._next_version += 1
        nodes = self.nodes
        touched: dict[int, NodeState] = {}
        counts: dict[int, tuple[int, int]] = {}  # per node touched: free, part-used GPUs
        for index, gpus, amount, cpu, memory, _ in uses:
            state = touched.get(index)
            if state is None:
                state = touched[index] = nodes[index]
                state.version = version
                free_whole, partial = state.free_whole, state.partial_gpus
            else:
                free_whole, partial = counts[index]
            counts[index] = _move(state.gpu_used, gpus, amount, free_whole, partial)
            state.cpu_free -= cpu
            state.memory_free -= memory
        for index, (free_whole, partial) in counts.items():
            state = touched[index]
            self._index_moved(state, free_whole, partial)
        return touched

    def release(self, uses: Sequence[PodUse], journal: Journal | None = None) -> None:
        self._apply(uses, -1, journal)

    def restore(self, journal: Journal) -> None:
        """Undo every change recorded in `journal` since it was empty."""
        for saved in journal.nodes.values():
            state, used, cpu_free, memory_free, slices, version, free_whole, partial = saved
            state.version = version
            state.gpu_used = used
            state.slices = slices
            state.cpu_free = cpu_free
            state.memory_free = memory_free
            self._index_moved(state, free_whole, partial)
        if journal.version is not None:
            self.version = journal.version
        journal.nodes.clear()
        journal.version = None

    def _apply(self, uses: Sequence[PodUse], sign: int, journal: Journal | None) -> None:
        if not uses:
            return
        if journal is not None and journal.version is None:
            journal.version = self.version
        self.version = version = self._next_version
        self._next_version += 1
        if len(uses) == 1:  # the common case: one pod on one node
            use = uses[0]
            state = self.nodes[use.node]
            if journal is not None:
                _save(journal, state)
            state.version = version
            state.cpu_free -= sign * use.cpu_millicores
            state.memory_free -= sign * use.memory_mib
            if use.slice_mask:
                _apply_partition(state, use, sign)
                self._reindex(state)
                return
            # Only the GPUs the pod uses change class (free, partly used, full): the node's
            # counts move by theirs, without a scan of the node's GPUs.
            free_whole, partial = _move(
                state.gpu_used,
                use.gpu_indices,
                sign * use.gpu_amount,
                state.free_whole,
                state.partial_gpus,
            )
            self._index_moved(state, free_whole, partial)
            return
        # Per node touched: its state, its counts as they move, and whether a partition
        # changed it (its counts are then taken by a scan).
        touched: dict[int, tuple[NodeState, int, int, bool]] = {}
        for use in uses:
            state = self.nodes[use.node]
            if journal is not None:
                _save(journal, state)
            state.version = version
            _, free_whole, partial, scan = touched.get(
                use.node, (state, state.free_whole, state.partial_gpus, False)
            )
            if use.slice_mask:
                _apply_partition(state, use, sign)
                scan = True
            else:
                free_whole, partial = _move(
                    state.gpu_used, use.gpu_indices, sign * use.gpu_amount, free_whole, partial
                )
            touched[use.node] = (state, free_whole, partial, scan)
            state.cpu_free -= sign * use.cpu_millicores
            state.memory_free -= sign * use.memory_mib
        for state, free_whole, partial, scan in touched.values():
            if scan:
                self._reindex(state)
            else:
                self._index(state, free_whole, partial)

    def released(self, groups: Iterable[Sequence[PodUse]]) -> dict[int, ReleasedNode] | None:
        """What `release` of each of `groups` in turn (one call per group) would leave on the
        nodes they touch, with nothing changed: per node, its GPUs' use, CPU and memory and
        counts afterwards, and when it last changed free-GPU bucket (`ReleasedNode.moved`;
        the release would put it last in that bucket then). The same arithmetic in the same
        order as `_apply`, so the numbers are the ones the release would make. None when a
        group holds a partition (its slices are not followed here)."""
        nodes = self.nodes
        found: dict[int, ReleasedNode] = {}
        moves = 0
        for uses in groups:
            if len(uses) == 1:  # the common case: one pod on one node
                index, gpus, amount, cpu, memory, mask = uses[0]
                if mask:
                    return None
                node = found.get(index)
                if node is None:
                    node = found[index] = ReleasedNode(nodes[index])
                before = node.free_whole
                node.free_whole, node.partial = _move(
                    node.used, gpus, -amount, before, node.partial
                )
                node.cpu_free += cpu
                node.memory_free += memory
                if node.free_whole != before:
                    moves += 1
                    node.moved = moves
                continue
            # The nodes this group touches, in the order first touched, with their free GPUs
            # before it: `_apply` moves each at the end of the group, if its count changed.
            touched: dict[int, int] = {}
            for use in uses:
                if use.slice_mask:
                    return None
                index = use.node
                node = found.get(index)
                if node is None:
                    node = found[index] = ReleasedNode(nodes[index])
                if index not in touched:
                    touched[index] = node.free_whole
                node.free_whole, node.partial = _move(
                    node.used, use.gpu_indices, -use.gpu_amount, node.free_whole, node.partial
                )
                node.cpu_free += use.cpu_millicores
                node.memory_free += use.memory_mib
            for index, before in touched.items():
                node = found[index]
                if node.free_whole != before:
                    moves += 1
                    node.moved = moves
        return found

    def _reindex(self, state: NodeState) -> None:
        """The node's counts by a scan of its GPUs (after a partition changed it)."""
        free_whole = 0
        partial = 0
        for used in state.gpu_used:
            if used <= EPS:
                free_whole += 1
            elif used < 1.0 - EPS:
                partial += 1
        self._index(state, free_whole, partial)

    def _index_moved(self, state: NodeState, free_whole: int, partial: int) -> None:
        """`_index` where the node's counts moved (or it ever held a partition, whose set is
        kept there too); nothing otherwise."""
        if (
            free_whole != state.free_whole
            or partial != state.partial_gpus
            or state.slices is not None
        ):
            self._index(state, free_whole, partial)

    def _index(self, state: NodeState, free_whole: int, partial: int) -> None:
        """Put the node in the buckets of its counts: `free_whole` untouched GPUs, `partial`
        partly used ones. A node is in `partial_nodes` exactly while its `partial_gpus` is not
        0, so that set changes only when the count goes to or from 0 (a node already there
        keeps its place, as re-adding it would)."""
        was_partial = state.partial_gpus
        state.partial_gpus = partial
        gpu_type = state.gpu_type
        if free_whole != state.free_whole:
            buckets = self._buckets[gpu_type]
            del buckets[state.free_whole][state.index]
            buckets[free_whole][state.index] = None
            self.free_whole_by_type[gpu_type] += free_whole - state.free_whole
            state.free_whole = free_whole
        if partial:
            if not was_partial:
                self._partial[gpu_type][state.index] = None
        elif was_partial:
            del self._partial[gpu_type][state.index]
        if state.slices is not None:  # only nodes that ever held a partition
            if any(state.slices):
                self._partitioned[gpu_type][state.index] = None
            else:
                self._partitioned[gpu_type].pop(state.index, None)


def _save(journal: Journal, state: NodeState) -> None:
    """Record the node's state in `journal` the first time a trial touches it."""
    saved = journal.nodes
    if state.index not in saved:
        slices = state.slices
        saved[state.index] = (
            state,
            state.gpu_used.copy(),
            state.cpu_free,
            state.memory_free,
            None if slices is None else slices.copy(),
            state.version,
            state.free_whole,
            state.partial_gpus,
        )


def _copied(state: NodeState) -> NodeState:
    """A node's state with its own lists (`Capacity.copy_state_from`)."""
    copy = NodeState.__new__(NodeState)
    copy.index = state.index
    copy.name = state.name
    copy.gpu_type = state.gpu_type
    copy.gpu_count = state.gpu_count
    copy.labels = state.labels
    copy.gpu_used = state.gpu_used.copy()
    copy.free_whole = state.free_whole
    copy.partial_gpus = state.partial_gpus
    copy.cpu_total = state.cpu_total
    copy.cpu_free = state.cpu_free
    copy.memory_total = state.memory_total
    copy.memory_free = state.memory_free
    copy.geometry = state.geometry
    copy.slices = None if state.slices is None else state.slices.copy()
    copy.version = state.version
    return copy


def _move(
    used: list[float], gpus: Sequence[int], amount: float, free_whole: int, partial: int
) -> tuple[int, int]:
    """Add `amount` to the use of each of `gpus` and return the node's counts of untouched and
    partly used GPUs as they move: only the GPUs a pod uses change class (free, partly used,
    full), so no scan of the node's GPUs is needed.

    A GPU left full or free holds the one 1.0 or 0.0 object of this code (the same value): in
    a busy pool nearly every GPU does, so the reads of `gpu_used` across many nodes (the
    victim search, the room tests, copies of a node's list) meet a few floats, not one object
    per GPU spread over memory. A use is 0.0 only as +0.0 here: the uses start at +0.0 and a
    sum is -0.0 only when both terms are."""
    for gpu in gpus:
        before = used[gpu]
        after = before + amount
        if after == 1.0:
            after = 1.0
        elif after == 0.0:
            after = 0.0
        used[gpu] = after
        if before <= EPS:
            free_whole -= 1
        elif before < 1.0 - EPS:
            partial -= 1
        if after <= EPS:
            free_whole += 1
        elif after < 1.0 - EPS:
            partial += 1
    return free_whole, partial


def _apply_partition(state: NodeState, use: PodUse, sign: int) -> None:
    """Take (`sign` 1) or give back (-1) a partition's slices; see the module docstring."""
    slices = state.slices
    if slices is None:
        slices = state.slices = [0] * state.gpu_count
    gpu = use.gpu_indices[0]
    before = slices[gpu]
    slices[gpu] = before | use.slice_mask if sign > 0 else before & ~use.slice_mask
    # The first partition on a GPU adds one whole GPU to `gpu_used`, the last one out takes it
    # back: added, not assigned, so work that a hold was taken over (a victim still running
    # there) keeps counting, and the GPU stays closed to further partitions until it leaves.
    if bool(before) != bool(slices[gpu]):
        state.gpu_used[gpu] += 1.0 if slices[gpu] else -1.0


def uses_of(
    capacity: Capacity, workload: Workload, bindings: Iterable[PodBinding]
) -> tuple[PodUse, ...]:
    """What a workload's bindings hold on the capacity's nodes. Bindings on nodes that are not
    there (not ready, other pool) hold nothing here; GPU indices beyond the node are ignored.
    A partition the batch system reported without its start is put where placement would put
    it now (the highest free start): its slices are held either way."""
    index_of = capacity.index_of
    nodes = capacity.nodes
    cpu, memory = workload.cpu_millicores_per_pod, workload.memory_mib_per_pod
    partitioned = bool(workload.partition_profile)
    claimed: dict[tuple[int, int], int] = {}
    uses = []
    for binding in bindings:
        index = index_of.get(binding.node)
        if index is None:
            continue
        state = nodes[index]
        count = state.gpu_count
        if partitioned and binding.gpu_indices:
            use = _partition_use(state, workload, binding, claimed)
            if use is not None:
                uses.append(use)
                continue
        fraction = binding.gpu_fraction
        if fraction < 1.0:
            gpus = binding.gpu_indices[:1]
            amount = fraction
        else:
            gpus = binding.gpu_indices
            amount = 1.0
        if not all(0 <= gpu < count for gpu in gpus):
            gpus = tuple(gpu for gpu in gpus if 0 <= gpu < count)
        uses.append(PodUse(index, gpus, amount, cpu, memory))
    return tuple(uses)


def _partition_use(
    state: NodeState, workload: Workload, binding: PodBinding, claimed: dict[tuple[int, int], int]
) -> PodUse | None:
    """The slices a running partition holds; None when its node's type lacks the profile (it
    then holds its fraction like a plain share)."""
    shape = state.geometry.get(workload.partition_profile)
    gpu = binding.gpu_indices[0]
    if shape is None or not 0 <= gpu < state.gpu_count:
        return None
    occupied = claimed.get((state.index, gpu), 0)
    if state.slices is not None:
        occupied |= state.slices[gpu]
    mask = shape.mask_at(binding.partition_start) if binding.partition_start is not None else 0
    if not mask:
        mask = shape.first_fit(occupied) or shape.masks[-1]
    claimed[(state.index, gpu)] = occupied | mask
    return PodUse(
        state.index,
        (gpu,),
        shape.gpu_fraction,
        workload.cpu_millicores_per_pod,
        workload.memory_mib_per_pod,
        mask,
    )


def binding_gpus(binding: PodBinding) -> float:
    """GPUs one binding holds: its fraction of one GPU, or its whole GPUs."""
    if binding.gpu_fraction < 1.0:
        return binding.gpu_fraction
    return float(len(binding.gpu_indices))
