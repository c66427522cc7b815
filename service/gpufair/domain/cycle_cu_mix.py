"""Compute-unit requests served by a mix of GPU types inside one topology domain.

A compute-unit request with `mixed_gpu_types` (and a `topology` level) that its single-type gang
could not place (`cycle_allocate`) may take GPUs of several of its accepted types, all inside one
domain of `topology.level`. This phase runs right after each allocate pass (within fair share,
then beyond it), over such requests in queue order:

1. Per domain, the free one-GPU pods per accepted type on usable nodes (`Exclusion`, CPU and
   memory per pod as asked); `cu_request.mix` picks GPUs per type giving at least the CU asked.
2. The queue must stay within its fair share (within the share pass) and within its limits,
   counted per type at that type's weight; the domain giving the least CU wins, then the fewest
   GPUs, then the domain's name. A mix that leaves pending single-type work the GPUs it waits
   for (`cycle_contention`: of such a type, at most the free whole GPUs less that demand) wins
   over any that does not; a domain is tried that way first, then with all its free GPUs.
3. The pods are placed on that domain's nodes of each type by the pool's strategy, and bound as
   one decision: `gpu_type` names the type giving the most CU (ties: the first name) and
   `gpus_by_type` all of them; the bindings' nodes say which pod runs on which type.

A running mix is counted at the CU its bindings give on their nodes' types (`cycle_load`); for
reclaim and per-type rules it is work of its `gpu_type`: evicting it frees all its GPUs, and only
reclaim for that type picks it as a victim.
"""

from __future__ import annotations

from gpufair.domain import cu_request
from gpufair.domain.capacity import EPS, PodUse
from gpufair.domain.cycle_contention import (
    lower_exclusive,
    single_type_trials,
    uncontended_gpus,
)
from gpufair.domain.cycle_state import CycleState, Pending
from gpufair.domain.model import PlacementStrategy, Workload
from gpufair.domain.placement import place_on_nodes
from gpufair.domain.placement_ask import Ask, Exclusion, PodShape
from gpufair.domain.placement_fit import pods_fit
from gpufair.domain.queuebook import QueueBook
from gpufair.domain.snapshot import BindDecision


def allocate_mixed(state: CycleState, within_share: bool) -> None:
    if not state.cu_requests:
        return
    exclusion = Exclusion(gang_held=state.gang_held, beyond_share=not within_share)
    wanted = [
        item
        for items in state.queue_pending.values()
        for item in items
        if not item.done
        and item.uid in state.cu_requests
        and state.cu_requests[item.uid].mixed_gpu_types
    ]
    # The trials the single-type demand counted (`cycle_contention`): a request's one-type
    # gang may be among them.
    counted = single_type_trials(state.kinds.values()) if state.exclusive_gpus else {}
    for item in state.in_queue_order(wanted):
        if not within_share and item.uid in state.claim_victims:
            continue  # as in the work-conserving pass (`cycle_allocate`)
        own = counted.get(item.trial)
        request = state.cu_requests[item.uid]
        plan = _mixed_plan(state, item, request, exclusion, within_share, own)
        if plan is not None:
            _bind(state, item, plan)
            if own is not None:
                lower_exclusive(state.exclusive_gpus, *own)


def _mixed_plan(
    state: CycleState,
    item: Pending,
    request: Workload,
    exclusion: Exclusion,
    within_share: bool,
    own: tuple[str, float] | None,
) -> list[PodUse] | None:
    if request.topology is None:
        return None
    choices = cu_request.options(request, state.gpu_types, tuple(state.capacity.by_type))
    types = [option.gpu_type for option in choices]
    shape = PodShape(1.0, request.cpu_millicores_per_pod, request.memory_mib_per_pod)
    capacity = state.capacity
    domains = capacity.domains(request.topology.level)
    by_value: dict[str, dict[str, list[int]]] = {}
    for gpu_type in types:
        for value, members in domains.get(gpu_type, {}).items():
            by_value.setdefault(value, {})[gpu_type] = members
    book = item.book
    caps = _uncontended(state, types, own)
    best: tuple[tuple[bool, float, int, str], dict[str, int]] | None = None
    for value, members_by_type in by_value.items():
        free = {
            gpu_type: sum(
                pods_fit(capacity.nodes[index], shape)
                for index in members
                if not exclusion.blocks(index)
            )
            for gpu_type, members in members_by_type.items()
        }
        # A mix leaving single-type work what it waits for first (`cycle_contention`), then
        # any: the free GPUs of such types counted only up to what a take leaves uncontended.
        spare = {t: min(count, caps.get(t, count)) for t, count in free.items()}
        tries = [(False, spare), (True, free)] if spare != free else [(False, free)]
        for contended, room in tries:
            counts = _admitted_mix(state, book, request, room, within_share)
            if counts is None:
                continue
            given = sum(count * state.weight(name) for name, count in counts.items())
            key = (contended, round(given, 9), sum(counts.values()), value)
            if best is None or key < best[0]:
                best = (key, counts)
            break
    if best is None:
        return None
    value = best[0][3]
    uses: list[PodUse] = []
    for gpu_type, count in sorted(best[1].items()):
        members = by_value[value][gpu_type]
        order = sorted(
            members,
            key=lambda index: (
                capacity.nodes[index].free_whole
                if state.strategy is PlacementStrategy.BINPACK
                else -capacity.nodes[index].free_whole,
                index,
            ),
        )
        ask = Ask(shape, gpu_type, count, count)
        placed = place_on_nodes(capacity, ask, order, state.strategy, exclusion)
        if placed is None:
            return None
        uses.extend(placed)
    return uses


def _admitted_mix(
    state: CycleState,
    book: QueueBook,
    request: Workload,
    free: dict[str, int],
    within_share: bool,
) -> dict[str, int] | None:
    """`cu_request.mix` of `free`, if the queue's share (within it) and limits admit it."""
    counts = cu_request.mix(request.compute_units, free, state.weights)
    if counts is None:
        return None
    given = sum(count * state.weight(name) for name, count in counts.items())
    if within_share and given > book.fair_share_cu - book.allocated_cu + EPS:
        return None
    if any(
        book.max_pods(state.weight(name), 1.0, name, request.preemptible, within_share)[0] < count
        for name, count in counts.items()
    ):
        return None
    return counts


def _uncontended(
    state: CycleState, types: list[str], own: tuple[str, float] | None
) -> dict[str, int]:
    """Per type of `types` that pending single-type work waits for, the most GPUs a mix may
    take of it uncontended (`cycle_contention.uncontended_gpus`); types absent: any. `own`:
    the request's one-type gang where the demand counted it (type, GPUs), not against it."""
    exclusive = state.exclusive_gpus
    if not exclusive:
        return {}
    free = state.capacity.free_whole_by_type
    caps: dict[str, int] = {}
    for gpu_type in types:
        mine = own[1] if own is not None and own[0] == gpu_type else 0.0
        cap = uncontended_gpus(gpu_type, exclusive, free, mine)
        if cap is not None:
            caps[gpu_type] = cap
    return caps


def _bind(state: CycleState, item: Pending, plan: list[PodUse]) -> None:
    state.capacity.take(plan)
    gpus_by_type: dict[str, float] = {}
    for use in plan:
        gpu_type = state.capacity.nodes[use.node].gpu_type
        gpus_by_type[gpu_type] = gpus_by_type.get(gpu_type, 0.0) + len(use.gpu_indices)
    cu = sum(gpus * state.weight(name) for name, gpus in gpus_by_type.items())
    main = min(gpus_by_type, key=lambda name: (-gpus_by_type[name] * state.weight(name), name))
    gpus = sum(gpus_by_type.values())
    book = item.book
    book.add(cu, gpus, main, item.workload.preemptible)
    book.bound_cu += cu
    state.binds.append(
        BindDecision(
            workload_uid=item.uid,
            queue=book.name,
            gpu_type=main,
            bindings=state.bind_plan(item, plan),
            cu=cu,
            over_fair_share=book.allocated_cu > book.fair_share_cu + EPS,
            gpus_by_type=dict(sorted(gpus_by_type.items())),
        )
    )
    item.done = True
