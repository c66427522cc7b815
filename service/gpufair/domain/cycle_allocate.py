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
"""

from __future__ import annotations

import heapq
import math

from gpufair.domain.capacity import EPS
from gpufair.domain.cycle_state import CycleState, Pending
from gpufair.domain.placement import Exclusion
from gpufair.domain.snapshot import PendingCode


def allocate(state: CycleState, within_share: bool) -> None:
    exclusion = Exclusion(gang_held=state.gang_held, beyond_share=not within_share)
    cursor = dict.fromkeys(state.queue_pending, 0)
    rotate = not within_share
    heap = [(state.queue_key(name, 0, rotate), name) for name in state.queue_pending]
    heapq.heapify(heap)
    claim_victims = state.claim_victims
    while heap:
        _, name = heapq.heappop(heap)
        items = state.queue_pending[name]
        end = len(items)
        suffix = state.suffix_min_cu[name]
        book = state.books[name]
        position = cursor[name]
        bound = False
        # Until this pop binds, neither the queue's book nor the capacity changes, so a
        # workload of the same kind (shape, gang, types) and preemptibility fails as the
        # first did: its outcome is reused, not recomputed; and the queue's headroom is read
        # once.
        failures: dict[tuple[int, bool], Failure] = {}
        headroom = book.headroom_cu() if within_share else math.inf
        # A pop binds at most one workload; the queue then rejoins the order with its new
        # ratio, so queues take turns exactly as DESIGN §4.1 orders them.
        while position < end:
            if headroom < suffix[position] - EPS:
                position = end  # nothing left here fits in the remaining share
                break
            item = items[position]
            position += 1
            if item.done or (not within_share and item.uid in claim_victims):
                continue  # a claim that still stands keeps its victims out (`cycle_claims`)
            key = (id(item.kind), item.workload.preemptible)
            failure = failures.get(key)
            if failure is None:
                failure = _try_bind(state, item, within_share, exclusion)
                if failure is None:
                    bound = True
                    break
                failures[key] = failure
            no_room, capped = failure
            if within_share:
                if no_room:
                    item.code = PendingCode.NO_CAPACITY
                elif capped is not None:
                    item.code = capped
            elif capped is not None and not no_room:
                item.code = capped  # a hard cap; a plain lack of room keeps the first reason
        cursor[name] = position
        if bound and position < end:
            heapq.heappush(heap, (state.queue_key(name, position, rotate), name))


Failure = tuple[bool, PendingCode | None]  # no room on some type; the first cap met


def _try_bind(
    state: CycleState, item: Pending, within_share: bool, exclusion: Exclusion
) -> Failure | None:
    """Bind `item` on its cheapest type that admits and fits it (None), or say why not."""
    workload = item.workload
    kind = item.kind
    pods_min = workload.gang_min_pods
    capped: PendingCode | None = None
    no_room = False
    for gpu_type in kind.types:
        allowed, code = state.max_pods(item.book, workload, gpu_type, within_share)
        allowed = min(allowed, workload.pods)
        if allowed < pods_min:
            capped = capped or code
            continue
        key = (within_share, gpu_type, kind.memo_key)
        if key in state.place_failed:
            no_room = True
            continue
        plan = state.place(item, gpu_type, allowed, exclusion)
        if plan is None:
            state.place_failed.add(key)
            no_room = True
            continue
        state.bind(item, gpu_type, plan)
        return None
    return (no_room, capped)
