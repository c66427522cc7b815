"""Compute-unit requests served by a mix of GPU types inside one topology domain.

A compute-unit request with `mixed_gpu_types` (and a `topology` level) that its single-type gang
could not place (`cycle_allocate`) may take GPUs of several of its accepted types, all inside one
domain of `topology.level`. This phase runs right after each allocate pass (within fair share,
then beyond it), over such requests in queue order:

1. Per domain, the free one-GPU pods per accepted type on usable nodes (`Exclusion`, CPU and
   memory per pod as asked); `cu_request.mix` picks GPUs per type giving at least the CU asked.
2. The queue must stay within its fair share (within the share pass) and within its limits,
   counted per type at that type's weight; the domain giving the least CU wins, then the fewest
   GPUs, then the domain's name.
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
from gpufair.domain.cycle_state import CycleState, Pending
from gpufair.domain.model import PlacementStrategy, Workload
from gpufair.domain.placement import Ask, Exclusion, PodShape, place_on_nodes, pods_fit
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
    for item in state.in_queue_order(wanted):
        if not within_share and item.uid in state.claim_victims:
            continue  # as in the work-conserving pass (`cycle_allocate`)
        plan = _mixed_plan(state, item, state.cu_requests[item.uid], exclusion, within_share)
        if plan is not None:
            _bind(state, item, plan)


def _mixed_plan(
    state: CycleState,
    item: Pending,
    request: Workload,
    exclusion: Exclusion,
    within_share: bool,
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
    best: tuple[tuple[float, int, str], dict[str, int]] | None = None
    for value, members_by_type in by_value.items():
        free = {
            gpu_type: sum(
                pods_fit(capacity.nodes[index], shape)
                for index in members
                if not exclusion.blocks(index)
            )
            for gpu_type, members in members_by_type.items()
        }
        counts = cu_request.mix(request.compute_units, free, state.weights)
        if counts is None:
            continue
        given = sum(count * state.weight(name) for name, count in counts.items())
        if within_share and given > book.fair_share_cu - book.allocated_cu + EPS:
            continue
        if any(
            book.max_pods(state.weight(name), 1.0, name, request.preemptible, within_share)[0]
            < count
            for name, count in counts.items()
        ):
            continue
        key = (round(given, 9), sum(counts.values()), value)
        if best is None or key < best[0]:
            best = (key, counts)
    if best is None:
        return None
    value = best[0][2]
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
