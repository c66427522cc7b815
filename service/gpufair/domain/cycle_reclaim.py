"""Phase 2 of the cycle: reclaim (DESIGN §4.3).

Workloads within their queue's share that did not fit, in queue order, evict preemptible work
past `min_runtime_s` (or past its queue's `max_borrow_s`: borrowing with a time limit, see
`on_loan_too_long`) from queues above max(deserved, fair share) (`victim_search` picks the
fewest CU, lowest tier and most recent first), never pushing a victim queue below that floor or
below a per-type guarantee, never leaving the reclaimer above a victim in allocated/fair-share
ratio. A failed reclaim of a workload kind on a GPU type is remembered for the rest of the phase,
and workloads whose try could only fail are passed over without one, whole queues of them
unread (`_reclaim_in_order`).
The running work that may be taken is listed once per cycle for this phase, guarantee reclaim
and preemption (`preemptible_running`).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable
from operator import attrgetter

from gpufair.domain.capacity import EPS
from gpufair.domain.cycle_evict import commit
from gpufair.domain.cycle_state import CycleState, Kind, Pending, Running
from gpufair.domain.placement_ask import Exclusion
from gpufair.domain.queuebook import QueueBook
from gpufair.domain.snapshot import EvictReason, PendingCode
from gpufair.domain.victim_search import (
    Selection,
    Victim,
    VictimBudget,
    VictimIndex,
    select_victims,
)

_by_order = attrgetter("order")


def reclaim(state: CycleState) -> None:
    now_s = state.snapshot.now_s
    by_type: dict[str, list[Victim]] = {}
    book_of = state.books.get
    for running in preemptible_running(state):
        victim = running.victim
        book = book_of(victim.queue)
        if book is not None and (
            now_s - victim.started_at_s >= running.min_runtime_s
            or on_loan_too_long(book, victim, now_s)
        ):
            by_type.setdefault(victim.gpu_type, []).append(victim)
    # The workloads wanting capacity (`_wants`) are read where they are, in the queues' lists
    # (`_reclaim_in_order`); here only whether there is one.
    if not (by_type or state.leaving_for) or not any(
        _wants(item) for items in state.queue_pending.values() for item in items
    ):
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
    _reclaim_in_order(state)
    # Only this phase reads them: later evictions need not keep them current.
    state.reclaim_index = {}
    state.budgets = {}


def preemptible_running(state: CycleState) -> list[Running]:
    """The running work reclaim, guarantee reclaim and preemption may take: preemptible and not
    already leaving, in `state.running`'s order. Neither changes after loading, so the list is
    made once per cycle (`CycleState.preemptible_running`) and each phase walks it, not all the
    running work (at 4,000 nodes, next: 21,751 running, 10,467 of them leaving). What each
    phase asks besides (`min_runtime_s`, evicted this cycle, its queue) it asks itself."""
    found = state.preemptible_running
    if found is None:
        leaving = state.leaving
        found = state.preemptible_running = [
            running
            for running in state.running.values()
            if running.preemptible and running.victim.uid not in leaving
        ]
    return found


_SHORT = PendingCode.NO_CAPACITY


def _wants(item: Pending) -> bool:
    """Whether `item` wants capacity reclaimed: within its share, it did not fit."""
    return item.code is _SHORT and not item.done


def _reclaim_in_order(state: CycleState) -> None:
    """`_try_reclaim` each workload wanting capacity (`_wants`) in the order of
    `CycleState.by_queue_order`, except those whose try could only fail without a search, which
    decides nothing and changes nothing but the failure memo:

    - a workload whose trial (`Pending.trial`: types and placement problem, what the memo's keys
      read of its kind) has every type failed in the memo (it only grows), in any queue;
    - a workload the share test (`QueueBook.max_pods`, within share) refuses on every type: its
      queue's room in its share is below the gang minimum at the kind's cheapest CU per pod
      (`least_cu_in_share`, which reads only the trial's types, GPUs per pod and gang minimum).
      That test caps every queue, with limits or without.

    Workloads with victims already leaving for them skip the memo, so they are always tried.
    A queue's wanting workloads are of the trials allocation within the share left
    `NO_CAPACITY` on (`CycleState.short_trials`: nothing else writes that reason), so a queue
    whose trials are all dead by its turn, none of its workloads a claimant with victims
    leaving, is not read, and one read alone is left at the try that kills its last (in the
    cycle after a steady one, 90 tries at 4,000 nodes, among 58,003 wanting workloads).
    Hot: one pass over the pending workloads of the queues read. The queues' lists are read in
    place (a queue tied with none in the order gives its list as it is; tied queues are merged
    as `by_queue_order` merges them); whether a workload wants capacity is read when it comes,
    which is what it was before the phase began: a try changes only its own workload. Most
    workloads read are passed over on their trial alone."""
    failed = state.reclaim_failed
    leaving_for = state.leaving_for
    # The workloads wanting capacity that victims already leave for: claimants all
    # (`CycleState.claimants`), usually none or a few (most claimants are held: done).
    short = _SHORT
    claiming = [
        item
        for item in state.claimants
        if not item.done and item.code is short and item.uid in leaving_for
    ]
    leaving = {item.uid for item in claiming}
    dead: set[int] = set()  # `Pending.trial` (either preemptibility) with every type in the memo
    least_cu: dict[int, float] = {}  # `Pending.trial` → `least_cu_in_share`
    pending = state.queue_pending
    # Per queue, the trials its wanting workloads can be of (`CycleState.short_trials`); a
    # queue none of whose workloads victims leave for is passed over, unread, once they are
    # all dead, and its list is left at the try that kills the last.
    trials_of = state.short_trials
    claimed = {item.book.name for item in claiming}
    for tied in state.queue_runs(pending):
        run = [
            name for name in tied if name in claimed or not dead.issuperset(trials_of.get(name, ()))
        ]
        live: set[int] | None = None  # the trials of a queue read alone, `claimed` not
        if len(run) == 1:
            items: Iterable[Pending] = pending[run[0]]
            if run[0] not in claimed:
                live = trials_of[run[0]]
        elif run:
            items = heapq.merge(
                *([item for item in pending[name] if _wants(item)] for name in run),
                key=_by_order,
            )
        else:
            continue
        for item in items:
            if item.code is not short or item.done:
                continue
            trial = item.trial
            if trial in dead:
                if leaving and item.uid in leaving:
                    _try_reclaim(state, item)
                continue
            if leaving and item.uid in leaving:
                _try_reclaim(state, item)
                continue
            book = item.book
            least = least_cu.get(trial)
            if least is None:
                least = least_cu_in_share(item.kind, item.workload.gang_min_pods)
                least_cu[trial] = least_cu[trial ^ 1] = least
            if book.fair_share_cu - book.allocated_cu + EPS < least:
                continue
            if _try_reclaim(state, item) is None:
                kind = item.kind
                memo_key = kind.memo_key
                if all((gpu_type, memo_key) in failed for gpu_type in kind.types):
                    dead.add(trial)
                    dead.add(trial ^ 1)
                    if live is not None and dead.issuperset(live):
                        break


def least_cu_in_share(kind: Kind, pods: int) -> float:
    """A room in the queue's share (fair share - allocated + EPS, as `QueueBook.max_pods`
    computes it) below which the share test refuses `pods` pods of `kind` on each of its types:
    the gang minimum at the cheapest type's CU per pod, less a margin wider than the rounding of
    that test's division, so a room below it is certainly below what the test needs. Minus
    infinity when the test never refuses (no pods needed, or a type of no CU)."""
    cheapest = min(kind.cu_per_pod, default=0.0)
    if pods < 1 or cheapest <= EPS:
        return -math.inf
    return pods * cheapest * (1.0 - 1e-12)


def on_loan_too_long(book: QueueBook, victim: Victim, now_s: float) -> bool:
    """Borrowing with a time limit: a victim of a queue above its floor (so, on loan) that has
    run at least the queue's `max_borrow_s` may be reclaimed before its `min_runtime_s`."""
    limit = book.max_borrow_s
    return limit is not None and now_s - victim.started_at_s >= limit


def _try_reclaim(state: CycleState, item: Pending) -> bool | None:
    """Evict for `item` on the first of its types where reclaim works. True: it did; False: a
    victim search ran on some type but nothing was committed; None: no search ran."""
    workload = item.workload
    book = item.book
    pods = workload.gang_min_pods  # never evict for more than the gang minimum
    leaving = state.leaving_for.get(item.uid, [])
    failed = state.reclaim_failed
    memo_key = item.kind.memo_key
    searched: bool | None = None
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
        searched = False
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
    return searched


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
