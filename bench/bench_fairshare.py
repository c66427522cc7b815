"""Benchmark: one full fair-share division for growing queue trees.

Run from the repository root:

    PYTHONPATH=service python bench/bench_fairshare.py

Each case is a pool with three GPU types and `leaves` leaf queues under `leaves // 20`
departments (1,000 leaves → 50 departments), with the features a real recompute exercises:
history for every queue, previous effective weights for the dead band, three priority tiers,
CU and per-type limits, per-type guarantees, and demands spread over the types. The timed call
is `compute_fair_shares` alone, validation included; building the input is not timed.
"""

from __future__ import annotations

import argparse
import platform
import random
import statistics
import time

from gpufair.domain.fairshare import FairShareInput, QueueDemand, compute_fair_shares
from gpufair.domain.model import FairSharePolicy, GpuType, Queue, QueueQuota, Rounding
from gpufair.domain.usage import UsageInputs

POOL = "bench"
GPU_TYPES = {
    t.name: t
    for t in (
        GpuType("a100-80gb", memory_gib=80.0, compute_weight=10.0),
        GpuType("v100-16gb", memory_gib=16.0, compute_weight=4.0),
        GpuType("rtx4090-24gb", memory_gib=24.0, compute_weight=2.0),
    )
}
LEAVES_PER_DEPARTMENT = 20
TARGET_MS = 20.0
TARGET_LEAVES = 1000


def build_input(leaves: int, *, rounding: Rounding, seed: int = 7) -> FairShareInput:
    rng = random.Random(seed)
    capacity = {"a100-80gb": 0.4 * leaves, "v100-16gb": 0.6 * leaves, "rtx4090-24gb": 1.0 * leaves}
    capacity_cu = sum(g * GPU_TYPES[t].compute_weight for t, g in capacity.items())
    departments = max(1, leaves // LEAVES_PER_DEPARTMENT)
    queues: list[Queue] = []
    demands: dict[str, QueueDemand] = {}
    usage: dict[str, float] = {}
    group_capacity: dict[str | None, float] = {None: capacity_cu * 3600.0}
    # Guarantees cover 60 % of the pool; the rest is shared over quota.
    department_deserved_cu = 0.6 * capacity_cu / departments
    for d in range(departments):
        department = f"dept-{d:04d}"
        queues.append(
            Queue(
                name=department,
                quotas={
                    POOL: QueueQuota(
                        pool=POOL,
                        deserved_cu=department_deserved_cu,
                        over_quota_weight=rng.choice([1.0, 1.0, 2.0, 3.0]),
                        priority=rng.choice([0, 1, 1, 2]),
                        limit_cu=rng.choice([None, None, None, department_deserved_cu * 3]),
                    )
                },
                created_at_s=float(d),
            )
        )
        usage[department] = rng.uniform(0.0, department_deserved_cu) * 3600.0
        group_capacity[department] = department_deserved_cu * 3600.0
        team_count = leaves // departments + (1 if d < leaves % departments else 0)
        for t in range(team_count):
            team = f"{department}-team-{t:03d}"
            per_type = {"a100-80gb": 0.2} if rng.random() < 0.1 else {}
            team_deserved_cu = 0.9 * department_deserved_cu / team_count
            queues.append(
                Queue(
                    name=team,
                    parent=department,
                    quotas={
                        POOL: QueueQuota(
                            pool=POOL,
                            deserved_cu=max(team_deserved_cu, 2.0 * sum(per_type.values())),
                            deserved_gpus_by_type=per_type,
                            over_quota_weight=rng.choice([0.5, 1.0, 1.0, 2.0]),
                            priority=rng.choice([0, 0, 1]),
                            limit_cu=rng.choice([None, None, None, None, team_deserved_cu * 4]),
                            limit_gpus_by_type=({"v100-16gb": 2.0} if rng.random() < 0.1 else {}),
                        )
                    },
                    created_at_s=float(t),
                )
            )
            allocated = {t: rng.choice([0.0, 0.0, 0.5, 1.0, 2.0]) for t in GPU_TYPES}
            pending = {t: rng.choice([0.0, 0.0, 1.0, 4.0, 8.0]) for t in GPU_TYPES}
            demands[team] = QueueDemand(
                allocated_gpus_by_type={t: g for t, g in allocated.items() if g},
                pending_gpus_by_type={t: g for t, g in pending.items() if g},
            )
            usage[team] = rng.uniform(0.0, team_deserved_cu) * 3600.0
    inp = FairShareInput(
        pool=POOL,
        policy=FairSharePolicy(k=1.0, rounding=rounding),
        gpu_types=GPU_TYPES,
        capacity_gpus_by_type=capacity,
        queues=queues,
        demands=demands,
        usage=UsageInputs(usage_cu_s=usage, group_capacity_cu_s=group_capacity),
    )
    # The previous recompute's weights, so the dead band does its real work.
    previous = compute_fair_shares(inp).effective_weights
    return FairShareInput(
        pool=inp.pool,
        policy=inp.policy,
        gpu_types=inp.gpu_types,
        capacity_gpus_by_type=inp.capacity_gpus_by_type,
        queues=inp.queues,
        demands=inp.demands,
        usage=inp.usage,
        previous_effective_weights=previous,
    )


def time_division(inp: FairShareInput, repeats: int) -> list[float]:
    for _ in range(3):
        compute_fair_shares(inp)
    samples_ms = []
    for _ in range(repeats):
        started = time.perf_counter()
        compute_fair_shares(inp)
        samples_ms.append((time.perf_counter() - started) * 1000.0)
    return samples_ms


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10, 100, 1000, 10000])
    parser.add_argument("--repeats", type=int, default=0, help="samples per size (0: by size)")
    args = parser.parse_args()

    print(f"python {platform.python_version()} on {platform.machine()}, 2 cores shared\n")
    print("| leaves | departments | rounding | median ms | p90 ms | µs per queue |")
    print("|---:|---:|---|---:|---:|---:|")
    target_median_ms: float | None = None
    for leaves in args.sizes:
        for rounding in (Rounding.CONTINUOUS, Rounding.WHOLE_GPUS):
            if rounding == Rounding.WHOLE_GPUS and leaves != TARGET_LEAVES:
                continue
            inp = build_input(leaves, rounding=rounding)
            repeats = args.repeats or max(10, min(300, 200_000 // leaves))
            samples = time_division(inp, repeats)
            median_ms = statistics.median(samples)
            p90_ms = statistics.quantiles(samples, n=10)[-1]
            queues = len(inp.queues)
            print(
                f"| {leaves:,} | {queues - leaves:,} | {rounding.value} | {median_ms:.2f} "
                f"| {p90_ms:.2f} | {1000 * median_ms / queues:.1f} |"
            )
            if leaves == TARGET_LEAVES and rounding == Rounding.CONTINUOUS:
                target_median_ms = median_ms
    if target_median_ms is not None:
        verdict = "met" if target_median_ms <= TARGET_MS else "MISSED"
        print(
            f"\nTarget: {TARGET_LEAVES:,} leaves under 50 departments, median ≤ {TARGET_MS:.0f} ms"
            f" — {target_median_ms:.2f} ms, {verdict}."
        )


if __name__ == "__main__":
    main()
