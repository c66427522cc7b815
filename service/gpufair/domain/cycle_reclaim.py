"""Phase 2 of the cycle: reclaim (DESIGN §4.3).

Workloads within their queue's share that did not fit, in queue order, evict preemptible work
past `min_runtime_s` (or past its queue's `max_borrow_s`: borrowing with a time limit, see
`on_loan_too_long`) from queues above max(deserved, fair share) (`victim_search` picks the
fewest CU, lowest tier and most recent first), never pushing a victim queue below that floor or
below a per-type guarantee, never leaving the reclaimer above a victim in allocated/fair-share
ratio. A failed reclaim of a workload kind on a GPU type is remembered for the rest of the phase.
"""

from __future__ import annotations

from gpufair.domain.capacity import EPS
from gpufair.domain.cycle_evict import commit
from gpufair.domain.cycle_state import CycleState, Pending
from gpufair.domain.placement import Exclusion
from gpufair.domain.queuebook import QueueBook
from gpufair.domain.snapshot import EvictReason, PendingCode
from gpufair.domain.victim_search import (
    Selection,
    Victim,
    VictimBudget,
    VictimIndex,
    select_victims,
)


def reclaim(state: CycleState) -> None:
    now_s = state.snapshot.now_s
    by_type: dict[str, list[Victim]] = {}
    for running in state.running.values():
        victim = running.victim
        book = state.books.get(victim.queue)
        if (
            running.preemptible
            and victim.uid not in state.leaving
            and book is not None
            and (
                now_s - victim.started_at_s >= running.min_runtime_s
                or on_loan_too_long(book, victim, now_s)
            )
        ):
            by_type.setdefault(victim.gpu_type, []).append(victim)
    wanting = [
        item
        for items in state.queue_pending.values()
        for item in items
        if not item.done and item.code is PendingCode.NO_CAPACITY
    ]
    if not wanting or not (by_type or state.leaving_for):
        return
    # Reclaim only shrinks a victim queue's surplus, and the reclaimers, within their share,
    # never gain one: a victim too big for its queue's surplus now never becomes one.
    books = state.books
    # Per victim queue, its surplus and (per type) its GPUs above a guarantee: asked once each,
    # not once per victim (nothing changes while the indexes are built).
    surplus: dict[str, float] = {}
    above: dict[tuple[str, str], float] = {}
    for found in by_type.values():
        for victim in found:
            queue = victim.queue
            if queue not in surplus:
                surplus[queue] = books[queue].surplus_cu()
            key = (queue, victim.gpu_type)
            if key not in above:
                above[key] = books[queue].gpus_above_type_guarantee(victim.gpu_type)
    state.reclaim_index = {
        name: VictimIndex(
            (
                victim
                for victim in found
                if victim.cu <= surplus[victim.queue] + EPS
                and victim.gpus <= above[(victim.queue, victim.gpu_type)] + EPS
            ),
            state.capacity,
        )
        for name, found in by_type.items()
    }
    for item in state.in_queue_order(wanting):
        _try_reclaim(state, item)
    # Only this phase reads them: later evictions need not keep them current.
    state.reclaim_index = {}
    state.budgets = {}


def on_loan_too_long(book: QueueBook, victim: Victim, now_s: float) -> bool:
    """Borrowing with a time limit: a victim of a queue above its floor (so, on loan) that has
    run at least the queue's `max_borrow_s` may be reclaimed before its `min_runtime_s`."""
    limit = book.max_borrow_s
    return limit is not None and now_s - victim.started_at_s >= limit


def _try_reclaim(state: CycleState, item: Pending) -> bool:
    workload = item.workload
    book = item.book
    pods = workload.gang_min_pods  # never evict for more than the gang minimum
    leaving = state.leaving_for.get(item.uid, [])
    failed = state.reclaim_failed
    memo_key = item.kind.memo_key
    for gpu_type in item.types:
        # The memo first: most workloads of a busy pool repeat a kind that already failed, and
        # the share test costs more than the look-up (it has no effect, so the order is free).
        key = (gpu_type, memo_key)
        if not leaving and key in failed:
            continue
        if state.pods_allowed(item, gpu_type, within_share=True) < pods:
            continue
        index = state.reclaim_index.get(gpu_type) or VictimIndex((), state.capacity)
        # Only queues above their floor give anything; the reclaimer, within its share,
        # is below its own floor and so never a victim of itself.
        budget = _budget(state, gpu_type)
        if not budget.cu_left and not leaving:
            failed.add(key)
            continue
        selection = select_victims(
            state.capacity,
            state.ask(item, gpu_type, pods),
            state.strategy,
            Exclusion(),
            index=index,
            budget=budget,
            already_leaving=[victim.uses for victim in leaving],
        )
        if selection is None:
            if not leaving:
                failed.add(key)
            continue
        gained_cu = pods * state.cu_per_pod(item, gpu_type)
        if not _no_ping_pong(state, book, gained_cu, selection):
            continue
        commit(state, item, gpu_type, selection, EvictReason.RECLAIM, bool(leaving))
        return True
    return False


def _budget(state: CycleState, gpu_type: str) -> VictimBudget:
    """What each queue may lose to reclaim now; built once per type, then kept current by
    `cycle_evict.commit` as victims go."""
    found = state.budgets.get(gpu_type)
    if found is None:
        books = state.books
        surplus = {name: other.surplus_cu() for name, other in books.items()}
        found = VictimBudget(
            {name: cu for name, cu in surplus.items() if cu > EPS},
            {
                name: other.gpus_above_type_guarantee(gpu_type)
                for name, other in books.items()
                if gpu_type in other.deserved_gpus_by_type
            },
        )
        state.budgets[gpu_type] = found
    return found


def _no_ping_pong(
    state: CycleState, book: QueueBook, gained_cu: float, selection: Selection
) -> bool:
    """After the reclaim the reclaimer must not sit above any victim queue in ratio.

    The victim floor (max(deserved, fair share)) and the reclaimer's share check already
    imply it when both shares are positive; it is checked on its own so the rule holds
    whatever either of those becomes."""
    if book.fair_share_cu <= EPS:
        return False
    after = (book.allocated_cu + gained_cu) / book.fair_share_cu
    lost: dict[str, float] = {}
    for victim in selection.victims:
        lost[victim.queue] = lost.get(victim.queue, 0.0) + victim.cu
    for name, cu in lost.items():
        victim_book = state.books[name]
        if victim_book.fair_share_cu <= EPS:
            continue  # a queue without a share sits at infinity
        if (victim_book.allocated_cu - cu) / victim_book.fair_share_cu < after - EPS:
            return False
    return True
