"""A leaf queue's demand (DESIGN §3.1): what it holds now plus what waits, per GPU type.

The one statement of the rule, used by the server's recompute and by the simulator alike:

- held: the GPUs of what runs (or is bound), on the type it really holds;
- waiting: each workload's whole request, counted on the GPU type placement would choose for it
  in the empty pool (`serving_types`): the cheapest present type that serves it
  (`placement_ask.adequate_types`) and whose nodes can hold its gang, so an 8-GPU pod waits on the
  8-GPU nodes of a dearer type, not on a cheaper type whose nodes have 4;
- work with no such type is no demand at all (it cannot use anything this pool could give it):
  work the pool could not hold even empty (`placement_rejection.rejection_in`, a gang bigger than
  the pool's nodes of a type once a config change took nodes away, say), which the cycle answers
  `NEVER_FITS` and which would otherwise hold a share no one can use, and work only types with
  no ready node could hold;
- a compute-unit request (`domain/cu_request.py`) waits for the GPUs of the first of its options
  the empty pool holds: `ceil(compute_units / weight)` on that option's type;
- every leaf gets an entry (empty when it has no work), sums are exact (`math.fsum`).

`queue_demands` gives each leaf's two maps (types by name); `leaf_demand_columns` the same
numbers as the division's columns (`fairshare_demand.LeafDemands`), in a compiled plan's leaf
and type order, with no per-leaf object: what a caller that keeps the plan passes (issue 17).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Mapping

import numpy as np

from gpufair.domain import cu_request
from gpufair.domain.capacity import Capacity
from gpufair.domain.fairshare_demand import LeafDemands, QueueDemand
from gpufair.domain.model import GpuType, Node, Workload
from gpufair.domain.partition_geometry import geometries
from gpufair.domain.placement_ask import PodShape, adequate_types, signature
from gpufair.domain.placement_domain import PoolRoom
from gpufair.domain.placement_rejection import rejection_in

ServingType = Callable[[Workload], str | None]


def serving_types(gpu_types: Mapping[str, GpuType], pool_nodes: Iterable[Node]) -> ServingType:
    """The `serving_type` of a pool whose nodes (ready or not: its hardware, as the cycle's
    never-fits check counts it) are `pool_nodes`: the cheapest ready type whose nodes, empty,
    hold the workload's gang (a compute-unit request: the first of its options that does);
    None when the pool could not hold it even empty, or holds it only on types with no ready
    node. Memoised by what placement reads of a workload: waiting work comes in few kinds."""
    nodes = list(pool_nodes)
    present = sorted({node.gpu_type for node in nodes if node.ready})
    room = PoolRoom(Capacity(nodes, geometries(gpu_types.values())))
    memo: dict[tuple[object, ...], str | None] = {}

    def holding(workload: Workload) -> str | None:
        if rejection_in(workload, gpu_types, room) is not None:
            return None
        topology = workload.topology
        level = topology.level if topology is not None and topology.required else None
        shape = PodShape.of(workload)
        for name in adequate_types(workload, gpu_types, present):
            if room.room(name, shape, level) >= workload.gang_min_pods:
                return name
        return None

    def serving_type(workload: Workload) -> str | None:
        key = (signature(workload), workload.compute_units, workload.mixed_gpu_types)
        if key in memo:
            return memo[key]
        if workload.compute_units <= 0.0:
            found = holding(workload)
        else:
            choices = cu_request.options(workload, gpu_types, present)
            found = next(
                (o.gpu_type for o in choices if holding(cu_request.concrete(workload, o))),
                None,
            )
            if found is None and choices and rejection_in(workload, gpu_types, room) is None:
                found = choices[0].gpu_type  # only a mix of types holds it (`cycle_cu_mix`)
        memo[key] = found
        return found

    return serving_type


def queue_demands(
    leaves: Iterable[str],
    held: Iterable[tuple[str, str, float]],
    waiting: Iterable[Workload],
    serving_type: Callable[[Workload], str | None],
    weights: Mapping[str, float] | None = None,
) -> dict[str, QueueDemand]:
    """Demand of each leaf queue. `held` is (queue, GPU type, GPUs) of what holds GPUs now;
    `serving_type(w)` the type a waiting workload would be placed on, None when none serves it;
    `weights` the CU per GPU of each type (needed for compute-unit requests only).
    Entries for queues outside `leaves` are ignored."""
    names = tuple(leaves)
    allocated: dict[str, dict[str, list[float]]] = {q: {} for q in names}
    pending: dict[str, dict[str, list[float]]] = {q: {} for q in names}
    for queue, gpu_type, gpus in held:
        if queue in allocated:
            allocated[queue].setdefault(gpu_type, []).append(gpus)
    for queue, serving, gpus in _waiting_gpus(waiting, pending, serving_type, weights):
        pending[queue].setdefault(serving, []).append(gpus)
    return {q: QueueDemand(_sums(allocated[q]), _sums(pending[q])) for q in names}


def leaf_demand_columns(
    leaves: tuple[str, ...],
    types: tuple[str, ...],
    held: Iterable[tuple[str, str, float]],
    waiting: Iterable[Workload],
    serving_type: Callable[[Workload], str | None],
    weights: Mapping[str, float] | None = None,
) -> LeafDemands | dict[str, QueueDemand]:
    """`queue_demands` as columns: a row per leaf of `leaves`, a column per type of `types`
    (a plan's `leaf_names` and `type_names`), each leaf's types in the order its maps would
    list them (held types by name, then types only waited for, by name). Work on a type outside
    `types` cannot be a column: then the maps are returned, for the division to refuse."""
    held = list(held)
    waiting = list(waiting)
    width = len(types)
    column = {t: j for j, t in enumerate(types)}
    row_of = dict(zip(leaves, range(len(leaves)), strict=True))
    allocated: dict[int, list[float]] = {}
    pending: dict[int, list[float]] = {}
    for queue, gpu_type, gpus in held:
        row = row_of.get(queue)
        if row is None:
            continue
        j = column.get(gpu_type)
        if j is None:
            return queue_demands(leaves, held, waiting, serving_type, weights)
        allocated.setdefault(row * width + j, []).append(gpus)
    for queue, serving, gpus in _waiting_gpus(waiting, row_of, serving_type, weights):
        j = column.get(serving)
        if j is None:
            return queue_demands(leaves, held, waiting, serving_type, weights)
        pending.setdefault(row_of[queue] * width + j, []).append(gpus)
    shape = (len(leaves), width)
    held_gpus = np.zeros(len(leaves) * width)
    held_here = np.zeros(len(leaves) * width, dtype=bool)
    for cell, values in allocated.items():
        held_gpus[cell] = math.fsum(values)
        held_here[cell] = True
    waiting_gpus = np.zeros(len(leaves) * width)
    waiting_here = np.zeros(len(leaves) * width, dtype=bool)
    for cell, values in pending.items():
        waiting_gpus[cell] = math.fsum(values)
        waiting_here[cell] = True
    held_here = held_here.reshape(shape)
    waiting_here = waiting_here.reshape(shape)
    # Held types first, then types only waited for, each by name; a type in neither last.
    by_name = np.argsort(np.argsort(np.array(types, dtype=object), kind="stable")).astype(np.intp)
    key = np.where(held_here, 0, np.where(waiting_here, width, 2 * width)) + by_name
    order = np.argsort(key, axis=1, kind="stable")
    order = np.where(np.take_along_axis(key, order, axis=1) < 2 * width, order, width)
    return LeafDemands(
        leaves=leaves,
        types=types,
        allocated=held_gpus.reshape(shape),
        pending=waiting_gpus.reshape(shape),
        order=order.astype(np.intp),
        allocated_count=held_here.sum(axis=1).astype(np.intp),
    )


def _waiting_gpus(
    waiting: Iterable[Workload],
    queues: Mapping[str, object],
    serving_type: Callable[[Workload], str | None],
    weights: Mapping[str, float] | None,
) -> Iterator[tuple[str, str, float]]:
    """(queue, serving type, GPUs) of each waiting workload of `queues` that a type serves."""
    for workload in waiting:
        if workload.queue not in queues:
            continue
        serving = serving_type(workload)
        if serving is None:
            continue
        gpus = workload.total_gpus
        if workload.compute_units > 0.0:
            weight = (weights or {}).get(serving, 0.0)
            if weight <= 0.0:
                continue
            per_pod = cu_request.pod_gpus(workload)
            gpus = per_pod * math.ceil(workload.compute_units / weight / per_pod - 1e-9)
        yield workload.queue, serving, gpus


def _sums(parts: dict[str, list[float]]) -> dict[str, float]:
    """By type name, so every later walk over the types (and its float sums) is deterministic."""
    return {name: math.fsum(values) for name, values in sorted(parts.items())}
