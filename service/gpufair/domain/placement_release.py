"""A placement on what releasing some running work would free, made without releasing it.

A claim (`cycle_claims`) asks where its gang would go once its victims stop: the general way is
to release their uses under a journal, `place`, and restore. When the gang's type has no node
with room for one pod now, the only nodes such a placement can use are the ones the release
frees, so the placement is decided among those alone (`Capacity.released` says what each would
hold afterwards). `place` reads them in the order of its free-GPU buckets, and a release puts a
node last in its new bucket: so they are taken by (free GPUs after, order of their last move),
exactly the order `place` would read them in, and filled and assigned GPUs as `place` does.

Covered: gangs of a fixed size of whole-GPU pods, and single pods sharing a GPU, without
partitions, binpack, no topology (neither the workload's nor the pool's levels), no exclusion;
`only_released` says when, and anything else goes the general way. The common claim, one pod
for one victim pod, is decided on that one node without a `ReleasedNode`
(`place_one_released`); a gang of whole-GPU pods among freed nodes that no two victims share
(or one node) too, node by node (`place_on_freed_nodes`): there a node's last move is its first
touch, so the order of nodes whose free GPUs tie is the order the victims' pods name them.
"""

from __future__ import annotations

from collections.abc import Sequence
from operator import attrgetter, itemgetter

from gpufair.domain.capacity import EPS, Capacity, NodeState, PodUse, ReleasedNode
from gpufair.domain.model import PlacementStrategy, TopologyConstraint
from gpufair.domain.placement_ask import PodShape
from gpufair.domain.placement_fit import fit_on

# `place_released`'s "not decided here": a plan is never empty.
UNDECIDED: list[PodUse] = []
_new_tuple = tuple.__new__  # a `PodUse` made without its Python-level `__new__`


def only_released(
    capacity: Capacity,
    gpu_type: str,
    shape: PodShape,
    topology: TopologyConstraint | None,
    pool_levels: tuple[str, ...],
    strategy: PlacementStrategy,
    no_room: bool = False,
) -> bool:
    """Whether `place_released` decides a gang of `shape` on `gpu_type` as `place` would after
    the release: binpacked pods without partitions or topology, and no node of the type with
    room for one pod now. Whole-GPU pods: its buckets of `whole_gpus` free GPUs and more are
    empty. One pod sharing a GPU: `no_room`, the caller knows one fits nowhere (`place` failed
    it). Stays true while free capacity only shrinks."""
    whole = shape.whole_gpus
    if (
        shape.profile
        or topology is not None
        or pool_levels
        or strategy is not PlacementStrategy.BINPACK
        or gpu_type not in capacity.by_type
    ):
        return False
    if not whole:
        return no_room and shape.shares_gpu
    if capacity.free_whole_by_type[gpu_type] < whole:
        return True  # fewer free GPUs in all than one pod takes: the common case, a full type
    return not any(
        capacity.bucket(gpu_type, free) for free in range(whole, capacity.max_gpus[gpu_type] + 1)
    )


def place_released(
    capacity: Capacity,
    gpu_type: str,
    shape: PodShape,
    pods: int,
    released: dict[int, ReleasedNode],
) -> list[PodUse] | None:
    """`place(capacity, Ask(shape, gpu_type, pods, pods), BINPACK, Exclusion())` on the
    capacity as the release `released` describes would leave it, where `only_released` held
    before that release. `UNDECIDED` (one pod sharing a GPU): the nodes' order is not known
    here, the caller places it the general way."""
    whole = shape.whole_gpus
    if not whole:
        return _place_shared(gpu_type, shape, pods, released)
    free_after = capacity.free_whole_by_type[gpu_type]
    rooms: list[_Room] = []
    for node in released.values():
        state = node.state
        if state.gpu_type != gpu_type:
            continue
        free_after += node.free_whole - state.free_whole
        if node.free_whole >= whole:
            free = [gpu for gpu, used in enumerate(node.used) if used <= EPS]
            fits = _whole_fits(node.free_whole, node.cpu_free, node.memory_free, shape)
            rooms.append((node.free_whole, node.moved, fits, state.index, free))
    if free_after < pods * whole:
        return None  # `place`'s cheap reject
    return _gang_in(rooms, shape, pods)


# A node a gang may use after a release: its untouched GPUs then, the order of its last move
# (`ReleasedNode.moved`), the pods of the gang's shape it holds (`_whole_fits`), its index, and
# its untouched GPUs by index.
_Room = tuple[int, int, int, int, list[int]]
# A room's place in `place`'s reading order: (free GPUs after, order of its last move); a
# released node's.
_bucket_order = itemgetter(0, 1)
_released_order = attrgetter("free_whole", "moved")


def _gang_in(rooms: list[_Room], shape: PodShape, pods: int) -> list[PodUse] | None:
    """`place`'s gang of `pods` pods of `shape` (whole GPUs, binpack) when `rooms` are the only
    nodes of its type with room for one: read in bucket order (a stable sort: rooms that tie
    keep the order given), the first holding the whole gang (`_one_node`), else each as full
    as it goes (`_fill`); each on its first untouched GPUs by index (`_assign`)."""
    if len(rooms) > 1:
        rooms.sort(key=_bucket_order)
    whole = shape.whole_gpus
    if pods > 1:  # `_one_node`: the first node, in bucket order, holding the whole gang
        need = pods * whole
        for free_whole, _, fits, index, free in rooms:
            if free_whole >= need and fits >= pods:
                return whole_pods(index, free, shape, pods)
    uses: list[PodUse] = []
    for _, _, fits, index, free in rooms:  # `_fill`, binpack: each node as full as it goes
        if fits > 0:
            uses += whole_pods(index, free, shape, min(fits, pods - len(uses)))
            if len(uses) >= pods:
                return uses
    return None


def _whole_fits(free_whole: int, cpu_free: int, memory_free: int, shape: PodShape) -> int:
    """`fit_on` for whole-GPU pods (it reads only the free GPU count, CPU and memory)."""
    count = free_whole // shape.whole_gpus
    cpu, memory = shape.cpu_millicores, shape.memory_mib
    if cpu > 0 and cpu_free // cpu < count:
        count = cpu_free // cpu
    if memory > 0 and memory_free // memory < count:
        count = memory_free // memory
    if shape.one_per_node and count > 1:
        return 1
    return count if count > 0 else 0


def _place_shared(
    gpu_type: str, shape: PodShape, pods: int, released: dict[int, ReleasedNode]
) -> list[PodUse] | None:
    """One pod sharing a GPU: `place` reads the part-used nodes by (free GPUs, index), then the
    others by bucket, and binpack takes the first with room; only released nodes have any.
    Two of them left in their buckets by the release keep an order this does not know."""
    if pods != 1:
        return UNDECIDED
    best: tuple[float, int] | None = None
    first: ReleasedNode | None = None
    rest: list[ReleasedNode] = []
    for node in released.values():
        if node.state.gpu_type != gpu_type:
            continue
        if fit_on(node.used, node.free_whole, node.cpu_free, node.memory_free, shape) <= 0:
            continue
        if node.partial:
            key = (sum(1.0 - used for used in node.used if used < 1.0 - EPS), node.state.index)
            if best is None or key < best:
                best, first = key, node
        elif node.free_whole > 0:
            rest.append(node)
    if first is None:
        if not rest:
            return None
        rest.sort(key=_released_order)
        first = rest[0]
        if not first.moved and len(rest) > 1 and rest[1].free_whole == first.free_whole:
            return UNDECIDED
    used = first.used
    fraction = shape.gpus_per_pod
    gpu = max(
        (gpu for gpu, amount in enumerate(used) if 1.0 - amount >= fraction - EPS),
        key=lambda index: (used[index], -index),
    )
    return [PodUse(first.state.index, (gpu,), fraction, shape.cpu_millicores, shape.memory_mib)]


def whole_pods(index: int, gpus: Sequence[int], shape: PodShape, count: int) -> list[PodUse]:
    """`placement._assign` for whole-GPU pods: `count` pods of `shape` on node `index`, on the
    first of its free GPUs `gpus` (by index) in turn, `whole_gpus` each, `PodUse(index, gpus,
    1.0, cpu, memory)` made as a plain tuple (hot: every claim of a gang or of several
    victims)."""
    cpu, memory = shape.cpu_millicores, shape.memory_mib
    whole = shape.whole_gpus
    if count == 1:
        return [_new_tuple(PodUse, (index, tuple(gpus[:whole]), 1.0, cpu, memory, 0))]
    return [
        _new_tuple(
            PodUse, (index, tuple(gpus[pod * whole : (pod + 1) * whole]), 1.0, cpu, memory, 0)
        )
        for pod in range(count)
    ]


def place_one_released(capacity: Capacity, shape: PodShape, use: PodUse) -> list[PodUse] | None:
    """`place_released(capacity, gpu_type, shape, 1, capacity.released([(use,)]))` for a
    `shape` of whole GPUs or sharing one and a `use` without a partition on a node of
    `gpu_type`: the one node the release frees is the only candidate, so the pod goes there if
    it fits after the release, on its first free GPUs by index (whole GPUs,
    `released_whole_gpus`) or as `_place_shared` picks a GPU (`released_shared_gpu`)."""
    state = capacity.nodes[use.node]
    if not shape.whole_gpus:
        gpu = released_shared_gpu(state, shape, use)
        if gpu is None:
            return None
        return [
            PodUse(use.node, (gpu,), shape.gpus_per_pod, shape.cpu_millicores, shape.memory_mib)
        ]
    taken = released_whole_gpus(state, shape, use)
    if taken is None:
        return None
    return [PodUse(use.node, taken, 1.0, shape.cpu_millicores, shape.memory_mib)]


def released_whole_gpus(state: NodeState, shape: PodShape, use: PodUse) -> tuple[int, ...] | None:
    """The GPUs one pod of `shape` (whole GPUs) takes on the node of `use` (no partition) once
    `use` is released: its first untouched GPUs by index (`_assign`), or None when the pod does
    not fit there then (GPUs, CPU or memory; `_whole_fits`). Worked out from the node's own
    lists, nothing copied: only the victim's own change, by `_move`'s arithmetic. The node's
    untouched GPUs after are its count then (`free_whole` counts the GPUs used up to EPS), so
    they are listed, not counted; a full node (the usual victim's) has none but the victim's."""
    _, gpus, amount, cpu, memory, _ = use
    need_cpu, need_memory = shape.cpu_millicores, shape.memory_mib
    if need_cpu > 0 and (state.cpu_free + cpu) // need_cpu < 1:
        return None
    if need_memory > 0 and (state.memory_free + memory) // need_memory < 1:
        return None
    used = state.gpu_used
    if state.free_whole:  # untouched GPUs before: all of them by index after the release
        freed = [
            gpu
            for gpu, before in enumerate(used)
            if (before + -amount if gpu in gpus else before) <= EPS
        ]
    else:  # none before: the victim's GPUs the release leaves untouched, by index
        freed = []
        for gpu in gpus:
            if used[gpu] + -amount <= EPS:
                freed.append(gpu)
        if len(freed) > 1:
            freed.sort()
        elif freed and len(gpus) == 1 and shape.whole_gpus == 1:
            return gpus  # the common claim's: the victim's one GPU, its own tuple
    whole = shape.whole_gpus
    if len(freed) < whole:
        return None
    return tuple(freed) if len(freed) == whole else tuple(freed[:whole])


def place_on_freed_nodes(
    capacity: Capacity,
    gpu_type: str,
    shape: PodShape,
    pods: int,
    freed: dict[int, list[PodUse]],
) -> list[PodUse] | None:
    """`place_released(capacity, gpu_type, shape, pods, capacity.released(groups))` for a
    `shape` of whole GPUs, where `freed` holds the groups' pods by node, nodes in the order
    first touched (groups in turn), none with a partition, and each node is touched by one
    group only (or there is one node): then a node's last move is its first touch, so that is
    the order of nodes whose free GPUs tie. Worked out node by node from their own lists
    (`released_room`), no `ReleasedNode` made. `place`'s cheap reject is not needed: a gang
    that fits the rooms fits the type's free GPUs, which hold theirs."""
    nodes = capacity.nodes
    whole = shape.whole_gpus
    rooms: list[_Room] = []
    for index, uses in freed.items():
        state = nodes[index]
        if state.gpu_type != gpu_type:
            continue
        free_whole, fits, free = released_room(state, shape, uses)
        if free_whole >= whole:
            rooms.append((free_whole, len(rooms), fits, index, free))
    return _gang_in(rooms, shape, pods)


def released_room(
    state: NodeState, shape: PodShape, uses: Sequence[PodUse]
) -> tuple[int, int, list[int]]:
    """What the node of `state` holds once `uses` (on it, no partition) are released in turn:
    its untouched GPUs, the pods of `shape` (whole GPUs) that fit (`_whole_fits`), and its
    untouched GPUs by index. Each GPU the uses touch ends as `_move` leaves it, use by use
    (`released_whole_gpus`' arithmetic); the others are read where they are, nothing copied."""
    used = state.gpu_used
    cpu, memory = state.cpu_free, state.memory_free
    after: dict[int, float] = {}  # the use of each GPU `uses` touch, once they are released
    for _, gpus, amount, use_cpu, use_memory, _ in uses:
        cpu += use_cpu
        memory += use_memory
        for gpu in gpus:
            after[gpu] = after.get(gpu, used[gpu]) + -amount
    free_before = free_whole = state.free_whole
    free: list[int] = []  # the touched GPUs left untouched
    for gpu, value in after.items():  # `_move`'s counts, summed over the uses
        if used[gpu] <= EPS:
            free_whole -= 1
        if value <= EPS:
            free_whole += 1
            free.append(gpu)
    if free_whole < shape.whole_gpus:
        return free_whole, 0, free
    if free_before:  # the node had untouched GPUs before: all of them by index after
        free = [gpu for gpu, before in enumerate(used) if after.get(gpu, before) <= EPS]
    elif len(free) > 1:
        free.sort()
    return free_whole, _whole_fits(free_whole, cpu, memory, shape), free


def released_shared_gpu(state: NodeState, shape: PodShape, use: PodUse) -> int | None:
    """The GPU one pod of `shape` (sharing a GPU) takes on the node of `use` (no partition)
    once `use` is released, as `_place_shared` picks it when that node is the only one freed,
    or None when the pod does not fit there then: `fit_on` and the pick in one pass over the
    node's GPUs as the release leaves them (only the victim's own change, by `_move`'s
    arithmetic, on a copy of the node's list of GPU use)."""
    _, gpus, amount, victim_cpu, victim_memory, _ = use
    cpu, memory = shape.cpu_millicores, shape.memory_mib
    if cpu > 0 and (state.cpu_free + victim_cpu) // cpu < 1:
        return None
    if memory > 0 and (state.memory_free + victim_memory) // memory < 1:
        return None
    after = state.gpu_used.copy()  # each GPU's use once `use` is released
    for gpu in gpus:
        after[gpu] += -amount
    fraction = shape.gpus_per_pod
    fits = False
    best = -1
    best_used = 0.0
    for gpu, gpu_used in enumerate(after):
        room = 1.0 - gpu_used
        if room >= fraction - EPS:  # `fit_on`'s test; the most used such GPU, lowest index
            if not fits and int((room + EPS) / fraction) > 0:
                fits = True
            if best < 0 or gpu_used > best_used:
                best, best_used = gpu, gpu_used
    return best if fits else None
