"""The run-time state of one node pool in the simulation (`engine`): its nodes and capacity,
its queue tree, the jobs waiting and running in it, its allocation and usage histories, the
latest fair shares, what the next cycle carries over from the last, and its counters; with the
measures taken of it as the run goes (the CU waiting per queue, the GPUs fragmented, those
moved in the last hour) and, at the end, its summary (`PoolState.pool_run`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from gpufair.domain import cu_request
from gpufair.domain.cycle_memory import CarriedLoad
from gpufair.domain.demand import serving_types
from gpufair.domain.fairshare import FairShareResult
from gpufair.domain.model import ClusterConfig, GpuType, NodePool, Queue, Workload
from gpufair.domain.placement_ask import adequate_types
from gpufair.domain.policy import max_borrow_s
from gpufair.domain.snapshot import EvictionInFlight, UsageStanding
from gpufair.domain.tree import QueueTree
from gpufair.sim.history import QueueHistory
from gpufair.sim.records import JobRecord, PoolRun, QueueRun
from gpufair.sim.running_usage import PoolUsage


class PoolState:
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

    def pending_cu(self) -> dict[str, float]:
        """The CU of the jobs waiting here that could run, per queue and its ancestors, each
        on the cheapest type that serves it (the timeline's `pending_cu`)."""
        parts: dict[str, list[float]] = {}
        for uid, job in self.pending.items():
            if uid in self.hopeless:
                continue
            gpu_type = self.cheapest_type(job.workload)
            if gpu_type is None:
                continue
            cu = job.workload.total_gpus * self.types_by_name[gpu_type].compute_weight
            if job.workload.compute_units > 0.0:
                choices = cu_request.options(job.workload, self.types_by_name, (gpu_type,))
                cu = choices[0].given_cu if choices else 0.0
            name: str | None = job.workload.queue
            while name is not None:
                parts.setdefault(name, []).append(cu)
                name = self.tree.queues[name].parent
        return {name: math.fsum(values) for name, values in parts.items()}

    def fragmented_gpus(self) -> float:
        """Free GPU capacity on nodes partly in use: a gang wanting whole nodes cannot use it."""
        used: dict[str, list[float]] = {}
        for job in self.running.values():
            if job.allocation is None:
                continue
            for binding in job.allocation.bindings:
                amount = binding.gpu_fraction * len(binding.gpu_indices)
                used.setdefault(binding.node, []).append(amount)
        free = []
        for node in self.nodes:
            if node.ready and node.name in used:
                free.append(max(0.0, node.gpu_count - math.fsum(used[node.name])))
        return math.fsum(free)

    def moved_last_hour(self, now_s: float) -> float:
        """GPUs moved by defragmentation in the hour before `now_s` (older entries are dropped)."""
        if not self.recent_moves:
            return 0.0
        self.recent_moves = [
            (at_s, gpus) for at_s, gpus in self.recent_moves if at_s > now_s - 3600.0
        ]
        return math.fsum(gpus for _, gpus in self.recent_moves)

    def pool_run(self) -> PoolRun:
        """The pool after the run, with its queues (`SimResult.pools`)."""
        queues = []
        for name in self.tree.preorder:
            queue = self.tree.queues[name]
            quota = queue.quota(self.name)
            share = self.shares.shares[name] if self.shares is not None else None
            queues.append(
                QueueRun(
                    name=name,
                    parent=queue.parent,
                    is_leaf=self.tree.is_leaf(name),
                    deserved_cu=share.deserved_cu if share else quota.deserved_cu,
                    over_quota_weight=quota.over_quota_weight,
                    competed=name in self.competed,
                    changes=tuple(self.histories[name].changes),
                )
            )
        return PoolRun(
            name=self.name,
            k=self.policy.k,
            capacity_cu=self.capacity_cu,
            capacity_gpus=self.capacity_gpus,
            queues=tuple(queues),
            gpu_changes=tuple(self.gpu_history.changes),
            evictions=self.evictions,
            idle_gpu_s_while_pending=math.fsum(self.idle_parts),
            fragmented_gpus=tuple(self.fragmented),
            cycles_run=self.cycles_run,
            recomputes=self.recomputes,
            moves=self.moves,
            moved_gpus=self.moved_gpus,
        )
