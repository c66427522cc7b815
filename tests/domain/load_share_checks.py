"""Share and tier rules of one cycle's result (DESIGN §4.1, §4.3, §4.5), for the large random
runs of `test_cycle_rules_under_load`; occupancy and fits come from `load_checks`."""

from __future__ import annotations

from collections import defaultdict

from load_checks import countable, end_state

from gpufair.domain.capacity import EPS
from gpufair.domain.model import QueueQuota, Workload
from gpufair.domain.placement_ask import adequate_types
from gpufair.domain.policy import deserved_cu_with_types
from gpufair.domain.snapshot import (
    CycleResult,
    CycleSnapshot,
    EvictReason,
    PendingCode,
    ReservationKind,
)


def _within_after(result: CycleResult, name: str) -> float:
    """What queue `name` holds once the cycle's decisions complete, holds included, without
    what it bound beyond its share."""
    summary = result.queues[name]
    beyond = sum(b.cu for b in result.binds if b.queue == name and b.over_fair_share)
    return summary.allocated_cu_after + summary.reserved_cu - beyond


def check_reclaim_floor_and_ratio(snap: CycleSnapshot, result: CycleResult) -> None:
    """A reclaim victim's queue ends at or above max(deserved, fair share), and the reclaimer
    ends no higher than the victim in allocated/fair-share ratio."""
    weights = {t.name: t.compute_weight for t in snap.gpu_types}
    quotas = {q.name: q.quota(snap.pool.name) for q in snap.queues}
    pending = {w.uid: w for w in snap.pending}
    others = {e.queue for e in result.evicts if e.reason is not EvictReason.RECLAIM}
    for evict in result.evicts:
        if evict.reason is not EvictReason.RECLAIM or evict.queue in others:
            continue
        victim = result.queues[evict.queue]
        deserved = deserved_cu_with_types(quotas[evict.queue], weights)
        after = victim.allocated_cu_after + victim.reserved_cu
        reclaimer = result.queues[pending[evict.beneficiary_uid].queue]
        if _for_guarantee(snap, quotas[reclaimer.queue], evict.workload_uid):
            # Reclaim for a per-type guarantee (DESIGN §3.5) may go below the fair share.
            assert after >= deserved - 1e-6, ("victim below its deserved quota", evict)
            continue
        floor = max(deserved, victim.fair_share_cu)
        assert after >= floor - 1e-6, ("victim below its floor", evict)
        if victim.fair_share_cu <= EPS:
            continue
        mine = _within_after(result, reclaimer.queue) / reclaimer.fair_share_cu
        assert mine <= after / victim.fair_share_cu + 1e-6, ("ping-pong", evict)


def _for_guarantee(snap: CycleSnapshot, reclaimer: QueueQuota, victim_uid: str) -> bool:
    """Whether the reclaimer has a per-type guarantee on the victim's GPU type."""
    victim = next(a for a in snap.running if a.workload.uid == victim_uid)
    return victim.gpu_type in reclaimer.deserved_gpus_by_type


def check_no_needless_victim(snap: CycleSnapshot, result: CycleResult) -> None:
    """Reclaim and preemption evict no victim their beneficiary's gang (its minimum) could do
    without: with any one victim kept, the gang no longer fits on what is free plus the rest.
    Checked where fits can be counted (`countable`) and no earlier victim leaves for it."""
    pending = {w.uid: w for w in snap.pending}
    running = {a.workload.uid: a for a in snap.running}
    earlier = {e.beneficiary_uid for e in snap.evicting}
    victims: dict[str, list[str]] = defaultdict(list)
    for evict in result.evicts:
        if evict.reason in (EvictReason.RECLAIM, EvictReason.PREEMPT):
            victims[evict.beneficiary_uid].append(evict.workload_uid)
    holds = {r.workload_uid: r for r in result.reservations}
    for uid, gone in victims.items():
        job = pending[uid]
        hold = holds.get(uid)
        if uid in earlier or hold is None or not countable(job) or len(gone) < 2:
            continue
        base = end_state(snap, result, stopped=False, holds=True, without=uid)
        for victim in gone:
            base.add(running[victim].workload, running[victim].bindings, -1)
        for kept in gone:
            base.add(running[kept].workload, running[kept].bindings)
            fits = base.pods_that_fit(job, hold.gpu_type)
            assert fits < job.gang_min_pods, ("needless victim", uid, kept, gone)
            base.add(running[kept].workload, running[kept].bindings, -1)


def _admissible(
    snap: CycleSnapshot, result: CycleResult, job: Workload, gpu_type: str, within: bool
) -> bool:
    """Whether `job` on `gpu_type` keeps its queue within its share (`within`), non-preemptible
    work within its deserved quota, and its queue and every queue above it within their
    limits, counted on what they hold once the cycle's decisions complete."""
    weights = {t.name: t.compute_weight for t in snap.gpu_types}
    by_name = {q.name: q for q in (*snap.queues, *snap.inner_queues)}
    parent = {q.name: q.parent for q in by_name.values()}
    leaves_below: dict[str, set[str]] = defaultdict(set)
    for leaf in snap.queues:
        name = leaf.name
        while name is not None:
            leaves_below[name].add(leaf.name)
            name = parent.get(name)
    gpus: dict[tuple[str, str], float] = defaultdict(float)
    leaving = {e.workload_uid for e in result.evicts} | {e.victim_uid for e in snap.evicting}
    pending = {w.uid: w for w in snap.pending}
    for a in snap.running:
        if a.workload.uid not in leaving:
            gpus[(a.workload.queue, a.gpu_type)] += a.workload.gpus_per_pod * len(a.bindings)
    for b in result.binds:
        gpus[(b.queue, b.gpu_type)] += pending[b.workload_uid].gpus_per_pod * len(b.bindings)
    for r in result.reservations:
        if r.kind is ReservationKind.EVICTED_CAPACITY:
            held = pending[r.workload_uid]
            gpus[(held.queue, r.gpu_type)] += held.gpus_per_pod * len(r.held)
    want = job.gpus_per_pod * job.gang_min_pods
    cu = want * weights[gpu_type]
    summary = result.queues[job.queue]
    # At its turn the queue held at most what it ends with plus what it lost since.
    at_turn = _within_after(result, job.queue) + summary.evicted_cu
    if within and at_turn + cu > summary.fair_share_cu + EPS:
        return False  # beyond the share on this type then
    if not job.preemptible:
        quota = by_name[job.queue].quota(snap.pool.name)
        held = sum(
            a.workload.gpus_per_pod * len(a.bindings) * weights[a.gpu_type]
            for a in snap.running
            if a.workload.queue == job.queue and not a.workload.preemptible
        )
        held += sum(
            b.cu
            for b in result.binds
            if b.queue == job.queue and not pending[b.workload_uid].preemptible
        )
        if held + cu > deserved_cu_with_types(quota, weights) + EPS:
            return False
    name = job.queue
    while name is not None:
        quota = by_name[name].quota(snap.pool.name)
        below = leaves_below[name]
        held_cu = sum(g * weights[t] for (q, t), g in gpus.items() if q in below)
        if quota.limit_cu is not None and held_cu + want * weights[gpu_type] > quota.limit_cu:
            return False
        type_limit = quota.limit_gpus_by_type.get(gpu_type)
        held_type = sum(g for (q, t), g in gpus.items() if q in below and t == gpu_type)
        if type_limit is not None and held_type + want > type_limit:
            return False
        name = parent.get(name)
    return True


def check_tiers(snap: CycleSnapshot, result: CycleResult) -> list[str]:
    """No bind of a lower tier takes capacity a waiting workload of a higher tier could use: a
    waiting workload within its share (`NO_CAPACITY`) against any lower-tier bind, one beyond
    its share (`OVER_FAIR_SHARE`) against lower-tier binds beyond theirs, off `GANG_WAIT`
    nodes. Claims (binds evictions were made for) are served first by rule and left out.
    Returns what it found (empty: nothing)."""
    tier = {q.name: q.quota(snap.pool.name).priority for q in snap.queues}
    claims = {e.beneficiary_uid for e in snap.evicting}
    binds = [b for b in result.binds if b.workload_uid not in claims and not b.gpus_by_type]
    if not binds:
        return []
    types = {t.name: t for t in snap.gpu_types}
    present = {n.gpu_type for n in snap.nodes if n.ready}
    gang_held = {
        n for r in result.reservations if r.kind is ReservationKind.GANG_WAIT for n in r.nodes
    }
    pending = {w.uid: w for w in snap.pending}
    found: list[str] = []
    base = end_state(snap, result, stopped=False, holds=True)
    totals: dict[tuple[object, ...], int] = {}
    for uid, reason in result.pending.items():
        job = pending[uid]
        if reason.code not in (PendingCode.NO_CAPACITY, PendingCode.OVER_FAIR_SHARE):
            continue
        within = reason.code is PendingCode.NO_CAPACITY
        if not countable(job) or not (within or job.preemptible):
            continue  # non-preemptible work never goes beyond its share
        adequate = set(adequate_types(job, types, present))
        for bind in binds:
            if tier[bind.queue] >= tier[job.queue] or bind.gpu_type not in adequate:
                continue
            if not within and not bind.over_fair_share:
                continue
            if not _admissible(snap, result, job, bind.gpu_type, within):
                continue
            skip = frozenset() if within else gang_held
            key = (
                job.gpus_per_pod,
                job.cpu_millicores_per_pod,
                job.memory_mib_per_pod,
                bind.gpu_type,
                within,
            )
            total = totals.get(key)
            if total is None:
                total = totals[key] = base.pods_that_fit(job, bind.gpu_type, skip)
            if total >= job.gang_min_pods:
                found.append(f"{uid} ({reason.code}) fits on free capacity")
                break
            nodes = [b.node for b in bind.bindings]
            total -= base.pods_that_fit(job, bind.gpu_type, skip, nodes)
            base.add(pending[bind.workload_uid], bind.bindings, -1)
            total += base.pods_that_fit(job, bind.gpu_type, skip, nodes)
            base.add(pending[bind.workload_uid], bind.bindings)
            if total >= job.gang_min_pods:
                found.append(f"{uid} ({reason.code}) could use {bind.workload_uid}'s capacity")
    return found
