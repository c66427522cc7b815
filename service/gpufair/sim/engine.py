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

Determinism: no wall clock, no unordered iteration (pools by name, queues in tree order, jobs in
arrival order), one random stream per generator. The same scenario and seed give the same run.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from gpufair.domain import cu_request
from gpufair.domain.capacity import binding_gpus
from gpufair.domain.cycle import run_cycle
from gpufair.domain.cycle_memory import CarriedLoad
from gpufair.domain.demand import leaf_demand_columns, queue_demands, serving_types
from gpufair.domain.fairshare import (
    FairShareInput,
    FairSharePlan,
    FairShareResult,
    LeafDemands,
    QueueDemand,
    compute_fair_shares,
)
from gpufair.domain.model import (
    Allocation,
    ClusterConfig,
    GpuType,
    NodePool,
    PodBinding,
    Queue,
    Workload,
)
from gpufair.domain.placement import adequate_types
from gpufair.domain.policy import max_borrow_s
from gpufair.domain.snapshot import (
    CycleResult,
    CycleSnapshot,
    EvictionInFlight,
    PendingCode,
    UsageStanding,
)
from gpufair.domain.tree import QueueTree
from gpufair.gc_tuning import collector_paused
from gpufair.sim.admission import Admission, RefusedJob
from gpufair.sim.generators import GeneratorStream
from gpufair.sim.history import QueueHistory
from gpufair.sim.jobspec import JobSpec
from gpufair.sim.running_usage import PoolUsage
from gpufair.sim.scenario import EvictionMode, Scenario

# Pending codes under which a job cannot run in this pool whatever happens: it is left out of
# demand and of "idle while work was pending".
_HOPELESS = frozenset({PendingCode.NEVER_FITS, PendingCode.UNKNOWN_QUEUE, PendingCode.OTHER_POOL})


@dataclass(slots=True)
class JobRecord:
    """One job through the run."""

    spec: JobSpec
    remaining_s: float
    pending_since_s: float | None = None
    first_start_s: float | None = None
    end_s: float | None = None
    wait_s: float = 0.0
    evictions: int = 0
    lost_gpu_s: float = 0.0  # GPU-seconds of work evictions threw away (`on_evict: restart`)
    token: int = 0  # bumped at every start and stop, so stale completion events are ignored
    run_start_s: float = 0.0
    allocation: Allocation | None = None
    gpu_type: str = ""
    gpus: float = 0.0
    cu: float = 0.0
    # The GPUs of its last run per type, by type name: one entry unless a compute-unit request
    # mixed types, whose GPUs count each on its own type (as the ledger splits a run).
    gpus_by_type: tuple[tuple[str, float], ...] = ()
    started_as: str = ""  # the `DecisionRow.reason` of the bind that started its last run

    @property
    def workload(self) -> Workload:
        return self.spec.workload


@dataclass(frozen=True, slots=True)
class TimelineRow:
    time_s: float
    pool: str
    queue: str
    allocated_cu: float
    pending_cu: float
    fair_share_cu: float
    effective_weight: float
    usage_share: float
    usage_cu_s: float  # decayed usage (numerator of U')
    weight_share: float = 0.0  # W' of the latest recompute (0: the queue did not compete)


@dataclass(frozen=True, slots=True)
class DecisionRow:
    """One bind or eviction of a cycle (`events.csv`). `reason`: for a bind `within_share`,
    `beyond_share`, `claim:<eviction reason>` when it binds on capacity evicted for it, or `move`
    when a workload a defragmentation move stopped binds where the move sent it; for an eviction
    its `EvictReason` (`reclaim`, `preempt`, `defragment`, `entitlement`): the phase that decided
    it. `beneficiary` (and its queue): whom an eviction was made for.

    An eviction's chain back to what placed the victim, so that evictions one change causes can
    be told from those it does not (`bench/bench_defrag.py` counts them): `started_as`, the
    `reason` of the bind that started the run it was evicted from (`move`: a move put it there;
    `beyond_share`: work-conserving, the first reclaim takes); `ran_s`, how long that run lasted
    (the victim order prefers the most recently started, and `min_runtime_s` counts from there);
    `evicted_before`, how many times it was evicted earlier in the run (a workload evicted,
    bound again beyond its share and evicted again counts each time)."""

    time_s: float
    pool: str
    event: str  # "bind" or "evict"
    uid: str
    queue: str
    gpus: float
    cu: float
    reason: str
    beneficiary: str = ""
    beneficiary_queue: str = ""
    started_as: str = ""
    ran_s: float = 0.0
    evicted_before: int = 0


@dataclass(frozen=True, slots=True)
class QueueRun:
    """One queue of one pool after the run: its terms and its whole allocation history."""

    name: str
    parent: str | None
    is_leaf: bool
    deserved_cu: float
    over_quota_weight: float
    competed: bool  # took part in the over-quota division at some recompute
    changes: tuple[tuple[float, float], ...]  # (instant, CU held from then on)


@dataclass(frozen=True, slots=True)
class PoolRun:
    name: str
    k: float
    capacity_cu: float
    capacity_gpus: float
    queues: tuple[QueueRun, ...]  # tree pre-order
    gpu_changes: tuple[tuple[float, float], ...]  # (instant, GPUs allocated from then on)
    evictions: int
    idle_gpu_s_while_pending: float
    fragmented_gpus: tuple[float, ...]  # at each timeline sample
    cycles_run: int
    recomputes: int
    moves: int = 0  # evictions that were defragmentation moves (re-placed at once)
    moved_gpus: float = 0.0


@dataclass(frozen=True, slots=True)
class SimResult:
    scenario: Scenario
    pools: tuple[PoolRun, ...]
    jobs: tuple[JobRecord, ...]  # by submit time, then uid
    timeline: tuple[TimelineRow, ...]
    decisions: tuple[DecisionRow, ...] = ()  # in the order they were made
    refused: tuple[RefusedJob, ...] = ()  # jobs the service's submit checks refused, by arrival


class _Pool:
    """The run-time state of one node pool."""

    def __init__(self, pool: NodePool, cluster: ClusterConfig, recompute_s: float) -> None:
        self.pool = pool
        self.name = pool.name
        self.policy = pool.policy
        self.recompute_s = recompute_s
        self.next_recompute_s = 0.0
        self.periodic_recomputes = 0
        self.recomputes = 0  # periodic ones and those before a cycle after a change
        # A job of the pool was submitted or changed state since the latest recompute.
        self.changed = False
        self.nodes = tuple(n for n in cluster.nodes if n.pool == pool.name)
        self.node_types = {n.name: n.gpu_type for n in self.nodes}
        self.gpu_types: tuple[GpuType, ...] = cluster.gpu_types
        self.types_by_name = {t.name: t for t in cluster.gpu_types}
        weights = {t.name: t.compute_weight for t in cluster.gpu_types}
        capacity: dict[str, float] = {}
        for node in self.nodes:
            if node.ready:
                capacity[node.gpu_type] = capacity.get(node.gpu_type, 0.0) + node.gpu_count
        self.capacity_gpus_by_type = capacity
        self.capacity_gpus = math.fsum(capacity.values())
        self.capacity_cu = math.fsum(g * weights[t] for t, g in capacity.items())
        self.present = tuple(t for t in capacity if capacity[t] > 0)
        self.queues: tuple[Queue, ...] = cluster.queues
        self.tree = QueueTree.build(cluster.queues)
        self.leaves = cluster.leaf_queues()
        leaf_names = {q.name for q in self.leaves}
        self.inner_queues = tuple(q for q in self.queues if q.name not in leaf_names)
        # Per leaf queue: when its loans are called back (`policy.max_borrow_s`).
        self.max_borrow_s = {q.name: max_borrow_s(q.quota(pool.name), pool) for q in self.leaves}
        # The last cycle's evictions, passed to the next cycle as standing claims; their reasons.
        self.claim_reasons: dict[str, str] = {}
        self.standing_claims: tuple[EvictionInFlight, ...] = ()
        # Defragmentation moves: (instant, GPUs) of those within the last hour, and totals.
        self.recent_moves: list[tuple[float, float]] = []
        self.moves = 0
        self.moved_gpus = 0.0
        self.histories = {name: QueueHistory() for name in self.tree.preorder}
        self.usage = PoolUsage(
            pool.name, pool.policy, cluster.queues, self.types_by_name, self.capacity_cu
        )
        self.gpu_history = QueueHistory()
        self.pending: dict[str, JobRecord] = {}
        self.running: dict[str, JobRecord] = {}
        self.running_by_queue: dict[str, dict[str, JobRecord]] = {q.name: {} for q in self.leaves}
        self.hopeless: set[str] = set()
        self.shares: FairShareResult | None = None
        self.standing: dict[str, UsageStanding] = {}  # W' and U' of `shares`, for the cycle
        # The last cycle's loaded records: a job's workload and allocation are the same objects
        # from cycle to cycle, so the next cycle loads only what changed (`cycle_memory`).
        self.carried = CarriedLoad()
        self.fair_share_cu: dict[str, float] = {}
        self.previous_weights: dict[str, float] = {}
        self.competed: set[str] = set()
        self.dirty = True
        self.wake_s = math.inf
        self.cycles_run = 0
        self.evictions = 0
        self.idle_parts: list[float] = []
        self.fragmented: list[float] = []
        self.allocated_gpus_by_type: dict[str, float] = {}
        self.types_memo: dict[tuple[object, ...], tuple[str, ...]] = {}
        # The type a waiting job's demand is counted on, as the server's recompute counts it
        # (`domain.demand.serving_types`): the nodes do not change in a simulation.
        self.cheapest_type = serving_types(self.types_by_name, self.nodes)
        self.wanted_types: tuple[str, ...] | None = ()  # None: to be derived again

    def adequate(self, workload: Workload) -> tuple[str, ...]:
        """The pool's GPU types that serve `workload`, cheapest first (`placement`)."""
        key = (
            workload.allowed_gpu_types,
            workload.min_gpu_memory_gib,
            workload.gpus_per_pod,
            workload.partition_profile,
            workload.compute_units,
        )
        types = self.types_memo.get(key)
        if types is None:
            types = adequate_types(workload, self.types_by_name, self.present)
            self.types_memo[key] = types
        return types

    def idle_gpus_wanted(self) -> float:
        """Free GPUs of the types some job waiting here could use (0 when none waits)."""
        if self.wanted_types is None:
            wanted: set[str] = set()
            for uid, job in self.pending.items():
                if uid not in self.hopeless:
                    wanted.update(self.adequate(job.workload))
            self.wanted_types = tuple(sorted(wanted))
        return math.fsum(
            self.capacity_gpus_by_type[t] - self.allocated_gpus_by_type.get(t, 0.0)
            for t in self.wanted_types
        )

    def refresh_allocation(self, now_s: float, queue: str, gpu_types: Iterable[str]) -> None:
        """Re-derive `queue`'s CU (and its ancestors') and the GPUs of `gpu_types` in use from
        what runs, after a start or stop; fsum over the jobs, so no float residue builds up."""
        jobs = self.running_by_queue[queue]
        held = math.fsum(j.cu for j in jobs.values())
        self.histories[queue].set(now_s, held)
        self.usage.set(now_s, queue, held)
        parent = self.tree.queues[queue].parent
        while parent is not None:
            total = math.fsum(self.histories[c].value for c in self.tree.children_of(parent))
            self.histories[parent].set(now_s, total)
            self.usage.set(now_s, parent, total)
            parent = self.tree.queues[parent].parent
        for gpu_type in gpu_types:
            self.allocated_gpus_by_type[gpu_type] = math.fsum(
                gpus
                for j in self.running.values()
                for name, gpus in j.gpus_by_type
                if name == gpu_type
            )
        self.gpu_history.set(now_s, math.fsum(self.allocated_gpus_by_type.values()))


class Simulation:
    """One run of a scenario. `progress(fraction)` is called as simulated time advances."""

    def __init__(self, scenario: Scenario, progress: Callable[[float], None] | None = None) -> None:
        self.scenario = scenario
        self.progress = progress
        self.horizon_s = scenario.duration_s
        self.pools = {
            p.name: _Pool(p, scenario.cluster, scenario.recompute_interval_s(p))
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
        self, pool: _Pool, uid: str, allocation: Allocation, cu: float, now_s: float
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

    def _evict(self, pool: _Pool, uid: str, now_s: float) -> None:
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

    def _recompute(self, pool: _Pool, now_s: float) -> None:
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
        self, pool: _Pool, plan: FairSharePlan | None
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

    def _cycle(self, pool: _Pool, now_s: float) -> None:
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
            moved_gpus_last_hour=_moved_last_hour(pool, now_s),
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
        pool: _Pool,
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

    def _wake_s(self, pool: _Pool, now_s: float) -> float:
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
            pending_cu = self._pending_cu(pool)
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
            pool.fragmented.append(self._fragmented_gpus(pool))

    def _pending_cu(self, pool: _Pool) -> dict[str, float]:
        parts: dict[str, list[float]] = {}
        for uid, job in pool.pending.items():
            if uid in pool.hopeless:
                continue
            gpu_type = pool.cheapest_type(job.workload)
            if gpu_type is None:
                continue
            cu = job.workload.total_gpus * pool.types_by_name[gpu_type].compute_weight
            if job.workload.compute_units > 0.0:
                choices = cu_request.options(job.workload, pool.types_by_name, (gpu_type,))
                cu = choices[0].given_cu if choices else 0.0
            name: str | None = job.workload.queue
            while name is not None:
                parts.setdefault(name, []).append(cu)
                name = pool.tree.queues[name].parent
        return {name: math.fsum(values) for name, values in parts.items()}

    def _fragmented_gpus(self, pool: _Pool) -> float:
        """Free GPU capacity on nodes partly in use: a gang wanting whole nodes cannot use it."""
        used: dict[str, list[float]] = {}
        for job in pool.running.values():
            if job.allocation is None:
                continue
            for binding in job.allocation.bindings:
                amount = binding.gpu_fraction * len(binding.gpu_indices)
                used.setdefault(binding.node, []).append(amount)
        free = []
        for node in pool.nodes:
            if node.ready and node.name in used:
                free.append(max(0.0, node.gpu_count - math.fsum(used[node.name])))
        return math.fsum(free)

    def _result(self) -> SimResult:
        horizon_s = self.horizon_s
        for job in self.jobs.values():
            if job.pending_since_s is not None:
                job.wait_s += horizon_s - job.pending_since_s  # still waiting: counted so far
        pools = []
        for pool in self.pools.values():
            queues = []
            for name in pool.tree.preorder:
                queue = pool.tree.queues[name]
                quota = queue.quota(pool.name)
                share = pool.shares.shares[name] if pool.shares is not None else None
                queues.append(
                    QueueRun(
                        name=name,
                        parent=queue.parent,
                        is_leaf=pool.tree.is_leaf(name),
                        deserved_cu=share.deserved_cu if share else quota.deserved_cu,
                        over_quota_weight=quota.over_quota_weight,
                        competed=name in pool.competed,
                        changes=tuple(pool.histories[name].changes),
                    )
                )
            pools.append(
                PoolRun(
                    name=pool.name,
                    k=pool.policy.k,
                    capacity_cu=pool.capacity_cu,
                    capacity_gpus=pool.capacity_gpus,
                    queues=tuple(queues),
                    gpu_changes=tuple(pool.gpu_history.changes),
                    evictions=pool.evictions,
                    idle_gpu_s_while_pending=math.fsum(pool.idle_parts),
                    fragmented_gpus=tuple(pool.fragmented),
                    cycles_run=pool.cycles_run,
                    recomputes=pool.recomputes,
                    moves=pool.moves,
                    moved_gpus=pool.moved_gpus,
                )
            )
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


def _moved_last_hour(pool: _Pool, now_s: float) -> float:
    """GPUs moved by defragmentation in the hour before `now_s` (older entries are dropped)."""
    if not pool.recent_moves:
        return 0.0
    pool.recent_moves = [(at_s, gpus) for at_s, gpus in pool.recent_moves if at_s > now_s - 3600.0]
    return math.fsum(gpus for _, gpus in pool.recent_moves)


def simulate(scenario: Scenario, progress: Callable[[float], None] | None = None) -> SimResult:
    """Run `scenario` once (module docstring)."""
    return Simulation(scenario, progress).run()
