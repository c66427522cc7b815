"""Phases 1 and 5 of the cycle: allocate within fair share, then beyond it (DESIGN §4.1).

Queues by priority tier (highest first), then lowest allocated/fair-share ratio, then the oldest
next workload, then queue age; after each bind the queue's ratio is updated and it rejoins the
order. Inside a queue: priority class (highest first), then submit time. A workload is admitted
when its queue stays within its fair share (non-preemptible work also within deserved), within
its limits, and the whole gang fits (`placement`). A queue is left for the pass once its remaining
share is below the smallest CU any of its remaining workloads could take.

The work-conserving pass (phase 5) gives what nobody within their share could use, in the same
order, to any queue within its limits, except on `GANG_WAIT` nodes. Such binds are flagged
`over_fair_share`; their queues sit above their share, so reclaim takes them first.
Exact ties in this pass are not decided by queue name (`CycleState.queue_key`).
Non-preemptible work never goes beyond the fair share, nor does a workload evicted for a claim
that still stands (`cycle_claims`): the capacity it left is its beneficiary's.

A workload tries its types cheapest first (DESIGN §4.2), except that one with several types
tries last a type whose free GPUs, less its own, would not cover what pending work that can use
only that type waits for (`cycle_contention`): it takes that type only when none of its other
types holds it. That waiting demand is read once per cycle, at the first pass.

Speed: in a queue's turn that binds nothing, one try per trial (`Pending.trial`) stands for all
its workloads; a trial whose every type already failed placement in the pass (in any queue) is
not tried at all: its reason is read off the queue's limits alone (`_code_when_full`), which is
what the try would find, and beyond the share for work no limit caps not read at all
(`QueueBook.never_caps`: it keeps its reason). A workload of a trial already answered in
the turn costs one look-up. In the cycle after a steady one nearly every try is such a one.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left
from collections.abc import Callable
from operator import length_hint

from gpufair.domain.capacity import EPS
from gpufair.domain.cycle_contention import bound_exclusive, exclusive_demand, type_order
from gpufair.domain.cycle_state import CycleState, Pending
from gpufair.domain.placement_ask import Exclusion
from gpufair.domain.snapshot import PendingCode


def allocate(state: CycleState, within_share: bool) -> None:
    exclusion = Exclusion(gang_held=state.gang_held, beyond_share=not within_share)
    # What single-type work waits for, per type, read once per cycle: work with several types
    # tries such a type after its others while taking it would leave less (`cycle_contention`).
    if within_share:
        state.exclusive_gpus = exclusive_demand(
            state.queue_pending.values(), state.kinds.values(), state.capacity
        )
    cursor = dict.fromkeys(state.queue_pending, 0)
    rotate = not within_share
    heap = [(state.queue_key(name, 0, rotate), name) for name in state.queue_pending]
    heapq.heapify(heap)
    # A claim that still stands keeps its victims out of the pass beyond share (`cycle_claims`).
    excluded = state.claim_victims if not within_share else {}
    # Trials (`Pending.trial | 1`: either preemptibility) whose every type failed placement in
    # this pass (`_every_type_full`): a try of one can only fail, and its reason is read off the
    # queue's limits alone (`_code_when_full`), in any queue. Failures only grow in a pass.
    full: set[int] = set()
    while heap:
        _, name = heapq.heappop(heap)
        items = state.queue_pending[name]
        end = len(items)
        start = cursor[name]
        book = state.books[name]
        # Nothing from the first position whose suffix needs more CU than the queue's remaining
        # share fits in it; the suffix minima only grow, so that position is found by bisection
        # (the headroom is read once: until this pop binds, the book does not change).
        cut = end
        if within_share:
            headroom = book.headroom_cu()
            cut = bisect_left(
                state.suffix_min_cu[name], True, start, end, key=_needs_more(headroom)
            )
        # Beyond the share no limit caps the queue's preemptible work (`QueueBook.never_caps`;
        # `Pending.trial & 1`): a try of its trial known full leaves no reason (None), asked of
        # no limits.
        uncapped = not within_share and book.never_caps(True)
        # Until this pop binds, neither the queue's book nor the capacity changes, so a
        # workload of the same trial (types and placement problem, `Kind.trial`) and
        # preemptibility fails as the first did: the reason code it leaves (None: it keeps its
        # own) is reused, not recomputed; kept by `Pending.trial`. The loop reads little of a
        # workload of a failed trial (one look-up): most of a pass's workloads are of one.
        failed: dict[int, PendingCode | None] = {}
        known = failed.get
        # The trials of this queue left `NO_CAPACITY` (within the share only): all the workloads
        # that can want reclaim are of one (`CycleState.short_trials`, `cycle_reclaim`).
        short = state.short_trials.get(name) if within_share else None
        if short is None and within_share:
            short = state.short_trials[name] = set()
        resume = end  # all tried, or nothing left here fits in the remaining share
        # The items from `start` to `cut`; a bind's position is read off what the iterator
        # has left (`length_hint`), so the loop counts nothing per item.
        walk = iter(items if start == 0 and cut == end else items[start:cut])
        # A pop binds at most one workload; the queue then rejoins the order with its new
        # ratio, so queues take turns exactly as DESIGN §4.1 orders them.
        for item in walk:
            code = known(item.trial, _UNTRIED)
            if code is not _UNTRIED:
                if code is not None and not item.done and not (excluded and item.uid in excluded):
                    item.code = code
                continue
            if item.done or (excluded and item.uid in excluded):
                continue
            trial = item.trial
            if trial | 1 in full:
                if uncapped and trial & 1:
                    failed[trial] = None
                    continue
                code = failed[trial] = _code_when_full(state, item, within_share)
                if code is not None:
                    item.code = code
                    if code is _SHORT and short is not None:
                        short.add(trial)
                continue
            failure = _try_bind(state, item, within_share, exclusion)
            if failure is None:
                resume = cut - length_hint(walk)  # the position after the bound item
                break
            code = failed[trial] = _code_left(failure, within_share)
            if code is not None:
                item.code = code
                if code is _SHORT and short is not None:
                    short.add(trial)
            if _every_type_full(state, item, within_share):
                full.add(trial | 1)
        cursor[name] = resume
        if resume < end:
            heapq.heappush(heap, (state.queue_key(name, resume, rotate), name))


# A trial not yet tried in a queue's turn (`failed` holds None for "keeps its own reason").
_UNTRIED = PendingCode.WAITING_FOR_EVICTED_CAPACITY
_SHORT = PendingCode.NO_CAPACITY


Failure = tuple[bool, PendingCode | None]  # no room on some type; the first cap met


def _try_bind(
    state: CycleState, item: Pending, within_share: bool, exclusion: Exclusion
) -> Failure | None:
    """Bind `item` on its first type that admits and fits it (None), or say why not. Once
    some type had no room, a type where this kind is known not to fit is not asked about the
    queue's limits: `_code_left` reads the first cap only when no type had room."""
    workload = item.workload
    kind = item.kind
    pods_min = workload.gang_min_pods
    capped: PendingCode | None = None
    no_room = False
    place_failed = state.place_failed
    # Cheapest first, but a type single-type work waits for after the others while some type
    # has such demand (`cycle_contention`); `kind.types` itself when none is moved.
    types = kind.types
    exclusive = state.exclusive_gpus
    if exclusive and len(types) > 1:
        free = state.capacity.free_whole_by_type
        types = type_order(types, workload.pods * workload.gpus_per_pod, exclusive, free)
    for gpu_type in types:
        key = (within_share, gpu_type, id(kind.memo_key))  # one object per problem: `kind_of`
        if no_room and key in place_failed:
            continue  # no room here either, or a cap: the answer is no room whichever
        allowed, code = state.max_pods(item.book, workload, gpu_type, within_share)
        allowed = min(allowed, workload.pods)
        if allowed < pods_min:
            capped = capped or code
            continue
        if key in place_failed:
            no_room = True
            continue
        plan = state.place(item, gpu_type, allowed, exclusion)
        if plan is None:
            state.place_failed.add(key)
            no_room = True
            continue
        state.bind(item, gpu_type, plan)
        if exclusive:
            bound_exclusive(exclusive, item)
        return None
    if capped is not None and not no_room and types is not kind.types:
        # Every type capped, tried in another order: the first cap cheapest first, as
        # `_code_when_full` reads it (so the order changes no reason).
        capped = _first_cap(state, item, within_share)
    return (no_room, capped)


def _first_cap(state: CycleState, item: Pending, within_share: bool) -> PendingCode | None:
    """The first limit code of the queue's answers for `item` on its types, cheapest first."""
    for gpu_type in item.kind.types:
        _, code = state.max_pods(item.book, item.workload, gpu_type, within_share)
        if code is not None:
            return code
    return None


def _every_type_full(state: CycleState, item: Pending, within_share: bool) -> bool:
    """Whether a placement of `item`'s trial failed on each of its types in this pass (the
    keys of `_try_bind`)."""
    memo = id(item.kind.memo_key)
    place_failed = state.place_failed
    return all((within_share, gpu_type, memo) in place_failed for gpu_type in item.kind.types)


def _code_when_full(state: CycleState, item: Pending, within_share: bool) -> PendingCode | None:
    """`_code_left` of a failed `_try_bind` of `item` when every one of its types is known to
    have no room (`_every_type_full`): the try asks the queue's limits type by type until one
    allows the gang minimum (then no room: `NO_CAPACITY` within the share, None beyond it), and
    keeps the first cap met before (the answer when every type is capped). Without a placement
    to try, the same answer. Not asked beyond the share for work no limit caps (`allocate`
    answers None: `QueueBook.never_caps`)."""
    book = item.book
    workload = item.workload
    pods_min = workload.gang_min_pods
    whole = workload.pods >= pods_min  # `min(allowed, pods) >= pods_min`, without the call
    capped: PendingCode | None = None
    for gpu_type in item.kind.types:
        allowed, code = state.max_pods(book, workload, gpu_type, within_share)
        if allowed >= pods_min and whole:
            return PendingCode.NO_CAPACITY if within_share else None
        capped = capped or code
    return capped


def _needs_more(headroom: float) -> Callable[[float], bool]:
    """Whether a suffix whose least CU is the argument needs more than `headroom` CU."""

    def needs_more(least_cu: float) -> bool:
        return headroom < least_cu - EPS

    return needs_more


def _code_left(failure: Failure, within_share: bool) -> PendingCode | None:
    """The reason a failed try leaves on its workload, None to keep the one it has: within
    the share, no room on some type is `NO_CAPACITY`, else the first cap met; beyond it, only
    a hard cap (a plain lack of room keeps the first reason)."""
    no_room, capped = failure
    if within_share:
        return PendingCode.NO_CAPACITY if no_room else capped
    return capped if not no_room else None
