"""Defragmentation: moves that make room for a waiting gang (DESIGN §4, issue 15 item 4).

A gang within its queue's fair share may wait although the pool has enough free GPUs of its type
in total, only scattered over nodes (or topology domains) none of which holds it. Reclaim cannot
help (nobody is above their share, or the free GPUs are already enough), so with the pool's
`max_moved_share_per_hour` set, this phase looks for the fewest preemptible running workloads
whose eviction and immediate re-placement elsewhere leave room for the gang, and decides them
together:

1. **Who may move.** Running, preemptible, of the gang's GPU type, past its `min_runtime_s`, not
   already leaving; its queue does not matter (a move takes nothing from it).
2. **Which.** Greedy by node: each node's option is the shortest list of its movable workloads,
   largest first, that lets one more pod of the gang fit there, scored by workloads moved per
   pod gained, then GPUs moved; the best option is released and the options are scored again,
   until the gang fits. Every chosen workload must then fit elsewhere on GPUs free now, beside
   the gang's placement (largest first, by the ordinary placement rules); if one does not, the
   first option's node is left out and the greedy runs again (at most `_ATTEMPTS` times).
   Finally each is put back, last chosen first, if the rest still make room: no move is made
   that is not needed.
3. **The budget.** The GPUs moved in the past hour (`CycleSnapshot.moved_gpus_last_hour`) plus
   this cycle's never exceed `max_moved_share_per_hour` × the pool's GPUs.
4. **The decision.** Each moved workload gets an `EvictDecision` with reason `DEFRAGMENT` and
   its new placement (`move_to`), so it is never left pending: its new GPUs are held for it
   (`ReservationKind.MOVE_TARGET`) while it stops, and in the first cycle after it stopped it
   binds there before anything else (`honour_moves`). The gang holds the GPUs the moves free,
   as for any eviction (`cycle_claims`).

Pools without `max_moved_share_per_hour` and cycles without moves in flight skip all of this.

Searches that found no moves are remembered across cycles with what they read, and not run
again while none of it changes (`cycle_defrag_memo`); within a search each node's option is
kept by the node's state over the greedy passes, and each node's movable work is sorted once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from gpufair.domain import cycle_defrag_memo as memo
from gpufair.domain.capacity import EPS, Capacity, Journal, NodeState, PodUse, uses_of
from gpufair.domain.cycle_evict import commit
from gpufair.domain.cycle_reclaim import preemptible_running
from gpufair.domain.cycle_state import CycleState, Pending
from gpufair.domain.model import Allocation, PodBinding
from gpufair.domain.placement import place
from gpufair.domain.placement_ask import Ask, Exclusion, PodShape
from gpufair.domain.placement_fit import fit_on, pods_fit
from gpufair.domain.snapshot import EvictReason, PendingCode, Reservation, ReservationKind
from gpufair.domain.victim_search import Selection, Victim

# Node sets tried per gang: a node whose workloads fit nowhere else is left out and the greedy
# runs again, at most this many times (a bound on the work in a large pool).
_ATTEMPTS = 16
_ANYWHERE = Exclusion()


def honour_moves(state: CycleState) -> None:
    """Moves in flight: hold the new GPUs of a moved workload still running where it was; bind a
    moved workload that has stopped and waits on its new GPUs, first of all."""
    moves = [e for e in state.snapshot.evicting if e.move_to]
    if not moves:
        return
    capacity = state.capacity
    waiting = {item.uid: item for items in state.queue_pending.values() for item in items}
    for eviction in moves:
        running = state.running.get(eviction.victim_uid)
        if running is not None:
            allocation = _allocation_of(state, eviction.victim_uid)
            if allocation is not None:
                uses = list(uses_of(capacity, allocation.workload, eviction.move_to))
                if _fits(capacity, uses):
                    capacity.take(uses)
            continue
        item = waiting.get(eviction.victim_uid)
        if item is None or item.done:
            continue
        uses = list(uses_of(capacity, item.workload, eviction.move_to))
        if len(uses) == len(eviction.move_to) and _fits(capacity, uses):
            state.bind(item, eviction.move_gpu_type, uses)


def defragment(state: CycleState) -> None:
    share = state.pool.max_moved_share_per_hour
    if share is None:
        return
    capacity = state.capacity
    pool_gpus = sum(node.gpu_count for node in capacity.nodes)
    budget = share * pool_gpus - state.snapshot.moved_gpus_last_hour
    waiting = [
        item
        for items in state.queue_pending.values()
        for item in items
        if not item.done and item.code is PendingCode.NO_CAPACITY and item.shape.gpus_per_pod > 0
    ]
    if budget <= EPS or not waiting:
        return
    allocations = {a.workload.uid: a for a in state.snapshot.running}
    # Kinds no moves could serve: moves only take capacity, so a failure stays a failure.
    failed: set[tuple[object, ...]] = set()
    # Per GPU type, made once per cycle (the movable work again after a move): what placement
    # reads of the nodes that does not change, and the movable work with its part of the key.
    statics: dict[str, tuple[object, ...] | None] = {}
    movables: dict[str, Movable] = {}
    free: dict[tuple[str, bool, int], float] = {}  # `_free_gpus` by capacity state
    for item in state.in_queue_order(waiting):
        for gpu_type in item.types:
            pods_min = item.workload.gang_min_pods
            key = (gpu_type, item.kind.memo_key)
            if key in failed or state.pods_allowed(item, gpu_type, within_share=True) < pods_min:
                continue
            shape = item.shape
            free_key = (gpu_type, shape.whole_gpus > 0, capacity.version)
            free_gpus = free.get(free_key)
            if free_gpus is None:
                free_gpus = free[free_key] = _free_gpus(capacity, shape, gpu_type)
            if free_gpus < pods_min * shape.gpus_per_pod:
                continue  # not scattered but short: reclaim's business, not a move's
            static = statics.get(gpu_type, ())
            if static == ():
                static = statics[gpu_type] = memo.static_key(capacity, gpu_type)
            movable = movables.get(gpu_type)
            if movable is None:
                movable = movables[gpu_type] = _movable(state, gpu_type, budget, allocations)
            found = _find_moves(state, item, gpu_type, budget, allocations, static, movable)
            if found is None:
                failed.add(key)
                continue
            budget -= sum(victim.gpus for victim, _ in found[0])
            _commit_moves(state, item, gpu_type, found)
            movables.clear()  # fewer movable now, and the budget is smaller
            break
        if budget <= EPS:
            return


Moves = tuple[list[tuple[Victim, list[PodUse]]], list[PodUse]]


def _find_moves(
    state: CycleState,
    item: Pending,
    gpu_type: str,
    budget: float,
    allocations: dict[str, Allocation],
    static_key: tuple[object, ...] | None,
    movable_work: Movable,
) -> Moves | None:
    movable = movable_work[0]
    if not movable:
        return None
    ask = Ask(
        item.shape,
        gpu_type,
        item.workload.gang_min_pods,
        item.workload.gang_min_pods,
        item.workload.topology,
        state.pool.topology_levels,
    )
    capacity = state.capacity
    key = memo.search_key(
        capacity, ask, state.strategy, budget, tuple(movable), movable_work[1], static_key
    )
    if memo.skip(key, capacity, gpu_type):
        return None
    found = _search(state, ask, budget, movable, allocations)
    if found is None:
        memo.remember(key, capacity, gpu_type)
    return found


# The movable work of one GPU type by node, each node's largest first (on that node), then by
# uid; and what of it a search reads, for its key.
Movable = tuple[dict[int, list[Victim]], tuple[tuple[object, ...], ...]]


def _movable(
    state: CycleState, gpu_type: str, budget: float, allocations: dict[str, Allocation]
) -> Movable:
    now_s = state.snapshot.now_s
    movable: dict[int, list[Victim]] = {}
    read: list[tuple[object, ...]] = []
    # Preemptible and not already leaving: the list reclaim made (`preemptible_running`).
    for running in preemptible_running(state):
        victim = running.victim
        uid = victim.uid
        if (
            victim.gpu_type != gpu_type
            or uid in state.evicted
            or uid not in allocations
            or now_s - victim.started_at_s < running.min_runtime_s
            or victim.gpus > budget + EPS
        ):
            continue
        for node in victim.nodes:
            movable.setdefault(node, []).append(victim)
        workload = allocations[uid].workload
        read.append((uid, victim.gpus, victim.uses, PodShape.of(workload), workload.topology))
    for node, victims in movable.items():
        victims.sort(key=lambda v: (-_gpus_on(v, node), v.uid))
    return movable, tuple(read)


def _search(
    state: CycleState,
    ask: Ask,
    budget: float,
    movable: dict[int, list[Victim]],
    allocations: dict[str, Allocation],
) -> Moves | None:
    """The greedy and its trials (module docstring, step 2)."""
    banned: set[int] = set()
    options: dict[tuple[int, int, tuple[int, ...]], Option | None] = {}
    for _ in range(_ATTEMPTS):
        picked = _greedy(state, ask, movable, banned, budget, options)
        if picked is None:
            return None
        chosen, first_node = picked
        result = _trial(state, ask, chosen, allocations)
        if result is None:
            banned.add(first_node)  # its workloads fit nowhere else: try without that node
            continue
        for victim in reversed(list(chosen)):  # put back what is not needed, last chosen first
            fewer = [other for other in chosen if other is not victim]
            smaller = _trial(state, ask, fewer, allocations)
            if smaller is not None:
                chosen, result = fewer, smaller
        return result
    return None


def _greedy(
    state: CycleState,
    ask: Ask,
    movable: dict[int, list[Victim]],
    banned: set[int],
    budget: float,
    options: dict[tuple[int, int, tuple[int, ...]], Option | None],
) -> tuple[list[Victim], int] | None:
    """Options taken best first until the gang fits on the capacity with them released: the
    workloads, and the node of the first option; None when no options or the budget run out.
    `options`: each node's option by its state, kept over the search's greedy passes."""
    capacity = state.capacity
    candidates = {node: victims for node, victims in movable.items() if node not in banned}
    chosen: list[Victim] = []
    first_node = -1
    journal = Journal()
    try:
        spent = 0.0
        while place(capacity, ask, state.strategy, _ANYWHERE) is None:
            found = _best_option(capacity, ask.shape, candidates, set(map(id, chosen)), options)
            if found is None:
                return None
            _, option, node = found
            spent += sum(victim.gpus for victim in option)
            if spent > budget + EPS:
                return None
            if first_node < 0:
                first_node = node
            for victim in option:
                capacity.release(victim.uses, journal)
                chosen.append(victim)
            candidates.pop(node, None)
    finally:
        capacity.restore(journal)
    return (chosen, first_node) if chosen else None


# A node's option: its score (workloads per pod gained, GPUs, node), the workloads, the node.
Option = tuple[tuple[float, float, int], list[Victim], int]


def _best_option(
    capacity: Capacity,
    shape: PodShape,
    movable: dict[int, list[Victim]],
    taken: set[int],
    options: dict[tuple[int, int, tuple[int, ...]], Option | None],
) -> Option | None:
    """Over all nodes: the shortest list of a node's movable workloads, largest first, whose
    release fits one more pod there; the fewest workloads per pod gained, then fewest GPUs.
    A node's option depends only on its state (`NodeState.version`, which `Capacity.restore`
    gives back with the state) and which of its workloads are taken: `options` keeps it."""
    best: Option | None = None
    for node, victims in movable.items():
        state = capacity.nodes[node]
        here = tuple(id(v) for v in victims if id(v) in taken) if taken else ()
        key = (node, state.version, here)
        if key in options:
            found = options[key]
        else:
            found = options[key] = _node_option(state, node, victims, taken, shape)
        if found is not None and (best is None or found[0] < best[0]):
            best = found
    return best


def _node_option(
    state: NodeState, node: int, victims: list[Victim], taken: set[int], shape: PodShape
) -> Option | None:
    """`_best_option` on one node."""
    before = pods_fit(state, shape)
    left = [v for v in victims if id(v) not in taken]  # largest first (`_movable`)
    used = state.gpu_used.copy()
    free_whole, cpu, memory = state.free_whole, state.cpu_free, state.memory_free
    option: list[Victim] = []
    for victim in left:
        for use in victim.uses:
            if use.node != node:
                continue
            for gpu in use.gpu_indices:
                used[gpu] -= use.gpu_amount
            cpu += use.cpu_millicores
            memory += use.memory_mib
        free_whole = sum(1 for amount in used if amount <= EPS)
        option.append(victim)
        gained = fit_on(used, free_whole, cpu, memory, shape) - before
        if gained >= 1:
            return (len(option) / gained, sum(v.gpus for v in option), node), option, node
    return None


def _trial(
    state: CycleState, ask: Ask, victims: Sequence[Victim], allocations: dict[str, Allocation]
) -> Moves | None:
    """With `victims` released: the gang's plan. Then, with the victims back and the plan taken
    on top of them, each victim re-placed (largest first) on GPUs free now, so no move waits for
    another workload to stop. None when the gang or any victim does not fit, or a victim would
    land exactly where it is."""
    capacity = state.capacity
    journal = Journal()
    try:
        for victim in victims:
            capacity.release(victim.uses, journal)
        plan = place(capacity, ask, state.strategy, _ANYWHERE)
        capacity.restore(journal)
        if plan is None:
            return None
        capacity.take(plan, journal)
        moves: list[tuple[Victim, list[PodUse]]] = []
        for victim in sorted(victims, key=lambda v: (-v.gpus, v.uid)):
            workload = allocations[victim.uid].workload
            pods = len(victim.uses)
            target = Ask(
                PodShape.of(workload),
                victim.gpu_type,
                pods,
                pods,
                workload.topology,
                state.pool.topology_levels,
            )
            uses = place(capacity, target, state.strategy, _ANYWHERE)
            if uses is None or _same_place(uses, victim.uses):
                return None
            capacity.take(uses, journal)
            moves.append((victim, uses))
        return moves, plan
    finally:
        capacity.restore(journal)


def _gpus_on(victim: Victim, node: int) -> float:
    """GPUs `victim` holds on `node`."""
    return sum(use.gpu_amount * len(use.gpu_indices) for use in victim.uses if use.node == node)


def _free_gpus(capacity: Capacity, shape: PodShape, gpu_type: str) -> float:
    """Free GPUs of `gpu_type` in the pool: untouched ones for whole-GPU pods, every free share
    for pods that share a GPU."""
    if shape.whole_gpus:
        return float(capacity.free_whole_by_type.get(gpu_type, 0))
    return sum(capacity.nodes[index].free_gpus() for index in capacity.by_type.get(gpu_type, []))


def _same_place(new: Sequence[PodUse], old: Sequence[PodUse]) -> bool:
    return sorted((u.node, u.gpu_indices) for u in new) == sorted(
        (u.node, u.gpu_indices) for u in old
    )


def _fits(capacity: Capacity, uses: Sequence[PodUse]) -> bool:
    """Whether `uses` are free on the capacity now (GPUs, CPU and memory per node)."""
    need: dict[int, tuple[dict[int, float], int, int]] = {}
    for use in uses:
        gpus, cpu, memory = need.get(use.node, ({}, 0, 0))
        for gpu in use.gpu_indices:
            gpus[gpu] = gpus.get(gpu, 0.0) + use.gpu_amount
        need[use.node] = (gpus, cpu + use.cpu_millicores, memory + use.memory_mib)
    for index, (gpus, cpu, memory) in need.items():
        node = capacity.nodes[index]
        if cpu > node.cpu_free or memory > node.memory_free:
            return False
        if any(node.gpu_used[gpu] + amount > 1.0 + EPS for gpu, amount in gpus.items()):
            return False
    return True


def _allocation_of(state: CycleState, uid: str) -> Allocation | None:
    return next((a for a in state.snapshot.running if a.workload.uid == uid), None)


def _commit_moves(state: CycleState, item: Pending, gpu_type: str, found: Moves) -> None:
    moves, plan = found
    victims = tuple(victim for victim, _ in moves)
    first = len(state.evicts)
    commit(state, item, gpu_type, Selection(victims, plan), EvictReason.DEFRAGMENT, False)
    capacity = state.capacity
    targets = {victim.uid: uses for victim, uses in moves}
    for position in range(first, len(state.evicts)):
        decision = state.evicts[position]
        uses = targets[decision.workload_uid]
        bindings = tuple(
            PodBinding(
                pod_index=pod,
                node=capacity.nodes[use.node].name,
                gpu_indices=use.gpu_indices,
                gpu_fraction=use.gpu_amount if use.gpu_amount < 1.0 else 1.0,
            )
            for pod, use in enumerate(uses)
        )
        nodes = sorted({capacity.nodes[use.node].name for use in uses})
        gpus = sum(victim.gpus for victim, _ in moves if victim.uid == decision.workload_uid)
        state.evicts[position] = replace(
            decision,
            message=(
                f"moved to make room for {item.uid} of queue {item.book.name} "
                f"({item.workload.gang_min_pods} pods of {item.workload.gpus_per_pod:g} GPU, "
                f"which the pool's free GPUs hold only scattered): it goes to "
                f"{', '.join(nodes)} ({gpus:g} GPUs) as soon as it stops"
            ),
            move_to=bindings,
            move_gpu_type=gpu_type,
        )
        capacity.take(uses)
        state.reservations.append(
            Reservation(
                decision.workload_uid,
                ReservationKind.MOVE_TARGET,
                gpu_type,
                tuple(nodes),
                bindings,
            )
        )
