"""Filling a `CycleState` from its snapshot: running work (possible victims), evictions in
flight, and the pending workloads sorted into their queues (`cycle_load_pending`; DESIGN §4.1
order inside a queue: priority class, highest first, then submit time)."""

from __future__ import annotations

from itertools import islice

from gpufair.domain.capacity import Capacity, PodUse, binding_gpus, uses_of
from gpufair.domain.cycle_load_pending import load_pending
from gpufair.domain.cycle_memory import (
    RunningRecord,
    book_totals,
    restore_totals,
)
from gpufair.domain.cycle_state import CycleState, Running
from gpufair.domain.victim_search import Victim

# `PodUse(...)` without the Python frame of a named tuple's `__new__`: the tuple of all six
# fields (`slice_mask` 0: no partition) made into one in C.
_new_use = tuple.__new__


def load(state: CycleState) -> None:
    """Fill `state` from its snapshot, reusing the records the last cycle of the pool left in
    `state.carried` for every input object it is given again (`cycle_memory`), and leaving
    this load's records there for the next cycle."""
    carried = state.carried
    if carried is None:
        load_running(state, {}, None)
        load_evicting(state)
        load_pending(state, None)
        return
    if state.carried_valid:
        state.kinds.update(carried.kinds)
    fresh: list[str] = []
    allocations = state.snapshot.running
    shared = state.shared_running
    base: Capacity | None = None  # the kept capacity the load starts from
    running: dict[int, RunningRecord] = {}  # the records this load makes or takes
    if shared:
        # The running work the kept capacity took is loaded as the last load left it: the
        # capacity is a copy of the kept one (`CycleState`), its victims and the books'
        # totals copied, none taken again; its records are kept, not copied. No allocation
        # after those has a record (the records are of those: `CarriedLoad.running`) but one given
        # twice, skipped as a uid already running either way.
        assert carried.capacity is not None and carried.totals is not None
        base = carried.capacity[1]
        state.running.update(carried.victims)
        state.running.update(carried.victims_added)
        restore_totals(state.books, carried.totals)
        reused = carried.records()
        victims = len(state.running)  # those after are this load's
        reused += load_running(state, {}, running, fresh, shared)
        carried.add_records(running, dict(islice(state.running.items(), victims, None)))
    else:
        before = carried.running
        if carried.running_added:
            before = {**before, **carried.running_added}
        reused = load_running(state, before, running, fresh, shared)
        carried.running = running
        carried.running_added = {}
        carried.victims = state.running  # not copied: no phase changes it after this load
        carried.victims_added = {}
    # The copy kept for the next load: it shares with `base` every node the new running work
    # left as there (state.capacity changed since `base` only by the takes above).
    kept = state.capacity.copy(base)
    # Replaced together: `CarriedLoad.shared_running` relies on the records being those of
    # the allocations the kept capacity took.
    carried.capacity = (allocations, kept)
    carried.totals = book_totals(state.books)
    carried.shared = shared
    load_evicting(state)
    reused += load_pending(state, carried, fresh)
    carried.kinds = dict(state.kinds)
    carried.reused = reused


def load_running(
    state: CycleState,
    before: dict[int, RunningRecord],
    records: dict[int, RunningRecord] | None,
    fresh: list[str] | None = None,
    shared: int = 0,
) -> int:
    """Running work into the capacity and the books, one `Victim` each; returns how many
    records were taken from `before` (the last cycle's, by the allocation's identity), puts
    every record made or taken into `records` (None: none kept) and the uid of every record
    made into `fresh`. Hot (one pass over every running workload after the first `shared`): a
    workload of one binding without a partition, the common case, is read inline
    (what `uses_of` would make of it) and taken with `Capacity.take_one`; the one-node tuple
    of its `Victim.nodes` is shared by all workloads on that node. A carried record is taken
    the same way, in the same order: capacity and books come out as from new records.
    `shared`: the first `shared` allocations are already loaded (their capacity, victims,
    records and book totals copied from the last load's, `cycle_memory`): they are not
    read."""
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
    for allocation in islice(state.snapshot.running, shared, None):
        record = before.get(id(allocation)) if before else None
        if record is not None and record[0] is allocation:
            # Its record holds all this reads of it (the victim's uid and queue are the
            # workload's): the allocation and its workload are not read.
            _, uses, carried, one = record
            victim = carried.victim
            uid = victim.uid
            if uid in running:
                continue
            if not one:
                take(uses)
            elif uses:
                take_one(uses[0])
            book = books.get(victim.queue)
            if book is not None:
                book.add(victim.cu, victim.gpus, victim.gpu_type, carried.preemptible)
                book.allocated_cu_before += victim.cu
            running[uid] = carried
            if records is not None:
                records[id(allocation)] = record
            reused += 1
            continue
        workload = allocation.workload
        uid = workload.uid
        if uid in running:
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
                use = _new_use(
                    PodUse,
                    (
                        index,
                        indices,
                        amount,
                        workload.cpu_millicores_per_pod,
                        workload.memory_mib_per_pod,
                        0,
                    ),
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
        if fresh is not None:
            fresh.append(uid)
    return reused


def load_evicting(state: CycleState) -> None:
    """Evictions in flight: each victim still running leaves (`CycleState.leaving`), its queue's
    book no longer counts it (`QueueBook.remove`) and counts it as evicting, and it is
    listed for its beneficiary (`leaving_for`); a victim that has stopped leaves a standing
    claim. Hot in the cycle after one that evicted (10,000 evictions at 4,000 nodes)."""
    running = state.running
    leaving = state.leaving
    books = state.books
    leaving_for = state.leaving_for
    for eviction in state.snapshot.evicting:
        victim_uid = eviction.victim_uid
        found = running.get(victim_uid)
        if found is None:
            # The victim has stopped: a standing claim of its beneficiary (`cycle_claims`).
            if eviction.beneficiary_uid is not None:
                state.standing_claims.add(eviction.beneficiary_uid)
                state.claim_victims[victim_uid] = eviction.beneficiary_uid
            continue
        if victim_uid in leaving:
            continue
        victim = found.victim
        leaving.add(victim.uid)  # the string the phases test (`victim.uid in leaving`)
        book = books.get(victim.queue)
        if book is not None:
            book.remove(victim.cu, victim.gpus, victim.gpu_type, found.preemptible)
            book.evicting_cu += victim.cu
        beneficiary = eviction.beneficiary_uid
        if beneficiary is not None:
            victims = leaving_for.get(beneficiary)
            if victims is None:
                leaving_for[beneficiary] = [victim]
            else:
                victims.append(victim)
