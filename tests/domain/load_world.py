"""Large random pools run for several cycles, for the rule checks under load
(`test_cycle_rules_under_load`).

A world: 200-500 nodes of two or three GPU types (A100s with MIG-style partitions, V100s,
RTX 4090s) in NVLink domains and racks, a three-level queue tree (organisations, departments,
20-60 teams) with deserved quotas, per-type guarantees, limits at every level and priority tiers,
and arrivals of every shape: single GPUs, plain shares, partitions, gangs with and without
topology, non-preemptible work, `min_runtime_s`. Fair shares are computed each cycle by the
fair-share engine from the queues' demand (held + waiting), as the service does. Between cycles
binds start, evicted work stops one cycle later and is requeued, and some running work ends. The
last cycles are quiet (no arrivals, nothing ends): demand, and so the shares, stay put.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass, field

from gpufair.domain.cycle import run_cycle
from gpufair.domain.demand import queue_demands
from gpufair.domain.fairshare import FairShareInput, compute_fair_shares
from gpufair.domain.model import (
    Allocation,
    FairSharePolicy,
    GpuType,
    Node,
    NodePool,
    PlacementStrategy,
    Queue,
    QueueQuota,
    TopologyConstraint,
    Workload,
)
from gpufair.domain.partition_geometry import MIG_80GB_PROFILES
from gpufair.domain.partitions import with_profile_share
from gpufair.domain.placement_ask import adequate_types
from gpufair.domain.snapshot import CycleResult, CycleSnapshot, EvictionInFlight

POOL = "main"
A100 = GpuType("a100-80gb", 80, 10, MIG_80GB_PROFILES)
V100 = GpuType("v100-16gb", 16, 4)
RTX4090 = GpuType("rtx4090-24gb", 24, 2)
TYPES = {t.name: t for t in (A100, V100, RTX4090)}
PROFILES = ("1g.10gb", "3g.40gb", "4g.40gb")
LEVELS = ("nvlink-domain", "rack")


@dataclass
class World:
    rng: random.Random
    nodes: list[Node]
    leaves: list[Queue]
    inner: list[Queue]
    pool: NodePool
    cycles: int
    quiet: int  # the last `quiet` cycles have no arrivals and no endings
    live: dict[str, Allocation] = field(default_factory=dict)
    waiting: dict[str, Workload] = field(default_factory=dict)
    in_flight: list[EvictionInFlight] = field(default_factory=list)
    serial: int = 0


def make_world(seed: int, nodes: int, leaves: int, cycles: int = 6, quiet: int = 3) -> World:
    rng = random.Random(seed)
    types = rng.choice([[A100, RTX4090], [A100, V100, RTX4090], [V100, A100]])
    node_list = []
    for i in range(nodes):
        gpu_type = types[i * len(types) // nodes]  # runs of one type: domains of one type
        node_list.append(
            Node(
                f"n{i}",
                POOL,
                gpu_type.name,
                rng.choice([4, 8, 8]),
                rng.choice([32_000, 96_000]),
                rng.choice([128_000, 512_000]),
                {"nvlink-domain": f"d{i // 2}", "rack": f"r{i // 8}"},
                rng.random() > 0.03,
            )
        )
    inner, team_list = _tree(rng, leaves, [t.name for t in types])
    pool = NodePool(
        POOL,
        policy=FairSharePolicy(),
        placement=rng.choice(list(PlacementStrategy)),
        gang_reservation_after_s=rng.choice([None, 600.0]),
        max_borrow_s=rng.choice([None, None, 900.0]),
        topology_levels=rng.choice([(), LEVELS]),
        gang_entitlement=rng.random() < 0.3,
    )
    return World(rng, node_list, team_list, inner, pool, cycles, quiet)


def _quota(rng: random.Random, deserved: float, limit: float | None, **extra: object) -> dict:
    return {
        POOL: QueueQuota(
            POOL,
            deserved_cu=deserved,
            over_quota_weight=rng.choice([0.0, 1.0, 1.0, 2.0, 3.0]),
            limit_cu=limit,
            **extra,  # type: ignore[arg-type]
        )
    }


def _tree(rng: random.Random, leaves: int, types: list[str]) -> tuple[list[Queue], list[Queue]]:
    inner: list[Queue] = []
    orgs = rng.randint(2, 3)
    for o in range(orgs):
        limit = rng.choice([None, None, 4_000.0])
        inner.append(Queue(f"org{o}", None, _quota(rng, 0.0, limit)))
    depts = []
    for d in range(rng.randint(4, 8)):
        name = f"dept{d}"
        limit = rng.choice([None, None, 1_200.0])
        by_type = rng.choice([{}, {}, {types[0]: 120}])
        inner.append(
            Queue(name, f"org{d % orgs}", _quota(rng, 0.0, limit, limit_gpus_by_type=by_type))
        )
        depts.append(name)
    teams = []
    for t in range(leaves):
        extra = {
            "priority": rng.choice([0, 0, 1, 2]),
            "deserved_gpus_by_type": rng.choice([{}, {}, {}, {types[-1]: 4}]),
            "limit_gpus_by_type": rng.choice([{}, {}, {}, {types[0]: 48}]),
        }
        deserved = rng.choice([0.0, 0.0, 10.0, 40.0, 80.0])
        limit = rng.choice([None, None, None, 600.0])
        teams.append(Queue(f"t{t}", rng.choice(depts), _quota(rng, deserved, limit, **extra)))
    return inner, teams


def _arrival(world: World, now_s: float) -> Workload:
    rng = world.rng
    world.serial += 1
    uid = f"w{world.serial}"
    team = rng.choice(world.leaves).name
    shape = rng.random()
    profile = ""
    topology = None
    min_pods = None
    if shape < 0.45:  # one GPU or a few on one pod
        pods, gpus = 1, rng.choice([1.0, 1.0, 2.0, 4.0])
    elif shape < 0.6:  # plain shares
        pods, gpus = rng.choice([1, 1, 2]), rng.choice([0.25, 0.5])
    elif shape < 0.7:  # partitions
        pods, gpus, profile = rng.choice([1, 1, 2]), 0.0, rng.choice(PROFILES)
    else:  # gangs
        pods, gpus = rng.choice([2, 4, 8, 16]), rng.choice([1.0, 2.0, 4.0, 8.0])
        topology = rng.choice(
            [None, None, TopologyConstraint("rack", True), TopologyConstraint("nvlink-domain")]
        )
        min_pods = rng.choice([None, None, None, max(1, pods // 2)])
    job = Workload(
        uid,
        team,
        POOL,
        pods,
        gpus,
        now_s - rng.uniform(0.0, 300.0),
        min_pods=min_pods,
        allowed_gpu_types=rng.choice([(), (), (), (A100.name,), (V100.name, RTX4090.name)]),
        min_gpu_memory_gib=rng.choice([0.0, 0.0, 20.0]),
        cpu_millicores_per_pod=rng.choice([0, 1_000, 8_000]),
        memory_mib_per_pod=rng.choice([0, 16_000, 64_000]),
        topology=topology,
        priority_class=rng.randint(0, 2),
        preemptible=rng.random() > 0.15,
        min_runtime_s=rng.choice([0.0, 0.0, 600.0, 3_000.0]),
        partition_profile=profile,
    )
    resolved, problem = with_profile_share(job, TYPES)
    return job if problem else resolved


def fair_shares(world: World) -> tuple[dict[str, float], dict]:
    """The leaves' fair shares (and W', U') from their demand now, no history."""
    ready = [n for n in world.nodes if n.ready]
    capacity: dict[str, float] = {}
    for n in ready:
        capacity[n.gpu_type] = capacity.get(n.gpu_type, 0.0) + n.gpu_count

    def serving(job: Workload) -> str | None:
        found = adequate_types(job, TYPES, capacity)
        return found[0] if found else None

    held = [
        (a.workload.queue, a.gpu_type, a.workload.gpus_per_pod * len(a.bindings))
        for a in world.live.values()
    ]
    names = [q.name for q in world.leaves]
    weights = {name: t.compute_weight for name, t in TYPES.items()}
    demands = queue_demands(names, held, world.waiting.values(), serving, weights)
    result = compute_fair_shares(
        FairShareInput(
            POOL, world.pool.policy, TYPES, capacity, world.inner + world.leaves, demands
        )
    )
    shares = result.fair_share_cu
    standing = result.standing
    return {n: shares[n] for n in names}, {n: standing[n] for n in names}


def cycles(world: World) -> Iterator[tuple[int, CycleSnapshot, CycleResult]]:
    """Runs the world's cycles; yields each cycle's snapshot and result before applying it."""
    rng = world.rng
    for cycle in range(world.cycles):
        now_s = 10_000.0 + 300.0 * cycle
        busy = cycle < world.cycles - world.quiet
        if busy:
            for _ in range(rng.randint(700, 1_200) if cycle == 0 else rng.randint(150, 400)):
                job = _arrival(world, now_s)
                world.waiting[job.uid] = job
        shares, standing = fair_shares(world)
        snap = CycleSnapshot(
            pool=world.pool,
            nodes=tuple(world.nodes),
            gpu_types=tuple(TYPES.values()),
            queues=tuple(world.leaves),
            fair_share_cu=shares,
            running=tuple(world.live.values()),
            pending=tuple(world.waiting.values()),
            now_s=now_s,
            evicting=tuple(world.in_flight),
            inner_queues=tuple(world.inner),
            standing=standing,
        )
        result = run_cycle(snap)
        yield cycle, snap, result
        _apply(world, result, now_s, ends=busy)


def _apply(world: World, result: CycleResult, now_s: float, ends: bool) -> None:
    for stopped in world.in_flight:
        victim = world.live.pop(stopped.victim_uid, None)
        if victim is not None:
            world.waiting[victim.workload.uid] = victim.workload  # requeued
    leaving = {e.workload_uid for e in result.evicts}
    leaving |= {e.victim_uid for e in world.in_flight}
    if ends:
        for uid in [u for u in world.live if u not in leaving and world.rng.random() < 0.12]:
            del world.live[uid]
    for bind in result.binds:
        job = world.waiting.pop(bind.workload_uid)
        world.live[job.uid] = Allocation(job, bind.bindings, now_s, bind.gpu_type)
    world.in_flight = [
        EvictionInFlight(e.workload_uid, e.beneficiary_uid, e.move_to, e.move_gpu_type)
        for e in result.evicts
    ]
