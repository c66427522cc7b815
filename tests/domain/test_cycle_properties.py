"""Invariants of DESIGN §4.5 over random clusters, queues and workloads, across several cycles.

Each example runs a short simulation: binds start at once; an evicted workload keeps its GPUs
for one more cycle (passed back as an eviction in flight) and has stopped by the one after.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace

import pytest
from cycle_builders import (
    A100,
    GPU_TYPES,
    POOL,
    RTX4090,
    UNIT,
    V100,
    assert_holds_fit,
    assert_no_oversubscription,
    node,
    queue,
    running,
    snapshot,
    workload,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpufair.domain import cycle as phases
from gpufair.domain.capacity import EPS
from gpufair.domain.cycle import run_cycle
from gpufair.domain.cycle_state import CycleState
from gpufair.domain.model import (
    Allocation,
    Node,
    PlacementStrategy,
    Queue,
    TopologyConstraint,
    Workload,
)
from gpufair.domain.placement_ask import gpu_memory_per_pod_gib
from gpufair.domain.snapshot import (
    CycleResult,
    CycleSnapshot,
    EvictionInFlight,
    EvictReason,
    ReservationKind,
    UsageStanding,
)

TYPES_BY_NAME = {gpu_type.name: gpu_type for gpu_type in GPU_TYPES}


@dataclass(frozen=True)
class World:
    nodes: list[Node]
    queues: list[Queue]
    shares: list[dict[str, float]]  # one set of fair shares per cycle
    arrivals: list[list[Workload]]  # workloads submitted before each cycle
    placement: PlacementStrategy
    gang_reservation_after_s: float | None
    standing: list[dict[str, UsageStanding]]  # W' and U' per cycle (gang entitlement)


@st.composite
def _nodes(draw: st.DrawFn) -> list[Node]:
    count = draw(st.integers(1, 6))
    return [
        node(
            f"n{i}",
            draw(st.sampled_from([A100, V100, RTX4090, UNIT])),
            gpus=draw(st.sampled_from([1, 2, 4, 8])),
            cpu_millicores=draw(st.sampled_from([8_000, 32_000])),
            memory_mib=draw(st.sampled_from([16_000, 64_000])),
            ready=draw(st.sampled_from([True, True, True, False])),
            rack=f"r{draw(st.integers(0, 2))}",
        )
        for i in range(count)
    ]


@st.composite
def _workload(draw: st.DrawFn, uid: str, queues: list[str], submit_time_s: float) -> Workload:
    pods = draw(st.integers(1, 4))
    topology = draw(
        st.sampled_from(
            [None, None, TopologyConstraint("rack", True), TopologyConstraint("rack", False)]
        )
    )
    return workload(
        uid,
        draw(st.sampled_from(queues)),
        pods=pods,
        gpus=draw(st.sampled_from([0.25, 0.5, 1.0, 1.0, 2.0, 4.0])),
        submit_time_s=submit_time_s,
        min_pods=draw(st.sampled_from([None, None, 1])),
        types=draw(st.sampled_from([(), (), (A100.name,), (V100.name, RTX4090.name)])),
        min_gpu_memory_gib=draw(st.sampled_from([0.0, 0.0, 20.0, 30.0])),
        cpu_millicores=draw(st.sampled_from([0, 2_000, 6_000])),
        memory_mib=draw(st.sampled_from([0, 8_000])),
        topology=topology,
        priority_class=draw(st.integers(0, 2)),
        preemptible=draw(st.sampled_from([True, True, True, False])),
        min_runtime_s=draw(st.sampled_from([0.0, 0.0, 1_500.0])),
    )


@st.composite
def worlds(draw: st.DrawFn) -> World:
    nodes = draw(_nodes())
    names = [f"q{i}" for i in range(draw(st.integers(1, 4)))]
    queues = [
        queue(
            name,
            draw(st.sampled_from([0.0, 4.0, 10.0, 30.0])),
            priority=draw(st.integers(0, 2)),
            limit_cu=draw(st.sampled_from([None, None, 40.0])),
        )
        for name in names
    ]
    cycles = 4
    shares = [
        {name: draw(st.sampled_from([0.0, 2.0, 8.0, 20.0, 60.0])) for name in names}
        for _ in range(cycles)
    ]
    standing = []
    for _ in range(cycles):
        weights = [draw(st.sampled_from([0.0, 1.0, 1.0, 3.0])) for _ in names]
        usages = [draw(st.sampled_from([0.0, 0.1, 0.4, 0.7])) for _ in names]
        total_w, total_u = sum(weights) or 1.0, max(1.0, sum(usages))
        standing.append(
            {
                name: UsageStanding(w / total_w, u / total_u)
                for name, w, u in zip(names, weights, usages, strict=True)
            }
        )
    arrivals = []
    for cycle in range(cycles):
        count = draw(st.integers(0, 8))
        arrivals.append(
            [draw(_workload(f"w{cycle}-{i}", names, cycle * 1_000.0 + i)) for i in range(count)]
        )
    return World(
        nodes,
        queues,
        shares,
        arrivals,
        draw(st.sampled_from(list(PlacementStrategy))),
        draw(st.sampled_from([None, 500.0])),
        standing,
    )


def _simulate(world: World) -> None:
    running: dict[str, Allocation] = {}
    pending: dict[str, Workload] = {}
    in_flight: list[EvictionInFlight] = []
    for cycle, arrivals in enumerate(world.arrivals):
        now_s = (cycle + 1) * 1_000.0
        for stopped in in_flight:
            running.pop(stopped.victim_uid, None)
        pending.update((w.uid, w) for w in arrivals)
        snap = snapshot(
            world.nodes,
            world.queues,
            world.shares[cycle],
            running_work=running.values(),
            pending=pending.values(),
            now_s=now_s,
            evicting=in_flight,
            placement=world.placement,
            gang_reservation_after_s=world.gang_reservation_after_s,
            standing=world.standing[cycle],
        )
        result = run_cycle(snap)
        _check(snap, result)
        for bind in result.binds:
            job = pending.pop(bind.workload_uid)
            running[job.uid] = Allocation(job, bind.bindings, now_s, bind.gpu_type)
        in_flight = [EvictionInFlight(e.workload_uid, e.beneficiary_uid) for e in result.evicts]


def bound_before_reservations(snap: CycleSnapshot) -> set[str]:
    """The workloads the cycle binds before phase 4 chooses its `GANG_WAIT` nodes (claims,
    work within share, admitted entitled gangs): the reservation may pick nodes they were just
    bound to; only beyond-share work placed after it must keep off them."""
    state = CycleState(snap)
    phases.load(state)
    phases.honour_moves(state)
    phases.honour_claims(state)
    phases.allocate(state, within_share=True)
    phases.allocate_mixed(state, within_share=True)
    phases.reclaim(state)
    phases.reclaim_for_guarantees(state)
    phases.preempt(state)
    phases.defragment(state)
    phases.admit_entitled_gangs(state)
    return {b.workload_uid for b in state.result().binds}


def preempted_in_all(result: CycleResult) -> set[str]:
    return {e.queue for e in result.evicts if e.reason is EvictReason.PREEMPT}


def _check(snap: CycleSnapshot, result: CycleResult) -> None:
    assert_no_oversubscription(snap, result)
    running = {a.workload.uid: a for a in snap.running}
    already_leaving = {e.victim_uid for e in snap.evicting}
    pending = {w.uid: w for w in snap.pending}
    quotas = {q.name: q.quota(POOL) for q in snap.queues}
    nodes = {n.name: n for n in snap.nodes}

    # Every pending workload is bound or has a reason, never both.
    bound = {b.workload_uid for b in result.binds}
    assert not bound & set(result.pending)
    assert bound | set(result.pending) == set(pending)

    # Evictions: only preemptible work past its minimum runtime, each at most once.
    reclaimed_from = set()
    for evict in result.evicts:
        victim = running[evict.workload_uid].workload
        assert victim.preemptible
        assert snap.now_s - running[victim.uid].started_at_s >= victim.min_runtime_s
        assert victim.uid not in already_leaving
        if evict.reason is EvictReason.RECLAIM:
            reclaimed_from.add(evict.queue)
            assert evict.queue != pending[evict.beneficiary_uid].queue
    assert len({e.workload_uid for e in result.evicts}) == len(result.evicts)

    # Gang entitlement: at most one beneficiary per tier, preemptible; its victims from other
    # queues of its tier or lower, none larger than it, no queue left below its deserved quota.
    tiers = {name: quota.priority for name, quota in quotas.items()}
    entitled = [e for e in result.evicts if e.reason is EvictReason.ENTITLEMENT]
    beneficiaries = {e.beneficiary_uid for e in entitled}
    by_tier = [tiers[pending[uid].queue] for uid in beneficiaries if uid is not None]
    assert len(by_tier) == len(set(by_tier))
    for evict in entitled:
        assert evict.beneficiary_uid is not None
        gang = pending[evict.beneficiary_uid]
        assert gang.preemptible and evict.queue != gang.queue
        assert tiers[evict.queue] <= tiers[gang.queue]
        weight = TYPES_BY_NAME[running[evict.workload_uid].gpu_type].compute_weight
        assert evict.cu <= gang.gang_min_pods * gang.gpus_per_pod * weight + EPS
    for name, summary in result.queues.items():
        if any(e.queue == name for e in entitled) and name not in preempted_in_all(result):
            assert summary.allocated_cu_after + summary.reserved_cu >= summary.deserved_cu - EPS

    # Deserved and fair share honoured: a queue at or below max(deserved, fair share) loses
    # nothing to reclaim, and a victim never ends below it.
    preempted_in = {e.queue for e in result.evicts if e.reason is EvictReason.PREEMPT}
    for name, summary in result.queues.items():
        floor = max(summary.deserved_cu, summary.fair_share_cu)
        before = summary.allocated_cu_before - summary.evicting_cu
        if before <= floor + EPS:
            assert name not in reclaimed_from
        if name in reclaimed_from and name not in preempted_in:
            assert summary.allocated_cu_after + summary.reserved_cu >= floor - EPS
        limit = quotas[name].limit_cu
        if limit is not None and before <= limit + EPS:
            assert summary.allocated_cu_after + summary.reserved_cu <= limit + EPS

    assert_holds_fit(snap, result)
    gang_held = {
        n for r in result.reservations if r.kind is ReservationKind.GANG_WAIT for n in r.nodes
    }
    early = bound_before_reservations(snap) if gang_held else set()
    for bind in result.binds:
        job = pending[bind.workload_uid]
        # Gang all-or-nothing, one GPU type, filters respected.
        assert job.gang_min_pods <= len(bind.bindings) <= job.pods
        assert not job.allowed_gpu_types or bind.gpu_type in job.allowed_gpu_types
        gpu_type = TYPES_BY_NAME[bind.gpu_type]
        if job.gpus_per_pod > 0:
            memory = gpu_memory_per_pod_gib(gpu_type, job.gpus_per_pod)
            assert memory >= job.min_gpu_memory_gib - EPS
        assert {nodes[b.node].gpu_type for b in bind.bindings} == {bind.gpu_type}
        assert all(nodes[b.node].ready for b in bind.bindings)
        for binding in bind.bindings:
            if job.gpus_per_pod >= 1:
                assert len(set(binding.gpu_indices)) == round(job.gpus_per_pod)
            else:
                assert binding.gpu_fraction == job.gpus_per_pod
            if bind.over_fair_share and bind.workload_uid not in early:
                # Beyond-share work placed after the reservations keeps off their nodes.
                assert binding.node not in gang_held
        if job.topology is not None and job.topology.required:
            assert len({nodes[b.node].labels["rack"] for b in bind.bindings}) == 1
        if not job.preemptible:
            assert not bind.over_fair_share


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(worlds())
def test_cycle_invariants_hold_over_random_worlds(world: World) -> None:
    _simulate(world)


@settings(max_examples=40, deadline=None)
@given(worlds())
def test_scarce_capacity_with_skewed_shares(world: World) -> None:
    """The same invariants when one queue's share dwarfs the rest: reclaim runs often."""
    first = world.queues[0].name
    skewed = [{**shares, first: 200.0} for shares in world.shares]
    crowded = [[replace(w, min_runtime_s=0.0) for w in arrivals] * 2 for arrivals in world.arrivals]
    # Duplicated uids must be made distinct so each arrival is its own workload.
    renamed = [
        [replace(w, uid=f"{w.uid}-{i}") for i, w in enumerate(arrivals)] for arrivals in crowded
    ]
    _simulate(replace(world, shares=skewed, arrivals=renamed))


def test_an_entitled_gang_bound_before_the_reservations_may_share_a_gang_wait_node() -> None:
    """Found by the random worlds: q3's one-pod gang is admitted by entitlement (phase 3b) on
    free room of n2 before phase 4 holds n2 for q0's long waiter, whose pods need memory only
    n2's running gang can free. Both decisions stand; the invariant applies to beyond-share
    work placed after the reservations."""
    nodes = [node(f"n{i}", A100, gpus=1, cpu_millicores=8_000, memory_mib=16_000) for i in range(3)]
    small = [workload(f"s{i}", "q0", gpus=0.25) for i in range(8)]
    gang = workload("g", "q0", pods=2, gpus=0.25, memory_mib=8_000)
    holding = [
        running(job, [(f"n{i // 4}", (0,), 0.25)], A100, 1_000.0) for i, job in enumerate(small)
    ]
    holding.append(running(gang, [("n2", (0,), 0.25), ("n2", (0,), 0.25)], A100, 1_000.0))
    waiter = workload("waiter", "q0", pods=2, gpus=0.25, submit_time_s=5.0, memory_mib=8_000)
    entitled = workload("entitled", "q3", gpus=0.25, submit_time_s=4.0)
    snap = snapshot(
        nodes,
        [queue(name) for name in ("q0", "q3")],
        {"q0": 200.0, "q3": 2.0},
        running_work=holding,
        pending=[entitled, waiter],
        now_s=2_000.0,
        gang_reservation_after_s=500.0,
        standing={"q0": UsageStanding(0.0, 0.0), "q3": UsageStanding(1.0, 0.0)},
    )
    result = run_cycle(snap)
    assert [
        (b.workload_uid, b.over_fair_share, [p.node for p in b.bindings]) for b in result.binds
    ] == [("entitled", True, ["n2"])]
    assert [(r.kind, r.workload_uid, r.nodes) for r in result.reservations] == [
        (ReservationKind.GANG_WAIT, "waiter", ("n2",))
    ]
    assert bound_before_reservations(snap) == {"entitled"}
    _check(snap, result)


def _busy_world(seed: int) -> World:
    """A pool big enough for the search paths only large pools take (more than 64 nodes of a
    type hold victims), filled in the first cycle and then re-divided between the queues."""
    rng = random.Random(seed)
    types = [A100, RTX4090]
    nodes = [node(f"n{i}", types[i % 2], gpus=8, rack=f"r{i // 4}") for i in range(160)]
    names = [f"q{i}" for i in range(6)]
    queues = [queue(name, 40.0 * (i % 3), priority=i % 2) for i, name in enumerate(names)]
    everything = {name: 2_000.0 for name in names}
    shifted = {name: (4_000.0 if i == 0 else 5.0) for i, name in enumerate(names)}
    arrivals: list[list[Workload]] = []
    for cycle in range(3):
        arrivals.append(
            [
                workload(
                    f"w{cycle}-{i}",
                    rng.choice(names),
                    pods=rng.choice([1, 1, 1, 2, 4]),
                    gpus=rng.choice([0.25, 0.5, 1.0, 1.0, 2.0, 4.0, 8.0]),
                    submit_time_s=cycle * 1_000.0 + i,
                    topology=rng.choice([None, None, TopologyConstraint("rack", True)]),
                    priority_class=rng.randint(0, 2),
                    preemptible=rng.random() > 0.1,
                    cpu_millicores=rng.choice([0, 4_000]),
                )
                for i in range(600 if cycle == 0 else 200)
            ]
        )
    # q1 (tier 1) and q2 (tier 0) have used least: gang entitlement may act for them.
    standing = {
        name: UsageStanding(1 / 6, 0.02 if i in (1, 2) else 0.24) for i, name in enumerate(names)
    }
    return World(
        nodes,
        queues,
        [everything, shifted, shifted],
        arrivals,
        PlacementStrategy.BINPACK,
        500.0,
        [standing] * 3,
    )


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_cycle_invariants_hold_on_a_busy_pool(seed: int) -> None:
    _simulate(_busy_world(seed))
