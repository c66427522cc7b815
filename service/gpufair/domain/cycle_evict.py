"""Committing an eviction plan (reclaim or preempt): the victims leave their queues and the
victim indexes, each gets an `EvictDecision` whose message says why, and the capacity the
beneficiary will use is held for it until the victims stop (`CycleState.hold`). A plan with no
victims is on free capacity: the workload is bound at once."""

from __future__ import annotations

from gpufair.domain.cycle_state import CycleState, Pending
from gpufair.domain.decisions import evict_decision
from gpufair.domain.queuebook import QueueBook
from gpufair.domain.snapshot import EvictReason
from gpufair.domain.victim_search import Selection, Victim


def commit(
    state: CycleState,
    item: Pending,
    gpu_type: str,
    selection: Selection,
    reason: EvictReason,
    claimed_before: bool,
    *,
    guarantee: bool = False,
) -> None:
    """Evict `selection`'s victims for `item` and hold what it will use. `guarantee`: a reclaim
    for a per-type guarantee (`cycle_guarantee`, DESIGN §3.5), whose bounds are the type's
    guarantees, not the CU fair shares: its victims' messages say so."""
    if not selection.victims and not claimed_before:
        # Nothing needs to stop: the plan is on free capacity (held GPUs are taken).
        state.bind(item, gpu_type, selection.plan)
        return
    book = item.book
    books = state.books
    # Only the phase that made them keeps these current (reclaim's, preempt's) or has any
    # (guarantees'): the others' are empty, and their upkeep is skipped.
    reclaim_indexes = state.reclaim_index
    budgets = state.budgets
    guarantee_indexes = state.guarantee_index
    preempt_totals = state.preempt_totals
    preempt_indexes = state.preempt_index
    evicted = state.evicted
    evicts = state.evicts
    reclaim = reason is EvictReason.RECLAIM
    entitlement = reason is EvictReason.ENTITLEMENT
    for victim in selection.victims:
        queue = victim.queue
        victim_book = books[queue]
        if guarantee:
            message = _guarantee_message(item, victim, victim_book, gpu_type)
        elif reclaim:
            message = (
                f"reclaimed for {item.uid} of queue {book.name} "
                f"({book.allocated_cu:.1f} of fair share {book.fair_share_cu:.1f} CU); queue "
                f"{victim.queue} keeps {victim_book.allocated_cu - victim.cu:.1f} CU, at least "
                f"max(deserved {victim_book.deserved_cu:.1f}, fair share "
                f"{victim_book.fair_share_cu:.1f})"
            )
            running = state.running[victim.uid]
            ran_s = state.snapshot.now_s - victim.started_at_s
            if ran_s < running.min_runtime_s and victim_book.max_borrow_s is not None:
                message += (
                    f"; on loan for {ran_s:.0f} s, past max_borrow_s "
                    f"{victim_book.max_borrow_s:.0f} s (its min_runtime_s "
                    f"{running.min_runtime_s:.0f} s not reached)"
                )
        elif entitlement:
            message = (
                f"taken for gang {item.uid} of queue {book.name}, the most under-served of its "
                f"tier (usage share below weight share), admitted beyond its fair share "
                f"{book.fair_share_cu:.1f} CU; queue {victim.queue} keeps "
                f"{victim_book.allocated_cu - victim.cu:.1f} CU, at least its deserved "
                f"{victim_book.deserved_cu:.1f}"
            )
        else:
            message = (
                f"preempted in queue {book.name} for {item.uid} "
                f"(priority class {item.workload.priority_class} over {victim.priority_class})"
            )
        evicted.add(victim.uid)
        victim_book.remove(victim.cu, victim.gpus, victim.gpu_type, True)
        victim_book.evicted_cu += victim.cu
        if reclaim_indexes:
            surplus_cu = victim_book.surplus_cu()
            for index in reclaim_indexes.values():
                index.remove(victim)
                index.prune(queue, surplus_cu)
        if budgets:
            for budget_type, budget in budgets.items():
                budget.evicted(victim, budget_type)
        if guarantee_indexes:
            guarantee_index = guarantee_indexes.get(victim.gpu_type)
            if guarantee_index is not None:
                guarantee_index.remove(victim)
        if preempt_totals:
            own_key = (queue, victim.gpu_type)
            totals = preempt_totals.get(own_key)
            sums = None if totals is None else totals.get(victim.priority_class)
            if sums is not None:
                sums[0] -= victim.cu
                sums[1] -= victim.gpus
                sums[2] -= 1
            preempt_index = preempt_indexes.get(own_key)
            if preempt_index is not None:
                preempt_index.remove(victim)
        evicts.append(
            evict_decision(victim.uid, victim.queue, reason, message, item.uid, victim.cu)
        )
    state.hold(item, gpu_type, selection.plan)


def _guarantee_message(item: Pending, victim: Victim, victim_book: QueueBook, gpu_type: str) -> str:
    """Why a victim of a per-type guarantee's reclaim goes, in the terms of that phase's bounds
    (`cycle_guarantee`): the reclaimer's guarantee of the type, the victim's own, its deserved CU.
    The victim may keep less than its CU fair share: that bound is the CU reclaim's."""
    book = item.book
    wanted = book.deserved_gpus_by_type.get(gpu_type, 0.0)
    held = book.gpus_by_type.get(gpu_type, 0.0)
    kept = victim_book.gpus_by_type.get(gpu_type, 0.0) - victim.gpus
    own = victim_book.deserved_gpus_by_type.get(gpu_type, 0.0)
    return (
        f"reclaimed for {item.uid} of queue {book.name}, below its guarantee of {wanted:g} "
        f"{gpu_type} GPUs (holds {held:g}); queue {victim.queue} keeps {kept:g} {gpu_type} GPUs, "
        f"at least its own guarantee of {own:g}, and "
        f"{victim_book.allocated_cu - victim.cu:.1f} CU, at least its deserved "
        f"{victim_book.deserved_cu:.1f}"
    )
