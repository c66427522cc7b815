"""Where a workload's pods go (DESIGN §4.2): the rules, and the placing of a gang.

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

This module places a gang (`place`, `place_on_nodes`). The rest is in modules of its own:
what a placement is asked for and which types a workload may use (`placement_ask`), how many
pods fit on nodes and the order nodes are read in (`placement_fit`), room by topology domain
(`placement_domain`), and why a workload could never fit (`placement_rejection`).
"""

from __future__ import annotations

from collections.abc import Iterable

from gpufair.domain import partitions
from gpufair.domain.capacity import EPS, Capacity, NodeState, PodUse
from gpufair.domain.model import PlacementStrategy
from gpufair.domain.placement_ask import Ask, Exclusion, PodShape
from gpufair.domain.placement_domain import _choose_domain
from gpufair.domain.placement_fit import _ordered_nodes, pods_fit
from gpufair.domain.topology import ladder


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
