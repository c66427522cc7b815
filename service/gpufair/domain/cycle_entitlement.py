"""Phase 3b of the cycle: gang entitlement (docs/GANG_ENTITLEMENT.md).

Time-based fair share raises the share of a queue that has used little, but never above what the
formula can reach: with k = 1 a queue with no usage among three equal ones gets at most 2/3 of
the group, and a queue of weight 3 : 1 holding 40 of 64 GPUs at most 56. A gang larger than that
never runs, so the queue's usage never tells the formula. This phase lets such a gang use the
entitlement its queue has not received.

**Who.** Per priority tier, the *most under-served* queue: the lowest U'/W' among the tier's
queues that have pending work and compete for over-quota capacity (W' > 0; ties go by the
cycle's queue order). It qualifies only while U' < W' (it has received less than its weight over
the window), while it holds less than its weight's part of the group's over-quota capacity
(W' × capacity: it is under-served now too), and while its allocation is within its fair
share. Its candidate is its first waiting workload, in its own order, that its share alone
blocks (`OVER_FAIR_SHARE`), is preemptible, has waited at least the pool's `gang_reservation_after_s`, and is larger than any
share the formula can reach for the queue while it keeps what it holds (`reachable_share_cu`):
what time-based fair share grants in time is left to it, so the rule changes nothing where
fair share already serves every gang. Off when the pool's `gang_entitlement` is false, when k is 0 or the
window `none` (no memory: classic fair share), or when `gang_reservation_after_s` is unset.

**How.** The candidate is admitted beyond its share, within its queue's limits: bound if it fits
on free capacity; otherwise victims are chosen (`victim_search`) among preemptible work of other
queues of its tier or lower, no larger than the gang, that has run `min_runtime_s` (or is on loan
past `max_borrow_s`): first only work beyond its queue's share (`surplus_cu`), then, if that is
not enough, over-quota work (never below a queue's deserved quota nor a per-type guarantee).
Evictions say `EvictReason.ENTITLEMENT`; the gang waits for them as a reclaimer does
(`cycle_evict`). If no victims can be found yet, the nodes that would hold the gang become
`GANG_WAIT`, so beyond-share work stops refilling them (`cycle_reserve.reserve_gang`).

**Bound.** A queue is admitted only from within its share, one gang at a time: it ends less than
one gang beyond its fair share, and only while U' < W'. Its usage then counts like any other, so
U' rises past W' and the rule stops for it; the formula lowers its share in the windows that
follow (it pays back). Its gang is not reclaimed back at once: reclaim takes only whole
workloads within a queue's surplus, and the surplus is smaller than the gang.
"""

from __future__ import annotations

import math

from gpufair.domain.capacity import EPS
from gpufair.domain.cycle_evict import commit
from gpufair.domain.cycle_reclaim import on_loan_too_long, preemptible_running
from gpufair.domain.cycle_reserve import reserve_gang
from gpufair.domain.cycle_state import CycleState, Pending, QueueKey
from gpufair.domain.entitlement_reach import reachable_share_cu
from gpufair.domain.model import WindowKind
from gpufair.domain.placement_ask import Exclusion
from gpufair.domain.queuebook import QueueBook
from gpufair.domain.snapshot import EvictReason, PendingCode
from gpufair.domain.victim_search import Victim, VictimBudget, VictimIndex, select_victims


def admit_entitled_gangs(state: CycleState) -> None:
    pool = state.pool
    after_s = pool.gang_reservation_after_s
    if (
        not pool.gang_entitlement
        or after_s is None
        or pool.policy.k <= 0.0
        or pool.policy.window_kind is WindowKind.NONE
    ):
        return
    for book in _most_under_served(state):
        item = _candidate(state, book, after_s)
        if item is not None:
            _admit(state, item)


def _most_under_served(state: CycleState) -> list[QueueBook]:
    """Per tier, the queue with the lowest U'/W', if it is below its weight share and within
    its fair share."""
    standing = state.snapshot.standing
    best: dict[int, tuple[tuple[float, QueueKey], QueueBook]] = {}
    for name, book in state.books.items():
        found = standing.get(name)
        if found is None or found.weight_share <= EPS or name not in state.queue_pending:
            continue
        key = (found.usage_share / found.weight_share, state.queue_key(name, 0))
        held = best.get(book.tier)
        if held is None or key < held[0]:
            best[book.tier] = (key, book)
    chosen = []
    for _, book in sorted(best.values(), key=lambda entry: -entry[1].tier):
        found = standing[book.name]
        if found.usage_share < found.weight_share - EPS and (
            book.allocated_cu <= book.fair_share_cu + EPS
        ):
            chosen.append(book)
    return chosen


def _candidate(state: CycleState, book: QueueBook, after_s: float) -> Pending | None:
    """The queue's first waiting workload that its share alone blocks, preemptible, waiting
    past `after_s`, and larger than any share the formula can reach for the queue while it
    keeps what it holds (`reachable_share_cu`): what time-based fair share will grant in
    time is left to it. None while the queue holds its weight's part of the group (W' × the
    over-quota capacity) or more: a queue at its part has nothing owed now, whatever U' says.

    With others saturating, the reachable share is C (W' + k (W' - u)) for u = held / C, so
    a workload qualifies when it is larger than (1 + k) times the queue's deficit against its
    weight's part."""
    now_s = state.snapshot.now_s
    standing = state.snapshot.standing
    over_quota_cu = math.fsum(
        max(0.0, other.fair_share_cu - other.deserved_cu)
        for other in state.books.values()
        if other.tier == book.tier
        and (found := standing.get(other.name)) is not None
        and found.weight_share > EPS
    )
    held_cu = max(0.0, book.allocated_cu - book.deserved_cu)
    weight_share = standing[book.name].weight_share
    if held_cu >= weight_share * over_quota_cu - EPS:
        return None  # it holds its weight's part now: nothing owed at this instant
    reachable_cu = book.deserved_cu + reachable_share_cu(
        weight_share, held_cu, over_quota_cu, state.pool.policy.k
    )
    for item in state.queue_pending[book.name]:
        if (
            not item.done
            and item.code is PendingCode.OVER_FAIR_SHARE
            and item.workload.preemptible
            and now_s - item.workload.submit_time_s >= after_s
            and book.allocated_cu + item.min_cu > reachable_cu + EPS
        ):
            return item
    return None


def _admit(state: CycleState, item: Pending) -> bool:
    pods = item.workload.gang_min_pods
    for gpu_type in item.types:
        allowed = state.pods_allowed(item, gpu_type, within_share=False)
        if allowed < pods:
            continue
        plan = state.place(item, gpu_type, allowed, Exclusion())
        if plan is not None:
            state.bind(item, gpu_type, plan)
            return True
    for gpu_type in item.types:
        if state.pods_allowed(item, gpu_type, within_share=False) < pods:
            continue
        victims = _victims(state, item, gpu_type)
        if not victims:
            continue
        index = VictimIndex(victims, state.capacity)
        for budget in _budgets(state, item.book, gpu_type):
            selection = select_victims(
                state.capacity,
                state.ask(item, gpu_type, pods),
                state.strategy,
                Exclusion(),
                index=index,
                budget=budget,
            )
            if selection is not None:
                commit(state, item, gpu_type, selection, EvictReason.ENTITLEMENT, False)
                return True
    return reserve_gang(state, item, within_share=False)


def _victims(state: CycleState, item: Pending, gpu_type: str) -> list[Victim]:
    """Preemptible work on `gpu_type` of other queues of the beneficiary's tier or lower, no
    larger than the gang (a gang never displaces a bigger workload), that reclaim could take
    now (past `min_runtime_s`, or on loan too long)."""
    now_s = state.snapshot.now_s
    tier = item.book.tier
    found = []
    # Preemptible and not already leaving: the list reclaim made (`preemptible_running`).
    for running in preemptible_running(state):
        victim = running.victim
        book = state.books.get(victim.queue)
        if (
            victim.gpu_type == gpu_type
            and book is not None
            and book is not item.book
            and book.tier <= tier
            and victim.cu <= item.min_cu + EPS
            and victim.uid not in state.evicted
            and (
                now_s - victim.started_at_s >= running.min_runtime_s
                or on_loan_too_long(book, victim, now_s)
            )
        ):
            found.append(victim)
    return found


def _budgets(state: CycleState, beneficiary: QueueBook, gpu_type: str) -> list[VictimBudget]:
    """Beyond-share work first (what each queue holds above max(deserved, fair share)), then
    over-quota work (what it holds above its deserved quota); per-type guarantees hold in both."""
    others = [book for book in state.books.values() if book is not beneficiary]
    guarantees = {
        book.name: book.gpus_above_type_guarantee(gpu_type)
        for book in others
        if gpu_type in book.deserved_gpus_by_type
    }
    beyond = {book.name: book.surplus_cu() for book in others if book.surplus_cu() > EPS}
    over_quota = {
        book.name: left
        for book in others
        if (left := book.allocated_cu - book.claimed_cu - book.deserved_cu) > EPS
    }
    return [VictimBudget(beyond, guarantees), VictimBudget(over_quota, guarantees)]
