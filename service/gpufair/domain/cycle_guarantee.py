"""Phase 2b of the cycle: reclaim for a per-type guarantee (DESIGN §3.5).

A queue below its guarantee for a GPU type (`deserved_gpus_by_type`), with pending work within
its fair share that needs that type and did not fit, may reclaim that type from queues above
their own guarantee for it, even when they are within their CU fair share (the CU reclaim of
`cycle_reclaim` only takes from queues above max(deserved, fair share)). Bounds:

- the reclaimer takes no more of the type than brings it up to its guarantee;
- a victim queue keeps its own guarantee of the type (none stated: 0) and its deserved CU;
- only preemptible work past `min_runtime_s` goes, chosen by `victim_search` (lowest tier,
  lowest priority class, most recent first, fewest CU);
- no ping-pong without the ratio rule of `cycle_reclaim`: what the reclaimer gains is within its
  guarantee for the type, which CU reclaim never takes (`VictimBudget`'s per-type floor), so the
  victim cannot take it back. The ratio rule would defeat the guarantee: a queue guaranteed 4
  A100 with a 40 CU share sits at ratio 1.0 once it holds them, above a big victim queue.
"""

from __future__ import annotations

from gpufair.domain.capacity import EPS
from gpufair.domain.cycle_evict import commit
from gpufair.domain.cycle_reclaim import preemptible_running
from gpufair.domain.cycle_state import CycleState, Pending
from gpufair.domain.placement_ask import Exclusion
from gpufair.domain.queuebook import QueueBook
from gpufair.domain.snapshot import EvictReason, PendingCode
from gpufair.domain.victim_search import Victim, VictimBudget, VictimIndex, select_victims


def reclaim_for_guarantees(state: CycleState) -> None:
    if not any(book.deserved_gpus_by_type for book in state.books.values()):
        return  # nobody has a per-type guarantee: nobody is below one
    wanting: dict[str, list[Pending]] = {}  # per queue, in its order
    for name, items in state.queue_pending.items():
        found = [
            item
            for item in items
            if not item.done
            and item.code is PendingCode.NO_CAPACITY
            and any(_short_of(item.book, gpu_type) > EPS for gpu_type in item.types)
        ]
        if found:
            wanting[name] = found
    if not wanting:
        return
    for item in state.by_queue_order(wanting):
        _try(state, item)


def _short_of(book: QueueBook, gpu_type: str) -> float:
    """GPUs of `gpu_type` the queue lacks to reach its guarantee for it (0: none stated)."""
    guarantee = book.deserved_gpus_by_type.get(gpu_type, 0.0)
    return guarantee - book.gpus_by_type.get(gpu_type, 0.0)


def _try(state: CycleState, item: Pending) -> bool:
    workload = item.workload
    pods = workload.gang_min_pods
    for gpu_type in item.types:
        if pods * workload.gpus_per_pod > _short_of(item.book, gpu_type) + EPS:
            continue  # beyond the guarantee: the CU reclaim's rules apply
        if state.pods_allowed(item, gpu_type, within_share=True) < pods:
            continue
        key = ("guarantee", gpu_type, item.kind.memo_key)
        if key in state.reclaim_failed:
            continue
        index = _index(state, gpu_type)
        budget = _budget(state, gpu_type, item.book.name)
        if not index or not budget.cu_left:
            state.reclaim_failed.add(key)
            continue
        selection = select_victims(
            state.capacity,
            state.ask(item, gpu_type, pods),
            state.strategy,
            Exclusion(),
            index=index,
            budget=budget,
        )
        if selection is None or not selection.victims:
            state.reclaim_failed.add(key)
            continue
        commit(state, item, gpu_type, selection, EvictReason.RECLAIM, False, guarantee=True)
        return True
    return False


def _index(state: CycleState, gpu_type: str) -> VictimIndex:
    """Victims of `gpu_type` for guarantee reclaim, built once per cycle and type; `commit`
    removes evicted ones."""
    found = state.guarantee_index.get(gpu_type)
    if found is None:
        now_s = state.snapshot.now_s
        victims: list[Victim] = []
        for running in preemptible_running(state):
            victim = running.victim
            if (
                victim.gpu_type == gpu_type
                and victim.uid not in state.evicted
                and victim.queue in state.books
                and now_s - victim.started_at_s >= running.min_runtime_s
            ):
                victims.append(victim)
        found = state.guarantee_index[gpu_type] = VictimIndex(victims, state.capacity)
    return found


def _budget(state: CycleState, gpu_type: str, reclaimer: str) -> VictimBudget:
    """Each other queue may lose CU above its deserved and GPUs of the type above its own
    guarantee for it. Recomputed per attempt: holds and evictions move both."""
    cu_left: dict[str, float] = {}
    gpus_left: dict[str, float] = {}
    for name, book in state.books.items():
        if name == reclaimer:
            continue
        above_cu = book.allocated_cu - book.claimed_cu - book.deserved_cu
        above_gpus = -_short_of(book, gpu_type)
        if above_cu > EPS and above_gpus > EPS:
            cu_left[name] = above_cu
            gpus_left[name] = above_gpus
    return VictimBudget(cu_left, gpus_left)
