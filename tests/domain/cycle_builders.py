"""Small builders for cycle tests: a pool `main`, four GPU types, terse nodes, queues, workloads.

GPU types follow DESIGN §2: an A100-80GB is 10 CU, a V100-16GB 4 CU, an RTX 4090-24GB 2 CU.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

import pytest

from gpufair.domain import cycle_preempt
from gpufair.domain.capacity import EPS, Capacity, uses_of
from gpufair.domain.cycle import run_cycle
from gpufair.domain.cycle_state import CycleState
from gpufair.domain.model import (
    Allocation,
    GpuType,
    Node,
    NodePool,
    PlacementStrategy,
    PodBinding,
    Queue,
    QueueQuota,
    TopologyConstraint,
    Workload,
)
from gpufair.domain.placement_ask import Ask, Exclusion, PodShape
from gpufair.domain.snapshot import (
    CycleResult,
    CycleSnapshot,
    EvictionInFlight,
    EvictReason,
    ReservationKind,
    UsageStanding,
)
from gpufair.domain.victim_search import VictimBudget, VictimIndex, select_victims

POOL = "main"
A100 = GpuType("a100-80gb", memory_gib=80, compute_weight=10)
V100 = GpuType("v100-16gb", memory_gib=16, compute_weight=4)
RTX4090 = GpuType("rtx4090-24gb", memory_gib=24, compute_weight=2)
UNIT = GpuType("unit", memory_gib=40, compute_weight=1)  # 1 CU per GPU: CU read as GPUs
GPU_TYPES = (A100, V100, RTX4090, UNIT)


def node(
    name: str,
    gpu_type: GpuType = UNIT,
    gpus: int = 8,
    *,
    cpu_millicores: int = 64_000,
    memory_mib: int = 512_000,
    ready: bool = True,
    **labels: str,
) -> Node:
    return Node(name, POOL, gpu_type.name, gpus, cpu_millicores, memory_mib, labels, ready)


def queue(
    name: str,
    deserved_cu: float = 0.0,
    *,
    priority: int = 0,
    limit_cu: float | None = None,
    deserved_gpus_by_type: Mapping[str, float] | None = None,
    limit_gpus_by_type: Mapping[str, float] | None = None,
    parent: str | None = None,
    max_borrow_s: float | None = None,
) -> Queue:
    quota = QueueQuota(
        pool=POOL,
        deserved_cu=deserved_cu,
        priority=priority,
        limit_cu=limit_cu,
        deserved_gpus_by_type=deserved_gpus_by_type or {},
        limit_gpus_by_type=limit_gpus_by_type or {},
        max_borrow_s=max_borrow_s,
    )
    return Queue(name, parent=parent, quotas={POOL: quota})


def workload(
    uid: str,
    queue_name: str,
    pods: int = 1,
    gpus: float = 1.0,
    submit_time_s: float = 0.0,
    *,
    min_pods: int | None = None,
    types: tuple[str, ...] = (),
    min_gpu_memory_gib: float = 0.0,
    cpu_millicores: int = 0,
    memory_mib: int = 0,
    topology: TopologyConstraint | None = None,
    priority_class: int = 0,
    preemptible: bool = True,
    min_runtime_s: float = 0.0,
) -> Workload:
    return Workload(
        uid=uid,
        queue=queue_name,
        pool=POOL,
        pods=pods,
        gpus_per_pod=gpus,
        submit_time_s=submit_time_s,
        min_pods=min_pods,
        allowed_gpu_types=types,
        min_gpu_memory_gib=min_gpu_memory_gib,
        cpu_millicores_per_pod=cpu_millicores,
        memory_mib_per_pod=memory_mib,
        topology=topology,
        priority_class=priority_class,
        preemptible=preemptible,
        min_runtime_s=min_runtime_s,
    )


def running(
    job: Workload,
    placements: Iterable[tuple[str, tuple[int, ...]] | tuple[str, tuple[int, ...], float]],
    gpu_type: GpuType = UNIT,
    started_at_s: float = 0.0,
) -> Allocation:
    """`placements`: per pod (node, GPU indices) or (node, (index,), fraction)."""
    bindings = []
    for position, spec in enumerate(placements):
        fraction = spec[2] if len(spec) == 3 else 1.0
        bindings.append(PodBinding(position, spec[0], spec[1], fraction))
    return Allocation(job, tuple(bindings), started_at_s, gpu_type.name)


def halves_and_fours() -> list[Allocation]:
    """Queue a's class-0 work on 8-GPU nodes x and y: on x, half of each GPU (`half0`-`half7`)
    beside a non-preemptible half (no GPU freed with them gone); on y, four one-GPU jobs
    (`low0`-`low3`, started at 0-3 s) beside a non-preemptible 4-GPU job (four GPUs freed). The
    preemption room tests' pool (`test_preempt_room_counts`, `test_preempt_room_index`)."""
    work = []
    for gpu in range(8):
        low = workload(f"half{gpu}", "a", gpus=0.5)
        work.append(running(low, [("x", (gpu,), 0.5)], started_at_s=gpu))
        keep = workload(f"keep{gpu}", "a", gpus=0.5, preemptible=False)
        work.append(running(keep, [("x", (gpu,), 0.5)], started_at_s=gpu))
    for gpu in range(4):
        work.append(running(workload(f"low{gpu}", "a"), [("y", (gpu,))], started_at_s=gpu))
    work.append(running(workload("big", "a", gpus=4, preemptible=False), [("y", (4, 5, 6, 7))]))
    return work


def snapshot(
    nodes: Iterable[Node],
    queues: Iterable[Queue],
    fair_share_cu: Mapping[str, float],
    *,
    running_work: Iterable[Allocation] = (),
    pending: Iterable[Workload] = (),
    now_s: float = 1_000.0,
    evicting: Iterable[EvictionInFlight] = (),
    placement: PlacementStrategy = PlacementStrategy.BINPACK,
    gang_reservation_after_s: float | None = None,
    inner_queues: Iterable[Queue] = (),
    max_borrow_s: float | None = None,
    topology_levels: tuple[str, ...] = (),
    max_moved_share_per_hour: float | None = None,
    moved_gpus_last_hour: float = 0.0,
    standing: Mapping[str, UsageStanding] | None = None,
    gang_entitlement: bool = True,  # the rule needs `standing` too, empty by default
    gpu_types: Iterable[GpuType] = GPU_TYPES,
) -> CycleSnapshot:
    return CycleSnapshot(
        pool=NodePool(
            POOL,
            placement=placement,
            gang_reservation_after_s=gang_reservation_after_s,
            max_borrow_s=max_borrow_s,
            topology_levels=topology_levels,
            max_moved_share_per_hour=max_moved_share_per_hour,
            gang_entitlement=gang_entitlement,
        ),
        nodes=tuple(nodes),
        gpu_types=tuple(gpu_types),
        queues=tuple(queues),
        fair_share_cu=dict(fair_share_cu),
        running=tuple(running_work),
        pending=tuple(pending),
        now_s=now_s,
        evicting=tuple(evicting),
        inner_queues=tuple(inner_queues),
        moved_gpus_last_hour=moved_gpus_last_hour,
        standing=dict(standing or {}),
    )


def assert_no_oversubscription(snap: CycleSnapshot, result: CycleResult) -> None:
    """Running work plus binds never exceed any GPU (1.0), node CPU or node memory."""
    nodes = {n.name: n for n in snap.nodes if n.ready}
    gpu_use: dict[tuple[str, int], float] = defaultdict(float)
    cpu_use: dict[str, int] = defaultdict(int)
    memory_use: dict[str, int] = defaultdict(int)
    by_uid = {w.uid: w for w in snap.pending}
    placed = [(a.workload, a.bindings) for a in snap.running]
    placed += [(by_uid[b.workload_uid], b.bindings) for b in result.binds]
    for job, bindings in placed:
        for binding in bindings:
            if binding.node not in nodes:
                continue
            amount = binding.gpu_fraction if binding.gpu_fraction < 1.0 else 1.0
            for gpu in binding.gpu_indices:
                gpu_use[(binding.node, gpu)] += amount
            cpu_use[binding.node] += job.cpu_millicores_per_pod
            memory_use[binding.node] += job.memory_mib_per_pod
    for (name, gpu), used in gpu_use.items():
        assert 0 <= gpu < nodes[name].gpu_count, (name, gpu)
        assert used <= 1.0 + EPS, (name, gpu, used)
    for name, used_cpu in cpu_use.items():
        assert used_cpu <= nodes[name].cpu_millicores, name
    for name, used_memory in memory_use.items():
        assert used_memory <= nodes[name].memory_mib, name


def assert_holds_fit(snap: CycleSnapshot, result: CycleResult) -> None:
    """Once every victim (evicted now or earlier) has stopped, this cycle's binds and all the
    GPUs held for waiting workloads fit together: holds never overlap each other nor a bind,
    and each hold is a whole gang on nodes of its type."""
    capacity = Capacity(n for n in snap.nodes if n.ready)
    pending = {w.uid: w for w in snap.pending}
    leaving = {e.workload_uid for e in result.evicts} | {e.victim_uid for e in snap.evicting}
    for allocation in snap.running:
        if allocation.workload.uid not in leaving:
            capacity.take(list(uses_of(capacity, allocation.workload, allocation.bindings)))
    for bind in result.binds:
        capacity.take(list(uses_of(capacity, pending[bind.workload_uid], bind.bindings)))
    nodes = {n.name: n for n in snap.nodes}
    for reservation in result.reservations:
        if reservation.kind is not ReservationKind.EVICTED_CAPACITY:
            continue
        job = pending[reservation.workload_uid]
        assert job.gang_min_pods <= len(reservation.held) <= job.pods
        assert {nodes[b.node].gpu_type for b in reservation.held} == {reservation.gpu_type}
        assert {b.node for b in reservation.held} == set(reservation.nodes)
        capacity.take(list(uses_of(capacity, job, reservation.held)))
    for state in capacity.nodes:
        assert all(used <= 1.0 + EPS for used in state.gpu_used), state.name
        assert state.cpu_free >= 0 and state.memory_free >= 0, state.name


def bound_uids(result: CycleResult) -> set[str]:
    return {b.workload_uid for b in result.binds}


def evictions(result: CycleResult) -> list[tuple[str, EvictReason]]:
    """Each evicted workload with why, in uid order."""
    return sorted((e.workload_uid, e.reason) for e in result.evicts)


def evicted_uids(result: CycleResult) -> set[str]:
    return {e.workload_uid for e in result.evicts}


def run_cycles(
    nodes: Iterable[Node],
    queues: Iterable[Queue],
    fair_share_cu: Mapping[str, float],
    *,
    running_work: Iterable[Allocation] = (),
    pending: Iterable[Workload] = (),
    cycles: int = 10,
    until_settled: bool = True,
) -> list[CycleResult]:
    """Cycles one after another, 10 s apart, as the service runs them: binds start at once, an
    evicted workload keeps its GPUs for one more cycle (an eviction in flight) and has stopped by
    the one after. Stops after `cycles`, or (`until_settled`) once a cycle decides nothing and
    nothing is in flight."""
    nodes, queues = tuple(nodes), tuple(queues)
    live = {a.workload.uid: a for a in running_work}
    waiting = {w.uid: w for w in pending}
    in_flight: list[EvictionInFlight] = []
    results: list[CycleResult] = []
    for cycle in range(cycles):
        now_s = 1_000.0 + 10.0 * cycle
        snap = snapshot(
            nodes,
            queues,
            fair_share_cu,
            running_work=live.values(),
            pending=waiting.values(),
            now_s=now_s,
            evicting=in_flight,
        )
        result = run_cycle(snap)
        assert_no_oversubscription(snap, result)
        results.append(result)
        for stopped in in_flight:
            live.pop(stopped.victim_uid, None)
        for bind in result.binds:
            job = waiting.pop(bind.workload_uid)
            live[job.uid] = Allocation(job, bind.bindings, now_s, bind.gpu_type)
        in_flight = [EvictionInFlight(e.workload_uid, e.beneficiary_uid) for e in result.evicts]
        if until_settled and not (result.binds or result.evicts or in_flight or snap.evicting):
            break
    return results


def count_victim_searches(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The GPU types of the victim searches preemption makes from now on in the test, in
    order (`cycle_preempt.select_victims`, counted and then run as usual)."""
    searched: list[str] = []
    search = cycle_preempt.select_victims

    def counted(*args: Any, **kwargs: Any) -> Any:
        searched.append(args[1].gpu_type)
        return search(*args, **kwargs)

    monkeypatch.setattr(cycle_preempt, "select_victims", counted)
    return searched


def limits_asked_in_preemption(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The uids `CycleState.pods_allowed` (a queue's limits) is asked about inside preemption's
    tries (`cycle_preempt._try_preempt`), in order, as the cycle goes on."""
    asked: list[str] = []
    trying: list[bool] = []
    pods_allowed = CycleState.pods_allowed
    try_preempt = cycle_preempt._try_preempt

    def counted(self: CycleState, item: Any, gpu_type: str, within_share: bool) -> int:
        if trying:
            asked.append(item.uid)
        return pods_allowed(self, item, gpu_type, within_share)

    def flagged(*args: Any) -> None:
        trying.append(True)
        try:
            try_preempt(*args)
        finally:
            trying.pop()

    monkeypatch.setattr(CycleState, "pods_allowed", counted)
    monkeypatch.setattr(cycle_preempt, "_try_preempt", flagged)
    return asked


def victims_found(
    capacity: Capacity, index: VictimIndex, shape: PodShape, cu_left: Mapping[str, float]
) -> list[str] | None:
    """The uids `victim_search.select_victims` picks for one pod of `shape` on type "a100"
    (binpack, nothing excluded, budgets of CU alone), or None when nothing fits."""
    found = select_victims(
        capacity,
        Ask(shape, "a100", 1, 1),
        PlacementStrategy.BINPACK,
        Exclusion(),
        index=index,
        budget=VictimBudget(cu_left, {}),
    )
    return None if found is None else [victim.uid for victim in found.victims]
