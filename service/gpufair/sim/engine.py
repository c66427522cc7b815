"""The discrete-event simulation: the domain code (fair share, usage math, the cycle) on a virtual
clock, with a simulated batch system that confirms every decision at once.

Events, and what happens at one instant, in this order:

1. **Completions.** A job whose work is done stops; its capacity is free from that instant.
2. **Arrivals.** Explicit and trace jobs at their `submit_s`, generator jobs as their streams draw
   them; a job waits in its pool from that instant, unless the service's submit checks refuse it
   (`admission`): a refused job never waits and is kept apart (`SimResult.refused`).
3. **Fair-share recompute**, per pool every `recompute_s` (`Scenario.recompute_interval_s`), as the
   service's periodic job does: the decayed usage `usage.usage_inputs` gives over the pool's
   simulated allocation history (kept as it happens, `running_usage.PoolUsage`), demands from the
   jobs running and waiting (a waiting job counted on the cheapest GPU type that serves it, as
   `fairshare.QueueDemand` asks), and the previous effective weights for the dead band; then
   `fairshare.compute_fair_shares`.
4. **Scheduling cycle**, every `cycle_s`, per pool: `cycle.run_cycle` on a snapshot of the pool.
   As the service's cycle does (`services.schedule.fair_shares`), the pool's fair shares are
   recomputed first when a job of the pool was submitted or changed state (started, stopped,
   completed, evicted) since the latest recompute, so new work counts as demand at once, not
   at the next periodic recompute; this happens at the cycle's instant even when the cycle
   itself is skipped (below).
   Binds start at once (the simulated batch system confirms instantly). Evicted jobs stop at
   once, count an eviction and wait again with their original submit time (so they keep their
   place in their queue's order); with `on_evict: resume` they keep the work done, with `restart`
   they start over (the GPU-seconds of the run thrown away count as lost). The victims are gone by the next cycle, which carries each eviction once
   more as a standing claim, as the service does once a victim has stopped (`snapshot`): the
   workload it was evicted for binds first on the freed capacity, and the victim is not bound
   beyond its queue's share in that cycle.
   A job started with fewer pods than it asked for (`min_pods`) runs for its full duration.
5. **Timeline sample** every `timeline_s` (and at the end): allocation, fair share, effective
   weight and usage of every queue; fair-share columns are those of the latest recompute.

Time runs over [0, duration_s); nothing happens at the end instant but the last sample. Jobs
that arrive at or after it are never submitted (loading notes how many, `scenario`).

Cycles are skipped when they cannot decide anything, which keeps long replays fast and changes
no result: when nothing waits in the pool, or when nothing changed since a cycle that decided
nothing (no arrival, completion, bind, eviction or fair-share change) and no instant has passed at
which the cycle's rules look at the clock (a running job reaching its `min_runtime_s` or its
queue's `max_borrow_s`, a waiting job reaching the pool's `gang_reservation_after_s`). The cycle
reads the clock only there.

The records of a run and its result (`JobRecord`, `TimelineRow`, `DecisionRow`, `PoolRun`,
`QueueRun`, `SimResult`) live in `records`, each pool's state as the run goes (and its summary at
the end) in `pool_state` (`PoolState`); this module names the records too, for its callers.

Determinism: no wall clock, no unordered iteration (pools by name, queues in tree order, jobs in
arrival order), one random stream per generator. The same scenario and seed give the same run.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable

from gpufair.domain.capacity import binding_gpus
from gpufair.domain.cycle import run_cycle
from gpufair.domain.demand import leaf_demand_columns, queue_demands
from gpufair.domain.fairshare import (
    FairShareInput,
    FairSharePlan,
    LeafDemands,
    QueueDemand,
    compute_fair_shares,
)
from gpufair.domain.model import Allocation, PodBinding
from gpufair.domain.snapshot import (
    CycleResult,
    CycleSnapshot,
    EvictionInFlight,
    PendingCode,
    UsageStanding,
)
from gpufair.gc_tuning import collector_paused
from gpufair.sim.admission import Admission, RefusedJob
from gpufair.sim.generators import GeneratorStream
from gpufair.sim.jobspec import JobSpec
from gpufair.sim.pool_state import PoolState
from gpufair.sim.records import DecisionRow, JobRecord, PoolRun, QueueRun, SimResult, TimelineRow
from gpufair.sim.scenario import EvictionMode, Scenario

__all__ = [
    "DecisionRow",
    "JobRecord",
    "PoolRun",
    "QueueRun",
    "SimResult",
    "Simulation",
    "TimelineRow",
    "simulate",
]

# Pending codes under which a job cannot run in this pool whatever happens: it is left out of
# demand and of "idle while work was pending".
_HOPELESS = frozenset({PendingCode.NEVER_FITS, PendingCode.UNKNOWN_QUEUE, PendingCode.OTHER_POOL})


class Simulation:
    """One run of a scenario. `progress(fraction)` is called as simulated time advances."""

    def __init__(self, scenario: Scenario, progress: Callable[[float], None] | None = None) -> None:
        self.scenario = scenario
        self.progress = progress
        self.horizon_s = scenario.duration_s
        self.pools = {
            p.name: PoolState(p, scenario.cluster, scenario.recompute_interval_s(p))
            for p in sorted(scenario.cluster.pools, key=lambda p: p.name)
        }
        self.jobs: dict[str, JobRecord] = {}
        self.admission = Admission(scenario.cluster)
        self.refused: list[RefusedJob] = []
        self.arrivals = scenario.jobs  # sorted by submit time
        self.next_arrival = 0
        self.streams = [GeneratorStream(spec, scenario.seed) for spec in scenario.generators]
        # (instant, stream index): the next draw of each stream (Poisson) or its start (backlog).
        self.stream_events: list[tuple[float, int]] = []
        for index, stream in enumerate(self.streams):
            at_s = stream.spec.start_s if stream.is_backlog else stream.next_arrival_s
            if at_s < math.inf:
                self.stream_events.append((at_s, index))
        heapq.heapify(self.stream_events)
        self.completions: list[tuple[float, int, str, int]] = []
        self.sequence = 0
        self.cycle_index = 0
        self.sample_index = 0
        self.timeline: list[TimelineRow] = []
        self.decisions: list[DecisionRow] = []
        self.last_sample_s = -math.inf

    # -- the loop ---------------------------------------------------------------------------

    def run(self) -> SimResult:
        scenario = self.scenario
        now_s = 0.0
        report_every = self.horizon_s / 200.0
        next_report_s = 0.0
        while True:
            next_s = min(
                self._next_completion_s(),
                self.arrivals[self.next_arrival].workload.submit_time_s
                if self.next_arrival < len(self.arrivals)
                else math.inf,
                self.stream_events[0][0] if self.stream_events else math.inf,
                self.cycle_index * scenario.cycle_s,
                *(pool.next_recompute_s for pool in self.pools.values()),
                self.sample_index * scenario.timeline_s,
            )
            if next_s >= self.horizon_s:
                self._advance(now_s, self.horizon_s)
                break
            self._advance(now_s, next_s)
            now_s = next_s
            self._complete(now_s)
            self._arrive(now_s)
            for pool in self.pools.values():
                if pool.next_recompute_s == now_s:
                    self._recompute(pool, now_s)
                    pool.periodic_recomputes += 1
                    pool.next_recompute_s = pool.periodic_recomputes * pool.recompute_s
            if self.cycle_index * scenario.cycle_s == now_s:
                for pool in self.pools.values():
                    if pool.changed:
                        self._recompute(pool, now_s)
                    self._cycle(pool, now_s)
                self.cycle_index += 1
            if self.sample_index * scenario.timeline_s == now_s:
                self._sample(now_s)
                self.sample_index += 1
            if self.progress is not None and now_s >= next_report_s:
                self.progress(now_s / self.horizon_s)
                next_report_s = now_s + report_every
        if self.last_sample_s < self.horizon_s:
            self._sample(self.horizon_s)
        if self.progress is not None:
            self.progress(1.0)
        return self._result()

    def _advance(self, from_s: float, to_s: float) -> None:
        """Integrate GPUs idle while work that could use them waited, over [from_s, to_s):
        nothing changes inside."""
        span_s = to_s - from_s
        if span_s <= 0.0:
            return
        for pool in self.pools.values():
            if pool.pending:
                idle = pool.idle_gpus_wanted()
                if idle > 0.0:
                    pool.idle_parts.append(idle * span_s)

    def _next_completion_s(self) -> float:
        heap = self.completions
        while heap:
            end_s, _, uid, token = heap[0]
            if self.jobs[uid].token == token:
                return end_s
            heapq.heappop(heap)  # the job stopped or restarted since: a stale event
        return math.inf

    # -- jobs coming and going --------------------------------------------------------------

    def _complete(self, now_s: float) -> None:
        while self._next_completion_s() == now_s:
            _, _, uid, _ = heapq.heappop(self.completions)
            job = self.jobs[uid]
            self._stop(job, now_s)
            job.remaining_s = 0.0
            job.end_s = now_s

    def _arrive(self, now_s: float) -> None:
        while (
            self.next_arrival < len(self.arrivals)
            and self.arrivals[self.next_arrival].workload.submit_time_s == now_s
        ):
            self._submit(self.arrivals[self.next_arrival], now_s)
            self.next_arrival += 1
        while self.stream_events and self.stream_events[0][0] == now_s:
            _, index = heapq.heappop(self.stream_events)
            stream = self.streams[index]
            if stream.is_backlog:
                for spec in stream.backlog_start():
                    self._submit(spec, now_s)
                continue
            job = stream.poisson_arrival()
            if job is not None:
                self._submit(job, now_s)
            if stream.next_arrival_s < math.inf:
                heapq.heappush(self.stream_events, (stream.next_arrival_s, index))

    def _submit(self, spec: JobSpec, now_s: float) -> None:
        reason = self.admission.refusal(spec.workload)
        if reason is not None:
            self.refused.append(RefusedJob(spec, reason))
            return
        job = JobRecord(spec, remaining_s=spec.duration_s, pending_since_s=now_s)
        self.jobs[spec.workload.uid] = job
        pool = self.pools[spec.workload.pool]
        pool.pending[spec.workload.uid] = job
        pool.dirty = True
        pool.changed = True
        pool.wanted_types = None

    def _start(
        self, pool: PoolState, uid: str, allocation: Allocation, cu: float, now_s: float
    ) -> None:
        job = pool.pending.pop(uid)
        pool.hopeless.discard(uid)
        pool.wanted_types = None
        assert job.pending_since_s is not None
        job.wait_s += now_s - job.pending_since_s
        job.pending_since_s = None
        job.allocation = allocation
        job.gpu_type = allocation.gpu_type
        job.gpus_by_type = _gpus_by_type(allocation, pool.node_types)
        job.gpus = math.fsum(gpus for _, gpus in job.gpus_by_type)
        job.cu = cu
        job.run_start_s = now_s
        job.token += 1
        self.sequence += 1
        heapq.heappush(self.completions, (now_s + job.remaining_s, self.sequence, uid, job.token))
        pool.running[uid] = job
        pool.running_by_queue[job.workload.queue][uid] = job
        pool.refresh_allocation(now_s, job.workload.queue, (t for t, _ in job.gpus_by_type))
        pool.changed = True
        if job.first_start_s is None:
            job.first_start_s = now_s
            generator = job.spec.generator
            if generator is not None:
                self._replace_backlog(generator, now_s)

    def _replace_backlog(self, generator: str, now_s: float) -> None:
        for stream in self.streams:
            if stream.spec.name == generator and stream.is_backlog:
                spec = stream.replacement(now_s)
                if spec is not None:
                    self._submit(spec, now_s)

    def _stop(self, job: JobRecord, now_s: float) -> None:
        pool = self.pools[job.workload.pool]
        uid = job.workload.uid
        del pool.running[uid]
        del pool.running_by_queue[job.workload.queue][uid]
        job.token += 1
        job.allocation = None
        pool.refresh_allocation(now_s, job.workload.queue, (t for t, _ in job.gpus_by_type))
        pool.dirty = True
        pool.changed = True

    def _evict(self, pool: PoolState, uid: str, now_s: float) -> None:
        job = pool.running[uid]
        ran_s = now_s - job.run_start_s
        self._stop(job, now_s)
        job.evictions += 1
        pool.evictions += 1
        if self.scenario.on_evict is EvictionMode.RESTART:
            job.lost_gpu_s += job.gpus * ran_s  # all it did since its last start
            job.remaining_s = job.spec.duration_s
        else:
            job.remaining_s = job.remaining_s - ran_s
            if job.remaining_s <= 0.0:
                # It was due at this very instant (float rounding): it completed, not evicted.
                job.remaining_s = 0.0
                job.end_s = now_s
                return
        job.pending_since_s = now_s
        pool.pending[uid] = job
        pool.wanted_types = None

    # -- fair shares --------------------------------------------------------------------------

    def _recompute(self, pool: PoolState, now_s: float) -> None:
        policy = pool.policy
        pool.recomputes += 1
        pool.changed = False
        usage = pool.usage.inputs(now_s)
        # The last division's compiled configuration: reused while it fits (a policy switch
        # or another queue tree compiles a new one), the same numbers in about half the work;
        # with it, the demands go as columns in its leaf order (issue 17).
        plan = pool.shares.shares.plan if pool.shares is not None else None
        if plan is not None and not plan.fits(pool.name, policy, pool.types_by_name, pool.queues):
            plan = None
        result = compute_fair_shares(
            FairShareInput(
                pool=pool.name,
                policy=policy,
                gpu_types=pool.types_by_name,
                capacity_gpus_by_type=pool.capacity_gpus_by_type,
                queues=pool.queues if plan is None else plan.queues,
                demands=self._demands(pool, plan),
                usage=usage,
                previous_effective_weights=pool.previous_weights,
            ),
            plan,
        )
        pool.shares = result
        pool.standing = {
            name: UsageStanding(share.weight_share, share.usage_share)
            for name, share in result.shares.items()
        }
        pool.previous_weights = dict(result.effective_weights)
        all_shares = result.fair_share_cu
        fair_share = {q.name: all_shares[q.name] for q in pool.leaves}
        if fair_share != pool.fair_share_cu:
            pool.fair_share_cu = fair_share
            pool.dirty = True
        pool.competed.update(result.competing)

    def _demands(
        self, pool: PoolState, plan: FairSharePlan | None
    ) -> dict[str, QueueDemand] | LeafDemands:
        held = (
            (j.workload.queue, gpu_type, gpus)
            for j in pool.running.values()
            for gpu_type, gpus in j.gpus_by_type
        )
        waiting = (j.workload for uid, j in pool.pending.items() if uid not in pool.hopeless)
        weights = {name: gpu_type.compute_weight for name, gpu_type in pool.types_by_name.items()}
        if plan is not None:
            return leaf_demand_columns(
                plan.leaf_names, plan.type_names, held, waiting, pool.cheapest_type, weights
            )
        return queue_demands(
            (q.name for q in pool.leaves), held, waiting, pool.cheapest_type, weights
        )

    # -- the cycle ----------------------------------------------------------------------------

    def _cycle(self, pool: PoolState, now_s: float) -> None:
        if not pool.pending or (not pool.dirty and now_s < pool.wake_s):
            return
        running = tuple(j.allocation for j in pool.running.values() if j.allocation is not None)
        snapshot = CycleSnapshot(
            pool=pool.pool,
            nodes=pool.nodes,
            gpu_types=pool.gpu_types,
            queues=pool.leaves,
            fair_share_cu=pool.fair_share_cu,
            running=running,
            pending=tuple(j.workload for j in pool.pending.values()),
            now_s=now_s,
            evicting=pool.standing_claims,
            inner_queues=pool.inner_queues,
            moved_gpus_last_hour=pool.moved_last_hour(now_s),
            standing=pool.standing,
        )
        with collector_paused():  # as the service runs a cycle (`gc_tuning`)
            result = run_cycle(snapshot, pool.carried)
        claimed_for = {
            claim.beneficiary_uid: pool.claim_reasons.get(claim.victim_uid, "")
            for claim in pool.standing_claims
            if claim.beneficiary_uid is not None
        }
        # Moved workloads: the GPUs each move sent it to, so its re-bind there reads `move`.
        moving = {c.victim_uid: c.move_to for c in pool.standing_claims if c.move_to}
        pool.standing_claims = tuple(
            EvictionInFlight(e.workload_uid, e.beneficiary_uid, e.move_to, e.move_gpu_type)
            for e in result.evicts
        )
        for evict in result.evicts:
            if evict.move_to:
                gpus = pool.running[evict.workload_uid].gpus
                pool.recent_moves.append((now_s, gpus))
                pool.moves += 1
                pool.moved_gpus += gpus
        pool.claim_reasons = {e.workload_uid: e.reason.value for e in result.evicts}
        self._record(pool, result, claimed_for, moving, now_s)
        pool.cycles_run += 1
        pool.hopeless = {uid for uid, r in result.pending.items() if r.code in _HOPELESS}
        pool.wanted_types = None
        for bind in result.binds:
            workload = pool.pending[bind.workload_uid].workload
            allocation = Allocation(workload, bind.bindings, now_s, bind.gpu_type)
            self._start(pool, bind.workload_uid, allocation, bind.cu, now_s)
        for evict in result.evicts:
            self._evict(pool, evict.workload_uid, now_s)
        pool.dirty = bool(result.binds or result.evicts)
        pool.wake_s = self._wake_s(pool, now_s)

    def _record(
        self,
        pool: PoolState,
        result: CycleResult,
        claimed_for: dict[str, str],
        moving: dict[str, tuple[PodBinding, ...]],
        now_s: float,
    ) -> None:
        """The cycle's binds and evictions as `DecisionRow`s (`events.csv`); each bind's reason
        is kept on its job (`JobRecord.started_as`) for the eviction that may end the run."""
        for bind in result.binds:
            claim = claimed_for.get(bind.workload_uid)
            if claim is not None:
                reason = f"claim:{claim}" if claim else "claim"
            elif moving.get(bind.workload_uid) == bind.bindings:
                reason = "move"
            else:
                reason = "beyond_share" if bind.over_fair_share else "within_share"
            pool.pending[bind.workload_uid].started_as = reason
            gpus = math.fsum(binding_gpus(binding) for binding in bind.bindings)
            self.decisions.append(
                DecisionRow(
                    now_s, pool.name, "bind", bind.workload_uid, bind.queue, gpus, bind.cu, reason
                )
            )
        for evict in result.evicts:
            job = pool.running[evict.workload_uid]
            beneficiary = evict.beneficiary_uid or ""
            found = pool.pending.get(beneficiary) or pool.running.get(beneficiary)
            self.decisions.append(
                DecisionRow(
                    now_s,
                    pool.name,
                    "evict",
                    evict.workload_uid,
                    evict.queue,
                    job.gpus,
                    evict.cu,
                    evict.reason.value,
                    beneficiary,
                    found.workload.queue if found is not None else "",
                    job.started_as,
                    now_s - job.run_start_s,
                    job.evictions,
                )
            )

    def _wake_s(self, pool: PoolState, now_s: float) -> float:
        """The next instant at which the cycle's clock-reading rules may decide differently."""
        wake_s = math.inf
        after_s = pool.pool.gang_reservation_after_s
        if after_s is not None:
            for job in pool.pending.values():
                at_s = job.workload.submit_time_s + after_s
                if now_s < at_s < wake_s:
                    wake_s = at_s
        for job in pool.running.values():
            workload = job.workload
            if workload.preemptible and workload.min_runtime_s > 0.0:
                at_s = job.run_start_s + workload.min_runtime_s
                borrow_s = pool.max_borrow_s.get(workload.queue)
                if borrow_s is not None:  # a loan may be called back before min_runtime_s
                    at_s = min(at_s, job.run_start_s + borrow_s)
                if now_s < at_s < wake_s:
                    wake_s = at_s
        return wake_s

    # -- sampling and results -------------------------------------------------------------

    def _sample(self, now_s: float) -> None:
        self.last_sample_s = now_s
        for pool in self.pools.values():
            pending_cu = pool.pending_cu()
            shares = pool.shares.shares if pool.shares is not None else {}
            for name in pool.tree.preorder:
                share = shares.get(name)
                self.timeline.append(
                    TimelineRow(
                        time_s=now_s,
                        pool=pool.name,
                        queue=name,
                        allocated_cu=pool.histories[name].value,
                        pending_cu=pending_cu.get(name, 0.0),
                        fair_share_cu=share.fair_share_cu if share else 0.0,
                        effective_weight=share.effective_weight if share else 0.0,
                        usage_share=share.usage_share if share else 0.0,
                        usage_cu_s=share.decayed_usage_cu_s if share else 0.0,
                        weight_share=share.weight_share if share else 0.0,
                    )
                )
            pool.fragmented.append(pool.fragmented_gpus())

    def _result(self) -> SimResult:
        horizon_s = self.horizon_s
        for job in self.jobs.values():
            if job.pending_since_s is not None:
                job.wait_s += horizon_s - job.pending_since_s  # still waiting: counted so far
        pools = [pool.pool_run() for pool in self.pools.values()]
        jobs = sorted(self.jobs.values(), key=lambda j: (j.workload.submit_time_s, j.workload.uid))
        return SimResult(
            self.scenario,
            tuple(pools),
            tuple(jobs),
            tuple(self.timeline),
            tuple(self.decisions),
            tuple(self.refused),
        )


def _gpus_by_type(
    allocation: Allocation, node_types: dict[str, str]
) -> tuple[tuple[str, float], ...]:
    """The allocation's GPUs per type of the nodes its pods are on, by type name."""
    parts: dict[str, list[float]] = {}
    for binding in allocation.bindings:
        gpu_type = node_types.get(binding.node, allocation.gpu_type)
        parts.setdefault(gpu_type, []).append(binding_gpus(binding))
    return tuple((name, math.fsum(parts[name])) for name in sorted(parts))


def simulate(scenario: Scenario, progress: Callable[[float], None] | None = None) -> SimResult:
    """Run `scenario` once (module docstring)."""
    return Simulation(scenario, progress).run()
