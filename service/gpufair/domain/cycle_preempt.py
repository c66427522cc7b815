"""Phase 3 of the cycle: preempt (DESIGN §4.4).

Inside one queue, pending work evicts preemptible work of a lower priority class (past
`min_runtime_s`), if the queue ends within its fair share or does not grow. `victim_search` picks
the victims, lowest class and most recent first.

A failed preemption of a workload kind on a GPU type is remembered for the rest of the phase in
its queue, and a workload whose every type is remembered so (or has no victims) is not tried;
a queue's first search on a type, and any for pods of two GPUs or more, is not made (nor, at the
first, its victims indexed) when those victims could not free a pod's whole GPUs on enough nodes
(`_room_short`).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Collection, Iterable, Iterator
from operator import attrgetter

from gpufair.domain.capacity import EPS, Capacity
from gpufair.domain.cycle_evict import commit
from gpufair.domain.cycle_state import CycleState, Pending
from gpufair.domain.placement import Ask, Exclusion
from gpufair.domain.snapshot import EvictReason, PendingCode
from gpufair.domain.victim_search import Victim, VictimBudget, VictimIndex, select_victims

_by_order = attrgetter("order")


def preempt(state: CycleState) -> None:
    now_s = state.snapshot.now_s
    own: dict[tuple[str, str], list[Victim]] = {}  # (queue, GPU type) → its victims
    leaving, evicted = state.leaving, state.evicted
    for running in state.running.values():
        victim = running.victim
        if (
            running.preemptible
            and now_s - victim.started_at_s >= running.min_runtime_s
            and victim.uid not in leaving
            and victim.uid not in evicted
        ):
            own.setdefault((victim.queue, victim.gpu_type), []).append(victim)
    lowest: dict[str, int] = {}
    lowest_on: dict[tuple[str, str], int] = {}  # (queue, GPU type) → its lowest class
    for key, victims in own.items():
        found = lowest_on[key] = min(victim.priority_class for victim in victims)
        lowest[key[0]] = min(lowest.get(key[0], found), found)
    state.preempt_own = own
    for key, victims in own.items():
        totals: dict[int, list[float]] = {}
        for victim in victims:
            sums = totals.setdefault(victim.priority_class, [0.0, 0.0])
            sums[0] += victim.cu
            sums[1] += victim.gpus
        state.preempt_totals[key] = totals
    failed: set[tuple[object, ...]] = set()
    budgets: dict[tuple[str, int], VictimBudget] = {}
    # Per queue, the trials (`Pending.trial`, either preemptibility: types and placement
    # problem, all the test reads of a kind) whose every type has no victims in the queue or
    # failed in the memo: a later workload of one in that queue would only pass over them
    # again, so it is not tried (both only hold more as the phase goes on).
    dead: dict[str, set[int]] = {}
    # The queues that have victims, in the order of `CycleState.by_queue_order`; each queue's
    # workloads that want to preempt (`_Wanting`) are read in place as they come (what a
    # workload is then is what it was when the phase began: a try changes only its own), and
    # the queues tied in the order are merged by workload order.
    pending = state.queue_pending
    for run in state.queue_runs(name for name in pending if name in lowest):
        if len(run) == 1:
            name = run[0]
            _preempt_queue(
                state,
                _wanting(pending[name], name, lowest[name], lowest_on),
                dead.setdefault(name, set()),
                failed,
                budgets,
            )
            continue
        wanted = [list(_wanting(pending[name], name, lowest[name], lowest_on)) for name in run]
        for item in heapq.merge(*wanted, key=_by_order):
            _preempt_queue(state, (item,), dead.setdefault(item.book.name, set()), failed, budgets)
    # Only this phase reads them: later evictions need not keep them current.
    state.preempt_index = {}
    state.preempt_totals = {}


def _wanting(
    items: list[Pending], name: str, floor: int, lowest_on: dict[tuple[str, str], int]
) -> Iterator[Pending]:
    """The workloads of queue `name` (its `items`, in order) that want to preempt: not placed,
    its reason still no room or over its share, with someone to preempt at all on a type it
    could use. A workload without one could only fail (no class below its own on any of its
    types), and later workloads of its queue, of no higher class, fail the same way whatever
    it left in the memo. The type test is the same for every workload of the queue with the
    same kind (so types) and class: answered once per (kind, class). A queue's workloads are
    sorted by (-priority class, submit time, uid) (`cycle_load`), so its first at or below the
    `floor` (its victims' lowest class) ends its list. Neighbours in a queue's list are mostly
    of one kind and class: the last answer is kept."""
    codes = (PendingCode.NO_CAPACITY, PendingCode.OVER_FAIR_SHARE)
    on_some_type: dict[tuple[int, int], bool] = {}
    last_kind: object = None
    last_class = 0
    answer = False
    for item in items:
        priority_class = item.workload.priority_class
        if priority_class <= floor:
            return
        if item.done or item.code not in codes:
            continue
        kind = item.kind
        if kind is not last_kind or priority_class != last_class:
            last_kind, last_class = kind, priority_class
            asked = (id(kind), priority_class)
            known = on_some_type.get(asked)
            if known is None:
                known = on_some_type[asked] = any(
                    priority_class > lowest_on.get((name, gpu_type), math.inf)
                    for gpu_type in kind.types
                )
            answer = known
        if answer:
            yield item


def _preempt_queue(
    state: CycleState,
    items: Iterable[Pending],
    dead: set[int],
    failed: set[tuple[object, ...]],
    budgets: dict[tuple[str, int], VictimBudget],
) -> None:
    """`_try_preempt` each of `items` (of one queue, whose dead trials are `dead`) in turn,
    but those of a trial found dead; a trial is found dead after a try that evicted nothing
    when each of its types has no victims in the queue or failed in the memo (`failed`)."""
    own = state.preempt_own
    for item in items:
        trial = item.trial
        if trial in dead or _try_preempt(state, item, failed, budgets):
            continue
        name = item.book.name
        memo_key = item.kind.memo_key
        if all(
            (name, gpu_type) not in own or (name, gpu_type, memo_key) in failed
            for gpu_type in item.types
        ):
            dead.add(trial)
            dead.add(trial ^ 1)


# Preemption reads no held nodes (every node is open to the workload's search).
_NOTHING_EXCLUDED = Exclusion()


def _try_preempt(
    state: CycleState,
    item: Pending,
    failed: set[tuple[object, ...]],
    budgets: dict[tuple[str, int], VictimBudget],
) -> bool:
    """Evict victims of `item`'s queue for it on the first of its types where a search finds
    some. `budgets`: one per (queue, priority class), made at its first search and given to the
    next: a search only ever spends a copy (`victim_search._greedy`)."""
    workload = item.workload
    book = item.book
    name = book.name
    kind = item.kind
    memo_key = kind.memo_key
    pods = workload.gang_min_pods
    below = workload.priority_class
    own = state.preempt_own
    # The kind's CU per pod on each type is the workload's (`CycleState.cu_per_pod`).
    for gpu_type, cu_per_pod in zip(kind.types, kind.cu_per_pod, strict=True):
        # A queue's work comes in falling priority class: a shape that found no victims at
        # one class finds none at a lower one (fewer victims, less capacity).
        victims = own.get((name, gpu_type))
        key = (name, gpu_type, memo_key)
        if not victims or key in failed:
            continue
        if state.pods_allowed(item, gpu_type, within_share=False) < pods:
            continue
        # Cheap necessary conditions before any search: enough GPUs could be freed, and the
        # swap could keep the queue within its share or from growing.
        needed_cu = pods * cu_per_pod
        most_cu = most_gpus = 0.0
        for priority_class, (cu, gpus) in state.preempt_totals[(name, gpu_type)].items():
            if priority_class < below:
                most_cu += cu
                most_gpus += gpus
        free_gpus = state.capacity.free_whole_by_type.get(gpu_type, 0)
        swap_ok = book.allocated_cu - most_cu + needed_cu <= book.fair_share_cu + EPS
        if (
            most_cu <= 0.0
            or (
                kind.shape.gpus_per_pod >= 1.0
                and free_gpus + most_gpus < pods * kind.shape.gpus_per_pod - EPS
            )
            or not (swap_ok or needed_cu <= most_cu + EPS)
        ):
            failed.add(key)
            continue
        leaving = state.leaving_for.get(item.uid, [])
        index = state.preempt_index.get((name, gpu_type))
        # No search (nor, at the first, an index of the queue's victims of the type) when those
        # victims could not make room for the gang whatever is chosen: asked at the first
        # search, and again at each for pods of two GPUs or more, which most often fail so
        # (a full node's victims of a lower class seldom free that much of it).
        if (
            not leaving
            and (index is None or kind.shape.whole_gpus > 1 or kind.shape.shares_gpu)
            and _room_short(state, item, gpu_type, victims)
        ):
            failed.add(key)
            continue
        if index is None:
            index = VictimIndex(victims, state.capacity)
            state.preempt_index[(name, gpu_type)] = index
        budget = budgets.get((name, below))
        if budget is None:
            budget = budgets[name, below] = VictimBudget(
                {name: math.inf}, {}, below_priority_class=below
            )
        selection = select_victims(
            state.capacity,
            # The ask the search makes of any: exactly the gang minimum, no pool levels.
            Ask(item.shape, gpu_type, pods, pods, workload.topology),
            state.strategy,
            _NOTHING_EXCLUDED,
            index=index,
            budget=budget,
            already_leaving=[victim.uses for victim in leaving] if leaving else (),
        )
        if selection is None or not selection.victims:
            failed.add(key)
            continue
        freed_cu = selection.cu
        # A swap inside the queue: it must end within its share, or at least not grow.
        within = book.allocated_cu - freed_cu + needed_cu <= book.fair_share_cu + EPS
        if not (within or needed_cu <= freed_cu + EPS):
            continue
        commit(state, item, gpu_type, selection, EvictReason.PREEMPT, bool(leaving))
        return True
    return False


def _room_short(state: CycleState, item: Pending, gpu_type: str, victims: list[Victim]) -> bool:
    """True when the gang minimum of `item`'s whole-GPU pods could not fit on `gpu_type` even
    with every victim of a lower priority class gone, so the search would find nothing. Per
    node, at most its free whole GPUs plus the GPUs such victims use there can be free, so no
    more pods than that sum over the pool: the pool's free-GPU buckets, each victim node
    counted again with its victims' GPUs (read only when the buckets alone fall short). Pods
    that share a GPU: `share_room_short`; pods of a partition or of no GPU are not bounded
    here (False)."""
    shape = item.shape
    whole = shape.whole_gpus
    if shape.profile:
        return False
    if shape.shares_gpu:
        workload = item.workload
        return share_room_short(
            state.capacity,
            gpu_type,
            shape.gpus_per_pod,
            workload.gang_min_pods,
            workload.priority_class,
            victims,
            state.evicted,
        )
    if not whole:
        return False
    needed = item.workload.gang_min_pods
    capacity = state.capacity
    pods = sum(
        len(capacity.bucket(gpu_type, free)) * (free // whole)
        for free in range(whole, capacity.max_gpus.get(gpu_type, 0) + 1)
    )
    if pods >= needed:
        return False
    below = item.workload.priority_class
    evicted = state.evicted
    nodes = capacity.nodes
    # Per node, its free whole GPUs and the GPUs its victims use so far (a GPU twice if
    # shared): each victim read adds what it can to the bound, until the gang fits.
    freeable: dict[int, int] = {}
    for victim in victims:
        if victim.priority_class >= below or victim.uid in evicted:
            continue
        for use in victim.uses:
            node = use.node
            before = freeable.get(node)
            if before is None:
                before = nodes[node].free_whole
            after = freeable[node] = before + len(use.gpu_indices)
            pods += after // whole - before // whole
        if pods >= needed:
            return False
    return True


# Rounding allowance of `share_room_short`, wider than `fit_on`'s: the bound may count a pod
# that does not fit, never miss one that does.
_SHARE_SLACK = 1e-6


def share_room_short(
    capacity: Capacity,
    gpu_type: str,
    share: float,
    needed: int,
    below: int,
    victims: list[Victim],
    evicted: Collection[str] = (),
) -> bool:
    """`_room_short` for pods of `share` of a GPU: True when, even with every victim of a
    priority class below `below` gone (but those `evicted`), the GPUs of `gpu_type` could not
    hold `needed` of them, so the search would find nothing. Only
    bounded when no GPU of the type has room now (none free, none part-used): then a pod can
    only go on a GPU such victims use, and each such GPU holds at most as many pods as its room
    with them gone allows (CPU and memory not read, a partition taken as freeing its GPU). A
    GPU held for a claim over a victim that still runs keeps its use after the victim goes:
    the common failure this spares the search of."""
    if capacity.free_whole_by_type.get(gpu_type, 0) or capacity.partial_nodes(gpu_type):
        return False
    nodes = capacity.nodes
    left: dict[tuple[int, int], float] = {}  # per (node, GPU) its use, the victims read gone
    pods = 0
    for victim in victims:
        if victim.priority_class >= below or victim.uid in evicted:
            continue
        for use in victim.uses:
            amount = 1.0 if use.slice_mask else use.gpu_amount
            for gpu in use.gpu_indices:
                key = (use.node, gpu)
                before = left.get(key)
                if before is None:
                    before = nodes[use.node].gpu_used[gpu]
                after = left[key] = before - amount
                pods += _shares(after, share) - _shares(before, share)
        if pods >= needed:
            return False
    return True


def _shares(used: float, share: float) -> int:
    """Pods of `share` of a GPU that a GPU so used could hold, counted generously."""
    room = 1.0 - used
    return int((room + _SHARE_SLACK) / share) if room >= share - _SHARE_SLACK else 0
