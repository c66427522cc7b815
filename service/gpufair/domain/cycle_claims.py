"""Phase 0 of the cycle: claims on evicted capacity (DESIGN §4.3).

A pending workload that earlier evictions were made for is served first: bound if it now fits on
free capacity, otherwise the capacity it will use once its victims stop stays held for it.
Capacity freed by eviction belongs to the workload it was freed for until it binds; limits still
apply, but not its fair share: a recompute that lowered the share a little since the eviction
(its gang no longer fits within it) does not hand the freed GPUs back to the victim's queue.

The claim stands in the first cycle after its victims have stopped too (`snapshot`: an
eviction whose victim is no longer running): the beneficiary binds first on the capacity they
freed, and each such victim, if it waits again, is not bound beyond its queue's share in that
cycle (`cycle_allocate`). A claim that does not fit then (the capacity went away, a limit)
lapses: the workload competes as usual. What claims take is kept apart in the queue's book
(`claimed_cu`): it does not make the queue's other work a reclaim victim in the same cycle.

Where the gang would go once its victims stop is the placement after their release. On a type where
no pod of the gang has room now (the usual case: the pool is full), only the nodes they free can
take it, and it is worked out among those without releasing anything (`placement_release`; for one
victim pod and a one-pod claimant, on that node alone); otherwise the victims are released under a
journal, placed, restored. Once a claim's trial is settled (`_Memo`), its claims are decided in
`honour_claims`' own loop: the common claim goes straight to its victim's node
(`_hold_on_victim_node`: no plan list, no `PodUse`); a gang or a claim of several victim pods,
of whole GPUs, is placed among the nodes its victims free from their own lists
(`_hold_on_freed_nodes`: no `ReleasedNode`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from operator import attrgetter

from gpufair.domain.capacity import Journal, PodUse, ReleasedNode
from gpufair.domain.cycle_state import CycleState, Pending
from gpufair.domain.placement_ask import Exclusion
from gpufair.domain.placement_release import (
    UNDECIDED,
    only_released,
    place_on_freed_nodes,
    place_one_released,
    place_released,
    released_shared_gpu,
    released_whole_gpus,
)
from gpufair.domain.victim_search import Victim

_uses = attrgetter("uses")  # a victim's pods


def honour_claims(state: CycleState) -> None:
    memo = _Memo()
    exclusion = Exclusion()  # claims may use every node; never changed, so shared
    journal = Journal()  # emptied by each `restore`
    settled = memo.settled
    leaving_for = state.leaving_for
    for item in state.in_queue_order(state.claimants):
        book = item.book
        before_cu = book.allocated_cu
        pods = settled.get(item.trial >> 1)  # by the trial's identity (`Kind.trial_keys`)
        if pods is not None:
            # A claim of a trial settled both ways is decided before anything else of its turn
            # is looked at: no type is tried on free capacity, and only the nodes its victims
            # free are candidates (for the common claim, the victim's node). Any claim those
            # paths do not take has its turn in `_serve`.
            leaving = leaving_for.get(item.uid)
            if not leaving:
                book.claimed_cu += book.allocated_cu - before_cu
                continue  # every victim has stopped and the claim did not fit: it lapses
            if pods == 1 and len(leaving) == 1:  # the common claim: one pod for one pod
                uses = leaving[0].uses
                if len(uses) == 1 and not uses[0].slice_mask:
                    _hold_on_victim_node(state, item, uses[0], None)
                    book.claimed_cu += book.allocated_cu - before_cu
                    continue
            if item.kind.shape.whole_gpus and _hold_on_freed_nodes(state, item, pods, leaving):
                book.claimed_cu += book.allocated_cu - before_cu
                continue
        _serve(state, item, memo, exclusion, journal)
        book.claimed_cu += book.allocated_cu - before_cu


@dataclass(slots=True)
class _Memo:
    """What the phase learns of placement problems, kept for its later claims. Free capacity
    only shrinks in this phase (what a claimant's victims hold is released only under a
    journal, and restored), so a kind that did not fit free capacity on a type does not fit it
    later in the phase: (GPU type, kind's memo key) in `no_free_fit`. For the same reason a
    type found without room for one pod of a kind stays so (`released_only`): the placements of
    that kind after its victims' release are decided among the nodes they free
    (`placement_release`). Per trial (`Kind.trial`, by identity), the same once true of all
    its types: `settled_free` (none fits free capacity: the first try is skipped) and
    `settled_released` (each is decided among the nodes freed: the common claim, one pod for
    one victim pod, goes straight to the victim's node, a claim of whole GPUs among the nodes
    its victims free); `settled`: both, with the trial's gang size (its `memo_key` holds it)."""

    no_free_fit: set[tuple[object, ...]] = field(default_factory=set)
    released_only: set[tuple[object, ...]] = field(default_factory=set)
    settled_free: set[int] = field(default_factory=set)
    settled_released: set[int] = field(default_factory=set)
    settled: dict[int, int] = field(default_factory=dict)  # trial → its gang's minimum pods


def _serve(
    state: CycleState, item: Pending, memo: _Memo, exclusion: Exclusion, journal: Journal
) -> None:
    """Bind the claimant on free capacity, or hold what its victims still occupy."""
    kind = item.kind
    trial = id(kind.trial)
    # The pods the queue's limits allow per type, asked only of the types tried (nothing
    # changes the queue's book before the bind or hold that ends the claim's turn); a type
    # whose kind did not fit free capacity earlier in the phase is not tried on it again.
    allowed: dict[str, int] = {}
    pods_min = item.workload.gang_min_pods
    memo_key = kind.memo_key
    types = kind.types
    no_free_fit = memo.no_free_fit
    if trial not in memo.settled_free:
        for gpu_type in types:
            key = (gpu_type, memo_key)
            if key in no_free_fit:
                continue
            pods = allowed[gpu_type] = state.pods_allowed(item, gpu_type, within_share=False)
            if pods < pods_min:
                continue
            plan = state.place(item, gpu_type, pods, exclusion)
            if plan is not None:
                state.bind(item, gpu_type, plan)
                return
            no_free_fit.add(key)
        if all((gpu_type, memo_key) in no_free_fit for gpu_type in types):
            memo.settled_free.add(trial)
            if trial in memo.settled_released:
                memo.settled[trial] = pods_min
    leaving = state.leaving_for.get(item.uid)
    if not leaving:
        return  # every victim has stopped and the claim did not fit: it lapses
    shape = kind.shape
    # The common claim: one pod for one victim pod (`place_one_released`).
    one: PodUse | None = None
    if pods_min == 1 and (shape.whole_gpus or shape.shares_gpu) and len(leaving) == 1:
        uses = leaving[0].uses
        if len(uses) == 1 and not uses[0].slice_mask:
            one = uses[0]
    if one is not None and trial in memo.settled_released:
        _hold_on_victim_node(state, item, one, allowed)
        return
    held = _where_released(state, item, memo, leaving, one, allowed, exclusion, journal)
    if trial not in memo.settled_released and all(
        (gpu_type, memo_key) in memo.released_only for gpu_type in types
    ):
        memo.settled_released.add(trial)
        if trial in memo.settled_free:
            memo.settled[trial] = pods_min
    if held is not None:
        state.hold(item, *held)


def _hold_on_victim_node(
    state: CycleState, item: Pending, one: PodUse, allowed: dict[str, int] | None
) -> None:
    """What `_where_released` comes to for the common claim (one pod for the one pod `one`)
    when every type of its trial is decided among the freed nodes: the victim's node is the
    one candidate, on its type (`place_one_released`), and the pod is held there
    (`CycleState.hold_one`). Hot (8,054 of 9,576 claims at 4,000 nodes): for whole GPUs the
    placement is `released_whole_gpus` (sharing a GPU: `released_shared_gpu`), and the pod is
    held from its fields: no plan list, no `PodUse`; `allowed`: the pods allowed per type
    already asked in the turn (None: none)."""
    index = one.node
    node = state.capacity.nodes[index]
    gpu_type = node.gpu_type
    kind = item.kind
    if gpu_type not in kind.types:
        return
    if _pods(state, item, gpu_type, allowed) < 1:
        return
    shape = kind.shape
    if shape.whole_gpus:
        gpus = released_whole_gpus(node, shape, one)
        if gpus is None:
            return
        amount = 1.0
    else:
        gpu = released_shared_gpu(node, shape, one)
        if gpu is None:
            return
        gpus = (gpu,)
        amount = shape.gpus_per_pod
    state.hold_one(item, gpu_type, index, gpus, amount, shape.cpu_millicores, shape.memory_mib)


def _hold_on_freed_nodes(
    state: CycleState, item: Pending, pods: int, leaving: list[Victim]
) -> bool:
    """What `_where_released` comes to for a claim of whole-GPU pods (a gang of `pods`) when
    every type of its trial is decided among the freed nodes: the gang is placed among the
    nodes its victims `leaving` free (`place_on_freed_nodes`: from the nodes' own lists, no
    `ReleasedNode`) on the first type of the trial that takes it, and held there. False,
    nothing done, where that does not say (a victim's partition, or a node two victims free
    beside others: `Capacity.released` orders those) and `_serve` takes the claim."""
    capacity = state.capacity
    nodes = capacity.nodes
    freed: dict[int, list[PodUse]] = {}  # the victims' pods by node, in the order first touched
    first: dict[int, int] = {}  # the victim (its place in `leaving`) that first touched a node
    types: set[str] = set()  # the GPU types of the nodes in `freed`
    shared = False
    for number, victim in enumerate(leaving):
        for use in victim.uses:
            if use.slice_mask:
                return False
            index = use.node
            found = freed.get(index)
            if found is None:
                freed[index] = [use]
                first[index] = number
                types.add(nodes[index].gpu_type)
            else:
                found.append(use)
                shared = shared or first[index] != number
    if shared and len(freed) > 1:
        return False
    kind = item.kind
    allowed: dict[str, int] = {}
    for gpu_type in kind.types:
        if gpu_type not in types or _pods(state, item, gpu_type, allowed) < pods:
            continue  # no room on the type now, and the victims free none there; or limits
        plan = place_on_freed_nodes(capacity, gpu_type, kind.shape, pods, freed)
        if plan is not None:
            state.hold(item, gpu_type, plan)
            break
    return True


def _where_released(
    state: CycleState,
    item: Pending,
    memo: _Memo,
    leaving: list[Victim],
    one: PodUse | None,
    allowed: dict[str, int],
    exclusion: Exclusion,
    journal: Journal,
) -> tuple[str, list[PodUse]] | None:
    """Where the gang goes once its victims `leaving` stop, if anywhere: on a type with no
    room for one pod now, only the nodes they free count, decided without releasing them
    (`placement_release`; `one`: the claim is one pod for that one victim pod); any other type
    the general way, by a release under the journal (then for the rest of the turn)."""
    capacity = state.capacity
    strategy = state.strategy
    pods_min = item.workload.gang_min_pods
    kind = item.kind
    memo_key = kind.memo_key
    shape = kind.shape
    held: tuple[str, list[PodUse]] | None = None
    released: dict[int, ReleasedNode] | None = None
    freed: set[str] = set()  # the GPU types of the nodes in `released`
    simulated = True  # whether `released` can say (no partition among the victims' uses)
    in_journal = False
    try:
        for gpu_type in kind.types:
            if simulated and not in_journal:
                key = (gpu_type, memo_key)
                fast = key in memo.released_only
                # One pod that did not fit free capacity fits nowhere there (no topology).
                if not fast and only_released(
                    capacity,
                    gpu_type,
                    shape,
                    item.workload.topology,
                    state.pool.topology_levels,
                    strategy,
                    pods_min == 1 and key in memo.no_free_fit,
                ):
                    memo.released_only.add(key)
                    fast = True
                if fast and one is not None:
                    if capacity.nodes[one.node].gpu_type != gpu_type:
                        continue  # no room on the type now, and the victim frees none there
                    if _pods(state, item, gpu_type, allowed) < pods_min:
                        continue
                    plan = place_one_released(capacity, shape, one)
                    if plan is None:
                        continue
                    held = (gpu_type, plan)
                    break
                if fast and released is None:
                    released = capacity.released(map(_uses, leaving))
                    simulated = released is not None
                    if released is not None:
                        freed = {node.state.gpu_type for node in released.values()}
                if fast and released is not None:
                    if gpu_type not in freed:
                        continue  # no room on the type now, and the victims free none there
                    if _pods(state, item, gpu_type, allowed) < pods_min:
                        continue
                    plan = place_released(capacity, gpu_type, shape, pods_min, released)
                    if plan is None:
                        continue
                    if plan is not UNDECIDED:
                        held = (gpu_type, plan)
                        break
            if _pods(state, item, gpu_type, allowed) < pods_min:
                continue
            if not in_journal:
                for victim in leaving:
                    capacity.release(victim.uses, journal)
                in_journal = True
            plan = state.place(item, gpu_type, pods_min, exclusion)
            if plan is not None:
                held = (gpu_type, plan)
                break
    finally:
        if in_journal:
            capacity.restore(journal)
    return held


def _pods(state: CycleState, item: Pending, gpu_type: str, allowed: dict[str, int] | None) -> int:
    """The pods the queue's limits allow `item` on `gpu_type`, asked once per turn (`allowed`:
    the answers so far; None: none kept, one ask); where no limit can cap the work
    (`QueueBook.never_caps`) all its pods, without those calls."""
    workload = item.workload
    if item.book.never_caps(workload.preemptible):
        return workload.pods
    if allowed is None:
        return state.pods_allowed(item, gpu_type, False)
    pods = allowed.get(gpu_type)
    if pods is None:
        pods = allowed[gpu_type] = state.pods_allowed(item, gpu_type, False)
    return pods
