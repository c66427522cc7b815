"""A placement on what releasing some running work would free, made without releasing it.

A claim (`cycle_claims`) asks where its gang would go once its victims stop: the general way is
to release their uses under a journal, `place`, and restore. When the gang's type has no node
with room for one pod now, the only nodes such a placement can use are the ones the release
frees, so the placement is decided among those alone (`Capacity.released` says what each would
hold afterwards). `place` reads them in the order of its free-GPU buckets, and a release puts a
node last in its new bucket: so they are taken by (free GPUs after, order of their last move),
exactly the order `place` would read them in, and filled and assigned GPUs as `place` does.

Covered: whole-GPU pods without partitions, binpack, no topology (neither the workload's nor the
pool's levels), no exclusion, a gang of a fixed size; `only_released` says when, and anything
else goes the general way.
"""

from __future__ import annotations

from gpufair.domain.capacity import EPS, Capacity, PodUse, ReleasedNode
from gpufair.domain.model import PlacementStrategy, TopologyConstraint
from gpufair.domain.placement import PodShape, fit_on


def only_released(
    capacity: Capacity,
    gpu_type: str,
    shape: PodShape,
    topology: TopologyConstraint | None,
    pool_levels: tuple[str, ...],
    strategy: PlacementStrategy,
) -> bool:
    """Whether `place_released` decides a gang of `shape` on `gpu_type` as `place` would after
    the release: binpacked whole-GPU pods without topology, and no node of the type with the
    GPUs for one pod now (its buckets of `whole_gpus` free GPUs and more are empty). Stays
    true while free capacity only shrinks."""
    whole = shape.whole_gpus
    if (
        not whole
        or shape.profile
        or topology is not None
        or pool_levels
        or strategy is not PlacementStrategy.BINPACK
        or gpu_type not in capacity.by_type
    ):
        return False
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
    before that release."""
    whole = shape.whole_gpus
    free_after = capacity.free_whole_by_type[gpu_type]
    candidates: list[ReleasedNode] = []
    for node in released.values():
        state = node.state
        if state.gpu_type != gpu_type:
            continue
        free_after += node.free_whole - state.free_whole
        if node.free_whole >= whole:
            candidates.append(node)
    if free_after < pods * whole:
        return None  # `place`'s cheap reject
    if len(candidates) > 1:
        candidates.sort(key=_bucket_order)
    if pods > 1:  # `_one_node`: the first node, in bucket order, holding the whole gang
        need = pods * whole
        for node in candidates:
            if (
                node.free_whole >= need
                and fit_on(node.used, node.free_whole, node.cpu_free, node.memory_free, shape)
                >= pods
            ):
                return _assign(node, shape, pods)
    chosen: list[tuple[ReleasedNode, int]] = []
    total = 0
    for node in candidates:  # `_fill`, binpack: each node as full as it goes, in order
        fits = fit_on(node.used, node.free_whole, node.cpu_free, node.memory_free, shape)
        if fits <= 0:
            continue
        take = min(fits, pods - total)
        chosen.append((node, take))
        total += take
        if total >= pods:
            break
    if total < pods:
        return None
    if len(chosen) == 1:
        return _assign(chosen[0][0], shape, total)
    uses: list[PodUse] = []
    for node, count in chosen:
        uses.extend(_assign(node, shape, count))
    return uses


def _bucket_order(node: ReleasedNode) -> tuple[int, int]:
    return (node.free_whole, node.moved)


def _assign(node: ReleasedNode, shape: PodShape, count: int) -> list[PodUse]:
    """`placement._assign` for whole-GPU pods: the node's free GPUs in index order."""
    whole = shape.whole_gpus
    free = [gpu for gpu, used in enumerate(node.used) if used <= EPS]
    index = node.state.index
    cpu, memory = shape.cpu_millicores, shape.memory_mib
    if count == 1:
        return [PodUse(index, tuple(free[:whole]), 1.0, cpu, memory)]
    return [
        PodUse(index, tuple(free[pod * whole : (pod + 1) * whole]), 1.0, cpu, memory)
        for pod in range(count)
    ]
