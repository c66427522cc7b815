"""Benchmark of one full scheduling cycle (allocate → reclaim → preempt) on synthetic pools.

Run from the repository root, e.g.:

    PYTHONPATH=service python bench/bench_cycle.py                  # 100 / 1,000 / 4,000 nodes
    PYTHONPATH=service python bench/bench_cycle.py --sizes 1000 --profile
    PYTHONPATH=service python bench/bench_cycle.py --json ...   # one JSON line per mix and size

`bench/compare_cycle.py` runs this for several checkouts side by side (results/cycle.md), and
`bench/cycle_equivalence.py` checks that two checkouts decide the same on these pools.

Per 1,000 nodes: 8 GPUs a node of three types (A100 10 CU, V100 4 CU, RTX 4090 2 CU), racks of
8 nodes, 5,000 running and 20,000 pending workloads; 200 leaf queues in three priority tiers at
every size. Running work is placed by the domain's own placement before timing starts, so the
snapshot is valid (about 90 % of GPUs busy). Fair shares are drawn so that some queues sit far
below their share (they reclaim) and others far above (they are reclaimed from). Only
`run_cycle(snapshot)` is timed, in wall-clock and CPU seconds (the machine is shared: CPU time is
the steadier of the two).
"""

from __future__ import annotations

import argparse
import copy
import cProfile
import gc
import importlib.util
import json
import pstats
import random
import statistics
import time
from dataclasses import replace
from typing import Any

from gpufair.domain.capacity import Capacity
from gpufair.domain.cycle import run_cycle
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
from gpufair.domain.placement import place
from gpufair.domain.placement_ask import Ask, Exclusion, PodShape, adequate_types
from gpufair.domain.snapshot import CycleResult, CycleSnapshot, EvictionInFlight

POOL = "bench"
GPU_TYPES = (
    GpuType("a100-80gb", memory_gib=80, compute_weight=10),
    GpuType("v100-16gb", memory_gib=16, compute_weight=4),
    GpuType("rtx4090-24gb", memory_gib=24, compute_weight=2),
)
QUEUES = 200
RUNNING_PER_NODE = 5
PENDING_PER_NODE = 20
NOW_S = 1_000_000.0

# (pods, gpus per pod, weight). Running work: mostly single GPUs, some shared, few gangs.
RUNNING_SHAPES = [
    (1, 1.0, 60),
    (1, 0.5, 12),
    (1, 0.25, 5),
    (1, 2.0, 14),
    (1, 4.0, 4),
    (1, 8.0, 2),
    (2, 4.0, 1),
    (2, 1.0, 2),
]
# Pending work: the same kinds, with more multi-GPU gangs.
SHAPES = [
    (1, 1.0, 40),
    (1, 2.0, 14),
    (1, 0.5, 8),
    (1, 0.25, 4),
    (1, 4.0, 8),
    (1, 8.0, 4),
    (2, 4.0, 4),
    (4, 8.0, 2),
    (2, 1.0, 8),
    (4, 2.0, 4),
    (8, 8.0, 1),
]


def _nodes(count: int) -> list[Node]:
    return [
        Node(
            name=f"node-{i:05d}",
            pool=POOL,
            gpu_type=GPU_TYPES[i % 3].name,
            gpu_count=8,
            cpu_millicores=128_000,
            memory_mib=1_024_000,
            labels={"rack": f"rack-{i // 8:04d}"},
        )
        for i in range(count)
    ]


def _queues(
    capacity_cu: float, rng: random.Random, count: int = QUEUES
) -> tuple[list[Queue], dict[str, float]]:
    """`count` queues; fair shares add up to the pool's CU, deserved quotas to half of it."""
    weights = [rng.random() + 0.1 for _ in range(count)]
    total = sum(weights)
    queues = []
    shares = {}
    for i, weight in enumerate(weights):
        name = f"team-{i:03d}"
        deserved = 0.5 * capacity_cu * weight / total
        tier = 2 if i % 10 == 0 else 1 if i % 10 < 4 else 0
        quota = QueueQuota(pool=POOL, deserved_cu=deserved, priority=tier)
        queues.append(Queue(name, quotas={POOL: quota}))
        shares[name] = capacity_cu * weight / total
    return queues, shares


def _workload(
    uid: str,
    queue: str,
    rng: random.Random,
    submit_time_s: float,
    shapes: list[tuple[int, float, int]],
) -> Workload:
    pods, gpus, _ = rng.choices(shapes, weights=[s[2] for s in shapes])[0]
    types: tuple[str, ...] = ()
    roll = rng.random()
    if roll < 0.15:
        types = (GPU_TYPES[0].name,)
    elif roll < 0.25:
        types = (GPU_TYPES[1].name, GPU_TYPES[2].name)
    return Workload(
        uid=uid,
        queue=queue,
        pool=POOL,
        pods=pods,
        gpus_per_pod=gpus,
        submit_time_s=submit_time_s,
        allowed_gpu_types=types,
        min_gpu_memory_gib=rng.choice([0.0, 0.0, 0.0, 20.0, 40.0]),
        cpu_millicores_per_pod=int(max(gpus, 0.5) * 8_000),
        memory_mib_per_pod=int(max(gpus, 0.5) * 64_000),
        topology=TopologyConstraint("rack", required=True) if pods >= 4 else None,
        priority_class=rng.choice([0, 0, 0, 1, 2]),
        preemptible=rng.random() > 0.05,
        min_runtime_s=rng.choice([0.0, 600.0, 3_600.0]),
    )


def build_snapshot(
    node_count: int, scrambled: bool = False, seed: int = 7, queues: int = QUEUES
) -> CycleSnapshot:
    """`queues` leaf queues (200, the benchmark's, at every size unless given).
    `scrambled=False`: running work drawn per queue in proportion to its fair share times a
    drift (0.7–1.3), a busy pool where some queues have drifted over or under their share.
    `scrambled=True`: running work drawn without regard to shares, so about half the queues
    are far under their share and reclaim runs for hundreds of workloads in one cycle. The
    `next` mix of `main` is the cycle after a steady one (`next_snapshot`)."""
    rng = random.Random(seed)
    nodes = _nodes(node_count)
    by_name = {gpu_type.name: gpu_type for gpu_type in GPU_TYPES}
    capacity_cu = sum(n.gpu_count * by_name[n.gpu_type].compute_weight for n in nodes)
    made, shares = _queues(capacity_cu, rng, queues)
    names = [q.name for q in made]
    drift = [shares[name] * rng.uniform(0.7, 1.3) for name in names]
    capacity = Capacity(nodes)
    running: list[Allocation] = []
    attempts = 0
    while len(running) < RUNNING_PER_NODE * node_count and attempts < 20 * node_count:
        attempts += 1
        started_s = NOW_S - rng.uniform(0, 7_200)
        owner = rng.choice(names) if scrambled else rng.choices(names, weights=drift)[0]
        job = _workload(f"run-{attempts}", owner, rng, started_s, RUNNING_SHAPES)
        types = list(adequate_types(job, by_name, tuple(capacity.by_type)))
        rng.shuffle(types)  # spread running work over all types
        for gpu_type in types:
            ask = Ask(PodShape.of(job), gpu_type, job.pods, job.pods, job.topology)
            plan = place(capacity, ask, PlacementStrategy.BINPACK, Exclusion())
            if plan is not None:
                capacity.take(plan)
                bindings = tuple(
                    PodBinding(i, capacity.nodes[u.node].name, u.gpu_indices, u.gpu_amount)
                    for i, u in enumerate(plan)
                )
                running.append(Allocation(job, bindings, job.submit_time_s, gpu_type))
                break
    pending = [
        _workload(f"pend-{i}", rng.choice(names), rng, NOW_S - rng.uniform(0, 86_400), SHAPES)
        for i in range(PENDING_PER_NODE * node_count)
    ]
    return CycleSnapshot(
        pool=NodePool(POOL),
        nodes=tuple(nodes),
        gpu_types=GPU_TYPES,
        queues=tuple(made),
        fair_share_cu=shares,
        running=tuple(running),
        pending=tuple(pending),
        now_s=NOW_S,
    )


def next_snapshot(snapshot: CycleSnapshot, result: CycleResult) -> CycleSnapshot:
    """The snapshot a minute later, as the batch system would report it: binds started,
    evicted workloads still stopping (evictions in flight), nothing finished."""
    pending = {w.uid: w for w in snapshot.pending}
    started = [
        Allocation(pending.pop(bind.workload_uid), bind.bindings, snapshot.now_s, bind.gpu_type)
        for bind in result.binds
    ]
    return replace(
        snapshot,
        running=snapshot.running + tuple(started),
        pending=tuple(pending.values()),
        now_s=snapshot.now_s + 60.0,
        evicting=tuple(
            EvictionInFlight(evict.workload_uid, evict.beneficiary_uid) for evict in result.evicts
        ),
    )


def _carried() -> Any:
    """An empty `CarriedLoad`, or None for a checkout without one (older code)."""
    if importlib.util.find_spec("gpufair.domain.cycle_memory") is None:
        return None
    from gpufair.domain.cycle_memory import CarriedLoad

    return CarriedLoad()


def _describe(snapshot: CycleSnapshot, result: CycleResult) -> str:
    gpus = sum(n.gpu_count for n in snapshot.nodes)
    busy = sum(
        (b.gpu_fraction if b.gpu_fraction < 1 else len(b.gpu_indices))
        for a in snapshot.running
        for b in a.bindings
    )
    pods = sum(len(a.bindings) for a in snapshot.running) + sum(w.pods for w in snapshot.pending)
    return (
        f"{len(snapshot.nodes)} nodes, {gpus} GPUs ({busy / gpus:.0%} busy), "
        f"{len(snapshot.queues)} queues, {len(snapshot.running)} running, "
        f"{len(snapshot.pending)} pending, {pods} pods; decisions: {len(result.binds)} binds, "
        f"{len(result.evicts)} evicts, {len(result.reservations)} reservations"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="100,1000,4000", help="node counts, comma-separated")
    parser.add_argument(
        "--mix", default="steady,next,scrambled", help="steady, next and/or scrambled"
    )
    parser.add_argument("--repeats", type=int, default=0, help="runs per size (0: by size)")
    parser.add_argument("--profile", action="store_true", help="cProfile one run per size")
    parser.add_argument(
        "--gc",
        choices=("default", "serve", "cycle"),
        default="default",
        help="the garbage collector as Python starts it, or as `gpufair serve` sets it "
        "(gc_tuning: what exists frozen, young threshold 50,000), after the pool is built, "
        "or as the service runs a cycle (`gc_tuning.collector_paused`: off for the cycle, "
        "then one young pass, timed with the cycle)",
    )
    parser.add_argument(
        "--carry",
        action="store_true",
        help="give each timed cycle the records the cycle before it loaded, as the service "
        "does (cycle_memory; the next mix: those of the steady cycle that made its snapshot; "
        "the others: the warm-up cycle's), where the checkout has them",
    )
    parser.add_argument(
        "--json", action="store_true", help="one JSON line per mix and size (compare_cycle.py)"
    )
    args = parser.parse_args()
    if not args.json:
        print("| running work | nodes | runs | median s | p90 s | min s | median CPU s |")
        print("|---|---:|---:|---:|---:|---:|---:|")
    notes = []
    for mix in args.mix.split(","):
        for size in (int(s) for s in args.sizes.split(",")):
            snapshot = build_snapshot(size, scrambled=mix == "scrambled")
            carried = _carried() if args.carry else None
            if mix == "next":
                first = run_cycle(snapshot) if carried is None else run_cycle(snapshot, carried)
                snapshot = next_snapshot(snapshot, first)
            repeats = args.repeats or (15 if size <= 100 else 9 if size <= 1000 else 5)
            if args.gc == "serve":
                # gpufair serve's settings, written out here so that the code of an older
                # checkout (without gc_tuning) is measured the same way.
                gc.collect()
                gc.freeze()
                gc.set_threshold(50_000, *gc.get_threshold()[1:])
            if carried is not None and mix != "next":
                result = run_cycle(snapshot, carried)  # warm-up, and the records carried
            else:  # warm-up: imports, first-touch allocations
                result = run_cycle(snapshot)
            times = []
            cpu_times = []
            for _ in range(repeats):
                # Every timed cycle from the same carried state (a shallow copy is it as it
                # is now, `cycle_memory`).
                given = copy.copy(carried)
                started = time.perf_counter()
                cpu_started = time.process_time()
                if args.gc == "cycle":
                    # `collector_paused`, written out so that an older checkout (without it)
                    # is measured the same way.
                    gc.disable()
                    result = run_cycle(snapshot) if given is None else run_cycle(snapshot, given)
                    gc.enable()
                    gc.collect(0)
                else:
                    result = run_cycle(snapshot) if given is None else run_cycle(snapshot, given)
                cpu_times.append(time.process_time() - cpu_started)
                times.append(time.perf_counter() - started)
            if args.json:
                decisions = (len(result.binds), len(result.evicts), len(result.reservations))
                line = {"mix": mix, "nodes": size, "wall_s": times, "cpu_s": cpu_times}
                line["carried"] = carried is not None
                print(json.dumps(line | {"decisions": decisions}), flush=True)
                continue
            times.sort()
            p90 = times[min(len(times) - 1, round(0.9 * (len(times) - 1)))]
            print(
                f"| {mix} | {size:,} | {repeats} | {statistics.median(times):.3f} | "
                f"{p90:.3f} | {times[0]:.3f} | {statistics.median(cpu_times):.3f} |",
                flush=True,
            )
            notes.append(f"- {mix}, {size:,} nodes: {_describe(snapshot, result)}")
            if args.profile:
                profiler = cProfile.Profile()
                profiler.runcall(run_cycle, snapshot)
                pstats.Stats(profiler).sort_stats("cumulative").print_stats(25)
    if not args.json:
        print()
        print("\n".join(notes))


if __name__ == "__main__":
    main()
