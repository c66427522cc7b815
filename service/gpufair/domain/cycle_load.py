"""Filling a `CycleState` from its snapshot: running work (possible victims), evictions in
flight, and the pending workloads sorted into their queues (DESIGN §4.1 order inside a queue:
priority class, highest first, then submit time)."""

from __future__ import annotations

import dataclasses
import math
from operator import attrgetter

from gpufair.domain import cu_request
from gpufair.domain.capacity import PodUse, binding_gpus, uses_of
from gpufair.domain.cycle_memory import PendingRecord, RunningRecord
from gpufair.domain.cycle_state import CycleState, Kind, Pending, Running
from gpufair.domain.model import Workload
from gpufair.domain.placement import PodShape, adequate_types, rejection_in
from gpufair.domain.queuebook import QueueBook
from gpufair.domain.snapshot import PendingCode
from gpufair.domain.victim_search import Victim


def load(state: CycleState) -> None:
    """Fill `state` from its snapshot, reusing the records the last cycle of the pool left in
    `state.carried` for every input object it is given again (`cycle_memory`), and leaving
    this load's records there for the next cycle."""
    carried = state.carried
    if carried is None:
        load_running(state, {}, None)
        load_evicting(state)
        load_pending(state, {}, None)
        return
    if carried.valid_for(state.snapshot):
        state.kinds.update(carried.kinds)
    running: dict[int, RunningRecord] = {}
    pending: dict[int, PendingRecord] = {}
    reused = load_running(state, carried.running, running)
    load_evicting(state)
    reused += load_pending(state, carried.pending, pending)
    carried.running = running
    carried.pending = pending
    carried.kinds = dict(state.kinds)
    carried.reused = reused


def load_running(
    state: CycleState, before: dict[int, RunningRecord], records: dict[int, RunningRecord] | None
) -> int:
    """Running work into the capacity and the books, one `Victim` each; returns how many
    records were taken from `before` (the last cycle's, by the allocation's identity), and
    puts every record made or taken into `records` (None: none kept). Hot (one pass over every running
    workload): a workload of one binding without a partition, the common case, is read inline
    (what `uses_of` would make of it) and taken with `Capacity.take_one`; the one-node tuple
    of its `Victim.nodes` is shared by all workloads on that node. A carried record is taken
    the same way, in the same order: capacity and books come out as from new records."""
    reused = 0
    capacity = state.capacity
    index_of = capacity.index_of
    nodes = capacity.nodes
    take = capacity.take
    take_one = capacity.take_one
    books = state.books
    weights = state.weights
    running = state.running
    one_node: dict[int, tuple[int]] = {}
    uses: tuple[PodUse, ...]
    for allocation in state.snapshot.running:
        workload = allocation.workload
        uid = workload.uid
        if uid in running:
            continue
        record = before.get(id(allocation)) if before else None
        if record is not None and record[0] is allocation:
            _, uses, carried, one = record
            if not one:
                take(uses)
            elif uses:
                take_one(uses[0])
            victim = carried.victim
            book = books.get(workload.queue)
            if book is not None:
                book.add(victim.cu, victim.gpus, victim.gpu_type, workload.preemptible)
                book.allocated_cu_before += victim.cu
            running[uid] = carried
            if records is not None:
                records[id(allocation)] = record
            reused += 1
            continue
        bindings = allocation.bindings
        one = len(bindings) == 1 and not workload.partition_profile
        if one:
            binding = bindings[0]
            fraction = binding.gpu_fraction
            if fraction < 1.0:
                gpus = fraction
                indices = binding.gpu_indices[:1]
                amount = fraction
            else:
                indices = binding.gpu_indices
                gpus = float(len(indices))
                amount = 1.0
            index = index_of.get(binding.node)
            if index is None:
                uses = ()
                on_nodes: tuple[int, ...] = ()
            else:
                count = nodes[index].gpu_count
                if indices and (min(indices) < 0 or max(indices) >= count):
                    indices = tuple(gpu for gpu in indices if 0 <= gpu < count)
                use = PodUse(
                    index,
                    indices,
                    amount,
                    workload.cpu_millicores_per_pod,
                    workload.memory_mib_per_pod,
                )
                uses = (use,)
                take_one(use)
                found = one_node.get(index)
                if found is None:
                    found = one_node[index] = (index,)
                on_nodes = found
        else:
            uses = uses_of(capacity, workload, bindings)
            gpus = sum([binding_gpus(binding) for binding in bindings])
            take(uses)
            on_nodes = (
                (uses[0].node,)
                if len(uses) == 1
                else tuple(dict.fromkeys(use.node for use in uses))
            )
        gpu_type = allocation.gpu_type
        cu = gpus * weights.get(gpu_type, 0.0)
        if workload.mixed_gpu_types:  # GPUs of several types: each at its node's weight
            cu = sum(len(use.gpu_indices) * state.weight(nodes[use.node].gpu_type) for use in uses)
        book = books.get(workload.queue)
        if book is not None:
            book.add(cu, gpus, gpu_type, workload.preemptible)
            book.allocated_cu_before += cu
        victim = Victim(
            uid,
            workload.queue,
            book.victim_rank if book is not None else 0,
            workload.priority_class,
            allocation.started_at_s,
            cu,
            gpus,
            gpu_type,
            uses,
            on_nodes,
        )
        made = running[uid] = Running(victim, workload.preemptible, workload.min_runtime_s)
        if records is not None:
            records[id(allocation)] = (allocation, uses, made, one)
    return reused


def load_evicting(state: CycleState) -> None:
    for eviction in state.snapshot.evicting:
        running = state.running.get(eviction.victim_uid)
        if running is None:
            # The victim has stopped: a standing claim of its beneficiary (`cycle_claims`).
            if eviction.beneficiary_uid is not None:
                state.standing_claims.add(eviction.beneficiary_uid)
                state.claim_victims[eviction.victim_uid] = eviction.beneficiary_uid
            continue
        if eviction.victim_uid in state.leaving:
            continue
        victim = running.victim
        state.leaving.add(victim.uid)
        book = state.books.get(victim.queue)
        if book is not None:
            book.remove(victim.cu, victim.gpus, victim.gpu_type, running.preemptible)
            book.evicting_cu += victim.cu
        if eviction.beneficiary_uid is not None:
            state.leaving_for.setdefault(eviction.beneficiary_uid, []).append(victim)


# What makes two workloads of one kind (`kind_of`): everything placement and admission read of a
# workload but its identity, queue and times. One C call builds the tuple.
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


def load_pending(
    state: CycleState, before: dict[int, PendingRecord], records: dict[int, PendingRecord] | None
) -> int:
    """Pending work into its queues, sorted; returns how many records were taken from
    `before` (the last cycle's kind and order of a workload, by its identity), and puts the
    records of this load's ordinary workloads into `records` (None: none kept). Hot (one pass over every pending
    workload): the signature lookup of `kind_of` is made inline, and a workload of a known
    signature costs a tuple (`signature`, one C call), a dict lookup and its `Pending`; one
    with a carried record, a lookup by identity and its `Pending`."""
    reused = 0
    pool = state.pool.name
    seen = set(state.running)
    books = state.books
    kinds = state.kinds
    queue_pending = state.queue_pending
    for submitted in state.snapshot.pending:
        workload = submitted
        uid = workload.uid
        if uid in seen:
            continue
        seen.add(uid)
        book = books.get(workload.queue)
        record = before.get(id(submitted)) if before else None
        kind: Kind | None
        if record is not None and record[0] is submitted and book is not None:
            # Made from this very workload over the same pool, hardware and queues: an
            # ordinary workload of a usable kind (`cycle_memory`).
            _, kind, order = record
            if records is not None:
                records[id(submitted)] = record
            reused += 1
        elif book is None or workload.pool != pool or submitted.compute_units > 0.0:
            found = _unusual(state, submitted, book)
            if found is None or book is None:
                continue
            workload, kind = found
            order = (-workload.priority_class, workload.submit_time_s, uid)
        else:
            kind = kinds.get(signature(workload)) or kind_of(state, workload)
            order = (-workload.priority_class, workload.submit_time_s, uid)
            if kind.rejection is None and kind.types:
                if records is not None:
                    records[id(submitted)] = (submitted, kind, order)
            else:
                kind = _usable_kind(state, submitted, workload, kind)
                if kind is None:
                    continue
        pending = Pending(workload, book, kind, uid, order)
        items = queue_pending.get(book.name)
        if items is None:
            queue_pending[book.name] = [pending]
        else:
            items.append(pending)
    by_order = attrgetter("order")
    for name, items in queue_pending.items():
        items.sort(key=by_order)
        # suffix[i]: the least CU of any of items[i:] (math.inf past the end); a loop, not
        # `accumulate(..., min)`, which calls `min` through its argument parsing per item
        least = [math.inf] * (len(items) + 1)
        lowest = math.inf
        for position in range(len(items) - 1, -1, -1):
            cu = items[position].kind.min_cu
            if cu < lowest:  # noqa: PLR1730 (`min` parses its arguments: slower here)
                lowest = cu
            least[position] = lowest
        state.suffix_min_cu[name] = least
    return reused


def _unusual(
    state: CycleState, submitted: Workload, book: QueueBook | None
) -> tuple[Workload, Kind] | None:
    """A pending workload of another pool, of no known leaf queue (its reason written, None),
    or a compute-unit request (the gang that serves it this cycle, and that gang's kind)."""
    pool = state.pool.name
    if submitted.pool != pool:
        state.reason(submitted, PendingCode.OTHER_POOL, f"belongs to pool {submitted.pool}")
        return None
    if book is None:
        state.reason(
            submitted,
            PendingCode.UNKNOWN_QUEUE,
            f"queue {submitted.queue} is not a leaf queue of pool {pool}",
        )
        return None
    workload = submitted
    if submitted.compute_units > 0.0:
        workload = cu_request_for_cycle(state, submitted, book)
        state.cu_requests[submitted.uid] = submitted
    kind: Kind | None = kind_of(state, workload)
    if kind is not None and (kind.rejection is not None or not kind.types):
        kind = _usable_kind(state, submitted, workload, kind)
    return None if kind is None else (workload, kind)


def _usable_kind(
    state: CycleState, submitted: Workload, workload: Workload, kind: Kind
) -> Kind | None:
    """`kind` if the workload can be scheduled at all, else None with its `NEVER_FITS` reason
    written. A mix of types in one domain may serve what no single type can hold
    (`cycle_cu_mix`)."""
    if (
        kind.rejection is not None
        and submitted.mixed_gpu_types
        and rejection_in(submitted, state.gpu_types, state.pool_room) is None
    ):
        kind = dataclasses.replace(kind, rejection=None)
    if kind.rejection is not None:
        state.reason(workload, PendingCode.NEVER_FITS, kind.rejection.message)
        return None
    if not kind.types:
        state.reason(workload, PendingCode.NEVER_FITS, "no ready node has an adequate GPU type")
        return None
    return kind


def kind_of(state: CycleState, workload: Workload) -> Kind:
    """The shared facts of a workload's signature, memoised: pending work comes in few."""
    key = signature(workload)
    found = state.kinds.get(key)
    if found is None:
        shape = PodShape.of(workload)
        types = adequate_types(workload, state.gpu_types, tuple(state.capacity.by_type))
        cu_per_pod = tuple(workload.gpus_per_pod * state.weight(name) for name in types)
        min_cu = workload.gang_min_pods * cu_per_pod[0] if types else 0.0
        topology = workload.topology
        memo_key = (
            shape.gpus_per_pod,
            shape.cpu_millicores,
            shape.memory_mib,
            workload.gang_min_pods,
            None if topology is None else (topology.level, topology.required),
            shape.profile,
            shape.one_per_node,
        )
        found = Kind(
            rejection_in(workload, state.gpu_types, state.pool_room),
            shape,
            types,
            cu_per_pod,
            min_cu,
            memo_key,
        )
        state.kinds[key] = found
    return found


def cu_request_for_cycle(state: CycleState, workload: Workload, book: QueueBook) -> Workload:
    """The gang that serves a compute-unit request this cycle (`domain/cu_request.py`): the
    best option whose GPUs are free and that the queue's limits allow, counting down the GPUs
    taken by the requests resolved before it; else the best the pool could ever hold and the
    limits allow; else the best the pool could hold; else the best (which never fits)."""
    choices = cu_request.options(workload, state.gpu_types, tuple(state.capacity.by_type))
    if not choices:
        return workload  # never fits; `kind_of` says why
    free = state.cu_free_gpus
    if not free:
        free.update(state.capacity.free_whole_by_type)
    allowed: list[Workload] = []
    possible: list[Workload] = []
    for option in choices:
        candidate = cu_request.concrete(workload, option)
        if rejection_in(candidate, state.gpu_types, state.pool_room) is not None:
            continue
        possible.append(candidate)
        cu_per_pod = option.gpus_per_pod * state.weight(option.gpu_type)
        pods, _ = book.max_pods(
            cu_per_pod, option.gpus_per_pod, option.gpu_type, workload.preemptible, False
        )
        if pods < option.pods:
            continue  # a limit of the queue (or above it) rules this type out
        if free[option.gpu_type] >= option.gpus - 1e-9:
            free[option.gpu_type] -= option.gpus
            return candidate
        allowed.append(candidate)
    if not allowed and not possible and workload.mixed_gpu_types:
        # No single type ever holds it: the gang of the first option stands in (it never
        # places), and `cycle_cu_mix` looks for a mix.
        return cu_request.concrete(workload, choices[0])
    return (allowed or possible or [workload])[0]
