"""Why a workload waits (DESIGN §3 "every computed share must be explainable", issue part 5).

`pending_message` is the one sentence the cycle attaches to every pending workload.
`explain` is the full answer for one workload after a cycle: its queue's fair-share numbers, how
many nodes fail which filter right now, and what it would take, as a structured `Explanation`
plus a human sentence, e.g. "It needs 60.0 CU, 40.0 of it over-quota; the queue may take 45.0 CU
now, 25.0 of it over-quota."

Numbers:

- `allocated_cu` is the queue's allocation as the cycle left it: running work, plus this cycle's
  binds, minus all evictions (decided now or earlier), plus capacity held for its waiting work.
- `needed_cu` is the gang minimum on the cheapest adequate GPU type (the least it could cost); a
  partition counts its profile's share, a compute-unit request the CU of its first option
  (`cu_request`: `compute_units` rounded up to whole GPUs of that type).
- `over_quota_needed_cu` is the part of `needed_cu` above the queue's deserved quota.
- `queue_may_take_cu` is what the fair share still allows, `max(0, fair share − allocated)`, and
  `over_quota_may_take_cu` the part of it above deserved.

Node filters are counted on the pool's nodes after the cycle's binds and holds, each node under
the first filter it fails, in the order: not ready, GPU type, GPU memory, held for another workload
(its free GPUs are all held for workloads waiting for their victims), free GPUs, CPU, memory.
For a partition request the GPU type filter also fails types that do not offer the profile, GPU
memory is the profile's, and free GPUs means room for one more instance (`partitions`); a
compute-unit request is counted as pods of its GPUs per pod. The message then says what the
request is: the profile and its share, or the CU and the options placement would choose from.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from gpufair.domain import cu_request
from gpufair.domain.capacity import Capacity, uses_of
from gpufair.domain.entitlement_reach import outlook
from gpufair.domain.model import GpuType, Node, Workload
from gpufair.domain.number_text import number_text as _num
from gpufair.domain.partition_geometry import geometries, profile_geometry
from gpufair.domain.placement_ask import PodShape, adequate_types, gpu_memory_per_pod_gib
from gpufair.domain.placement_fit import fit_on, pods_fit
from gpufair.domain.policy import max_borrow_s
from gpufair.domain.queuebook import QueueBook
from gpufair.domain.snapshot import (
    CycleResult,
    CycleSnapshot,
    PendingCode,
    PendingReason,
    ReservationKind,
)


@dataclass(frozen=True, slots=True)
class NodeFilterCounts:
    """Nodes of the pool by the first filter they fail for one pod of the workload."""

    nodes: int
    not_ready: int
    wrong_gpu_type: int
    gpu_memory_too_small: int
    held_for_other: int
    too_few_free_gpus: int
    too_little_cpu: int
    too_little_memory: int
    fits_a_pod: int


@dataclass(frozen=True, slots=True)
class Explanation:
    workload_uid: str
    queue: str
    pending: PendingReason | None  # None: the workload was bound (or is running)
    priority_tier: int
    deserved_cu: float
    fair_share_cu: float
    allocated_cu: float
    limit_cu: float | None
    needed_cu: float
    over_quota_needed_cu: float
    queue_may_take_cu: float
    over_quota_may_take_cu: float
    cheapest_gpu_type: str | None
    nodes: NodeFilterCounts
    message: str
    # How long the queue's work beyond its fair share may run before it may be reclaimed even
    # ahead of its min_runtime_s (`policy.max_borrow_s`); None: no limit.
    max_borrow_s: float | None = None
    # Waiting beyond its fair share: the largest share time-based fair share can give its queue
    # while it keeps what it holds (`entitlement_reach`); None otherwise or without a standing.
    reachable_share_cu: float | None = None


def queue_numbers(book: QueueBook) -> str:
    """The queue's part of a pending sentence: its allocated CU, fair share and deserved CU."""
    return (
        f"queue {book.name}: allocated {_num(book.allocated_cu)} CU, fair share "
        f"{_num(book.fair_share_cu)} CU, deserved {_num(book.deserved_cu)} CU"
    )


def pending_message(
    code: PendingCode,
    workload: Workload,
    book: QueueBook,
    needed_cu: float,
    held_nodes: int,
    queue: str | None = None,
) -> str:
    """One sentence for a pending workload, from its queue's numbers at the end of the cycle.
    `queue`: `queue_numbers(book)` when the caller has it already (the cycle's result writes
    many sentences per queue, all with the same numbers)."""
    if queue is None:
        queue = queue_numbers(book)
    if code is PendingCode.OVER_FAIR_SHARE:
        return (
            f"needs {_num(needed_cu)} CU, beyond its queue's fair share ({queue}), and no spare "
            "capacity fits it"
        )
    if code is PendingCode.NO_CAPACITY:
        held = f"; {held_nodes} nodes reserved for it" if held_nodes else ""
        return (
            f"within its queue's fair share ({queue}) but no free capacity fits "
            f"{workload.gang_min_pods} pods of {workload.gpus_per_pod:g} GPU, and reclaim "
            f"cannot free enough{held}"
        )
    if code is PendingCode.WAITING_FOR_EVICTED_CAPACITY:
        return (
            f"waiting for evicted capacity: work evicted for it is stopping; the GPUs it will use "
            f"on {held_nodes} nodes are held for it ({queue})"
        )
    if code is PendingCode.QUEUE_LIMIT:
        inner = book.limit_reached(needed_cu)
        if inner is not None:
            inner_limit = "none" if inner.limit_cu is None else f"{_num(inner.limit_cu)} CU"
            return (
                f"would exceed the limit of queue {inner.name} above its queue (limit "
                f"{inner_limit}; the queues under it hold {_num(inner.allocated_cu)} CU, "
                f"this needs {_num(needed_cu)} CU)"
            )
        limit = "none" if book.limit_cu is None else f"{_num(book.limit_cu)} CU"
        above = "".join(
            f"; queue {a.name} above: limit per type {a.limit_gpus_by_type}, holding "
            f"{a.gpus_by_type}"
            for a in book.ancestors
            if a.limit_gpus_by_type
        )
        return (
            f"would exceed its queue's limit (limit {limit}, per type "
            f"{book.limit_gpus_by_type}{above})"
        )
    if code is PendingCode.NON_PREEMPTIBLE_OVER_DESERVED:
        return (
            f"non-preemptible work must stay within deserved {_num(book.deserved_cu)} CU; the queue "
            f"holds {_num(book.nonpreemptible_cu)} CU of it and this needs {_num(needed_cu)} CU"
        )
    return f"pending: {code.value}"


def explain(snapshot: CycleSnapshot, result: CycleResult, workload_uid: str) -> Explanation:
    """Why `workload_uid` waits after `result` was computed from `snapshot`.

    Raises KeyError when the workload is in neither the snapshot's pending nor its running work.
    """
    workload = next((w for w in snapshot.pending if w.uid == workload_uid), None)
    if workload is None:
        workload = next(
            (a.workload for a in snapshot.running if a.workload.uid == workload_uid), None
        )
    if workload is None:
        raise KeyError(workload_uid)
    pending = result.pending.get(workload_uid)
    gpu_types = {gpu_type.name: gpu_type for gpu_type in snapshot.gpu_types}
    pool_nodes = [node for node in snapshot.nodes if node.pool == snapshot.pool.name]
    capacity = Capacity((node for node in pool_nodes if node.ready), geometries(snapshot.gpu_types))
    for allocation in snapshot.running:
        capacity.take(list(uses_of(capacity, allocation.workload, allocation.bindings)))
    by_uid = {w.uid: w for w in snapshot.pending}
    for bind in result.binds:
        bound = by_uid.get(bind.workload_uid)
        if bound is not None:
            capacity.take(list(uses_of(capacity, bound, bind.bindings)))
    held_for_other = _held_for_other(snapshot, result, capacity, workload_uid)
    types = adequate_types(workload, gpu_types, tuple(capacity.by_type))
    cheapest = types[0] if types else None
    weight = gpu_types[cheapest].compute_weight if cheapest is not None else 0.0
    needed_cu = workload.gang_min_pods * workload.gpus_per_pod * weight
    asks = _request_sentence(workload, gpu_types, tuple(capacity.by_type))
    if workload.compute_units > 0.0:
        choices = cu_request.options(workload, gpu_types, tuple(capacity.by_type))
        needed_cu = choices[0].given_cu if choices else workload.compute_units
    summary = result.queues.get(workload.queue)
    if summary is not None:
        allocated = summary.allocated_cu_after + summary.reserved_cu
        deserved, fair_share, tier = summary.deserved_cu, summary.fair_share_cu, summary.priority
    else:
        allocated = deserved = fair_share = 0.0
        tier = 0
    queue = next((q for q in snapshot.queues if q.name == workload.queue), None)
    limit = queue.quota(snapshot.pool.name).limit_cu if queue is not None else None
    borrow_s = (
        None if queue is None else max_borrow_s(queue.quota(snapshot.pool.name), snapshot.pool)
    )
    over_quota_needed = max(0.0, allocated + needed_cu - deserved) - max(0.0, allocated - deserved)
    may_take = max(0.0, fair_share - allocated)
    over_quota_may_take = max(0.0, fair_share - max(allocated, deserved))
    counts = _count_filters(workload, pool_nodes, capacity, gpu_types, held_for_other)
    reachable: float | None = None
    if pending is None and any(b.workload_uid == workload_uid for b in result.binds):
        # Pending, and it fits: only a cycle has not run since it arrived or room freed up.
        message = (
            f"{workload_uid} fits now: the next cycle of pool {snapshot.pool.name} would bind it "
            f"(it needs {_num(needed_cu)} CU)"
        )
        message += asks
    elif pending is None:
        message = f"{workload_uid} is not pending: it was bound or is running" + asks
    else:
        message = (
            f"{workload_uid} is pending ({pending.code.value}): {pending.message}. "
            f"Queue {workload.queue} (tier {tier}): deserved {_num(deserved)} CU, fair share "
            f"{_num(fair_share)} CU, allocated {_num(allocated)} CU. It needs {_num(needed_cu)} CU, "
            f"{_num(over_quota_needed)} of it over-quota; the queue may take {_num(may_take)} CU "
            f"now, {_num(over_quota_may_take)} of it over-quota. Of {counts.nodes} nodes: "
            f"{counts.not_ready} not ready, {counts.wrong_gpu_type} wrong GPU type, "
            f"{counts.gpu_memory_too_small} too little GPU memory, {counts.held_for_other} held "
            f"for other workloads, {counts.too_few_free_gpus} too few free GPUs, "
            f"{counts.too_little_cpu} too little CPU, {counts.too_little_memory} too little "
            f"memory, {counts.fits_a_pod} could take a pod."
        )
        message += asks
        if borrow_s is not None:
            message += (
                f" Loans are called back: the queue's work beyond its fair share may be "
                f"reclaimed after {borrow_s:.0f} s (max_borrow_s), even before its min_runtime_s."
            )
        if pending.code is PendingCode.OVER_FAIR_SHARE:
            reach = outlook(
                snapshot.pool,
                snapshot.standing,
                result.queues,
                workload,
                needed_cu,
                snapshot.now_s,
            )
            if reach is not None:
                reachable = reach.reachable_cu
                message += " " + reach.sentence
    return Explanation(
        workload_uid=workload_uid,
        queue=workload.queue,
        pending=pending,
        priority_tier=tier,
        deserved_cu=deserved,
        fair_share_cu=fair_share,
        allocated_cu=allocated,
        limit_cu=limit,
        needed_cu=needed_cu,
        over_quota_needed_cu=over_quota_needed,
        queue_may_take_cu=may_take,
        over_quota_may_take_cu=over_quota_may_take,
        cheapest_gpu_type=cheapest,
        nodes=counts,
        message=message,
        max_borrow_s=borrow_s,
        reachable_share_cu=reachable,
    )


def _request_sentence(
    workload: Workload, gpu_types: Mapping[str, GpuType], present: tuple[str, ...]
) -> str:
    """What a partition or compute-unit request asks, as a sentence ("" for other work)."""
    if workload.partition_profile:
        offered = [
            f"{name} ({_num(found.gpu_fraction * gpu_types[name].compute_weight)} CU each)"
            for name in adequate_types(workload, gpu_types, present)
            if (found := profile_geometry(gpu_types, name, workload.partition_profile))
        ]
        return (
            f" Each pod asks for one {workload.partition_profile} partition "
            f"({_num(workload.gpus_per_pod)} of a GPU), offered here by "
            f"{', '.join(offered) or 'no GPU type'}."
        )
    if workload.compute_units > 0.0:
        choices = cu_request.options(workload, gpu_types, present)
        listed = "; ".join(cu_request.describe(option) for option in choices)
        mixed = (
            f" If none has room, a mix of these types inside one {workload.topology.level} domain."
            if workload.mixed_gpu_types and workload.topology is not None
            else ""
        )
        return (
            f" It asks for {_num(workload.compute_units)} CU; placement tries, in order: "
            f"{listed or 'no GPU type of this pool passes its filters'}.{mixed}"
        )
    return ""


def _held_for_other(
    snapshot: CycleSnapshot, result: CycleResult, capacity: Capacity, workload_uid: str
) -> set[str]:
    """Nodes whose free room is all held for other workloads: a pod of any shape fitted there
    before the holds (GPUs only) and none does after. The holds are taken in `capacity`."""
    by_uid = {w.uid: w for w in snapshot.pending}
    holds = [
        reservation
        for reservation in result.reservations
        if reservation.kind is ReservationKind.EVICTED_CAPACITY
        and reservation.workload_uid != workload_uid
        and reservation.workload_uid in by_uid
    ]
    touched = {binding.node for reservation in holds for binding in reservation.held}
    had_room = {name for name in touched if _free_gpus(capacity, name) > 0.0}
    for reservation in holds:
        workload = by_uid[reservation.workload_uid]
        capacity.take(list(uses_of(capacity, workload, reservation.held)))
    return {name for name in had_room if _free_gpus(capacity, name) <= 0.0}


def _free_gpus(capacity: Capacity, name: str) -> float:
    index = capacity.index_of.get(name)
    return 0.0 if index is None else capacity.nodes[index].free_gpus()


def _count_filters(
    workload: Workload,
    pool_nodes: list[Node],
    capacity: Capacity,
    gpu_types: Mapping[str, GpuType],
    held_for_other: set[str],
) -> NodeFilterCounts:
    shape = PodShape.of(workload)
    if workload.compute_units > 0.0:
        shape = PodShape(
            cu_request.pod_gpus(workload),
            workload.cpu_millicores_per_pod,
            workload.memory_mib_per_pod,
        )
    tally = dict.fromkeys(_FILTERS, 0)
    for node in pool_nodes:
        failed = _first_failure(
            node, workload, shape, capacity=capacity, gpu_types=gpu_types, held=held_for_other
        )
        tally[failed] += 1
    return NodeFilterCounts(nodes=len(pool_nodes), **tally)


_FILTERS = (
    "not_ready",
    "wrong_gpu_type",
    "gpu_memory_too_small",
    "held_for_other",
    "too_few_free_gpus",
    "too_little_cpu",
    "too_little_memory",
    "fits_a_pod",
)


def _first_failure(
    node: Node,
    workload: Workload,
    shape: PodShape,
    *,
    capacity: Capacity,
    gpu_types: Mapping[str, GpuType],
    held: set[str],
) -> str:
    if not node.ready:
        return "not_ready"
    gpu_type = gpu_types.get(node.gpu_type)
    if gpu_type is None or (
        workload.allowed_gpu_types and node.gpu_type not in workload.allowed_gpu_types
    ):
        return "wrong_gpu_type"
    partition = profile_geometry(gpu_types, node.gpu_type, shape.profile) if shape.profile else None
    if shape.profile and partition is None:
        return "wrong_gpu_type"
    memory_gib = (
        partition.memory_gib
        if partition is not None
        else gpu_memory_per_pod_gib(gpu_type, shape.gpus_per_pod)
    )
    if shape.gpus_per_pod > 0.0 and memory_gib < workload.min_gpu_memory_gib:
        return "gpu_memory_too_small"
    if node.name in held:
        return "held_for_other"
    state = capacity.nodes[capacity.index_of[node.name]]
    gpu_only = PodShape(shape.gpus_per_pod, 0, 0, shape.profile)
    if shape.profile:
        if pods_fit(state, gpu_only) <= 0:
            return "too_few_free_gpus"
    elif fit_on(state.gpu_used, state.free_whole, 0, 0, gpu_only) <= 0:
        return "too_few_free_gpus"
    if shape.cpu_millicores > state.cpu_free:
        return "too_little_cpu"
    if shape.memory_mib > state.memory_free:
        return "too_little_memory"
    return "fits_a_pod"
