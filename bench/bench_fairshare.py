"""Benchmark: one full fair-share division for growing queue trees.

Run from the repository root:

    PYTHONPATH=service python bench/bench_fairshare.py
    PYTHONPATH=service python bench/bench_fairshare.py --baseline REV   # old code beside new
    PYTHONPATH=service python bench/bench_fairshare.py --baseline REV --gc serve
    PYTHONPATH=service python bench/bench_fairshare.py --plan none      # compile every call

With `--baseline`, the same cases run on the code of git revision REV (exported to a temporary
folder) and on the working tree, in separate worker processes taking turns, so both see the same
machine load; the table gives both medians and their ratio. CPU time (`time.process_time`) is
reported beside wall time: on a shared machine it is the steadier of the two.

Each case is a pool with three GPU types and `leaves` leaf queues under `leaves // 20`
departments (1,000 leaves → 50 departments), with the features a real recompute exercises:
history for every queue, previous effective weights for the dead band, three priority tiers,
CU and per-type limits, per-type guarantees, and demands spread over the types. The timed call
is `compute_fair_shares` alone, validation included; building the input is not timed.

The pool's configuration is compiled once into a `FairSharePlan` (as a recompute keeps it across
calls, issue 17) and passed with every call (`--plan reuse`, the default); `--plan none` times
calls that compile it each time, as a caller without a plan pays. Code from before the plan
existed has none either way. The compile itself is timed in its own row (`--plan compile`).
`--gc serve` runs the workers with the garbage collector set as `gpufair serve` sets it
(`gc_tuning.tune_for_serving`); the default leaves Python's defaults.

The demands go to the call as the recompute and the simulator pass them with a plan kept: as
columns in the plan's leaf order (`LeafDemands`, `--demands columns`, the default; issue 17's
third step), converted from the case's maps before timing. `--demands maps` passes the maps,
which the call converts itself. Code from before the columns existed gets the maps either way.
`--plan demands` times what builds the demands from the pool's rows instead of the division:
`demand.leaf_demand_columns` (columns) or `demand.queue_demands` (maps) over one held row per
leaf and type and one waiting workload per leaf and type, as a recompute reads them.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from gpufair.domain.demand import queue_demands
from gpufair.domain.fairshare import FairShareInput, QueueDemand, compute_fair_shares
from gpufair.domain.model import FairSharePolicy, GpuType, Queue, QueueQuota, Rounding, Workload
from gpufair.domain.usage import UsageInputs
from gpufair.gc_tuning import tune_for_serving

try:  # the division profile exists from the code that added it on
    from gpufair.domain.model import Division
except ImportError:  # a baseline before it: every case is gpufair
    Division = None  # type: ignore[assignment,misc]

try:  # the compiled plan exists from issue 17's second step on
    from gpufair.domain.fairshare import FairSharePlan
except ImportError:  # a baseline before it compiles nothing
    FairSharePlan = None  # type: ignore[assignment,misc]

try:  # demands as columns exist from issue 17's third step on
    from gpufair.domain.demand import leaf_demand_columns
    from gpufair.domain.fairshare import LeafDemands
except ImportError:  # a baseline before it passes maps
    LeafDemands = None  # type: ignore[assignment,misc]
    leaf_demand_columns = None  # type: ignore[assignment]

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
# Issue 17: 1,000 leaves ≤ 5 ms and 10,000 leaves ≤ 50 ms, median.
TARGETS_MS = {1000: 5.0, 10000: 50.0}


def _policy(rounding: Rounding, division: str) -> FairSharePolicy:
    if division == "gpufair":
        return FairSharePolicy(k=1.0, rounding=rounding)
    return FairSharePolicy(k=1.0, rounding=rounding, division=Division(division))


def build_input(
    leaves: int, *, rounding: Rounding, division: str = "gpufair", seed: int = 7
) -> FairShareInput:
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
        policy=_policy(rounding, division),
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


def _rows(inp: FairShareInput) -> tuple[list[tuple[str, str, float]], list[Workload]]:
    """The case's demands as a recompute reads them: a held row per leaf and type, a waiting
    workload per leaf and type (its GPUs on that type, which serves it)."""
    demands = inp.demands
    assert isinstance(demands, Mapping), "the case's demands are maps"
    held = [
        (name, t, gpus)
        for name, demand in demands.items()
        for t, gpus in demand.allocated_gpus_by_type.items()
    ]
    waiting = [
        Workload(
            uid=f"{name}/{t}", queue=name, pool=POOL, pods=1, gpus_per_pod=gpus, submit_time_s=0.0
        )
        for name, demand in demands.items()
        for t, gpus in demand.pending_gpus_by_type.items()
    ]
    return held, waiting


def _call(inp: FairShareInput, plan_mode: str, demands_mode: str) -> Callable[[], object]:
    """The timed call: a division with the plan kept (`reuse`), without one (`none`), the
    compile alone (`compile`), or the demands built from rows (`demands`)."""
    if plan_mode == "demands":
        held, waiting = _rows(inp)
        serving = {w.uid: w.uid.rsplit("/", 1)[1] for w in waiting}

        def serving_type(workload: Workload) -> str:
            return serving[workload.uid]

        weights = {t: g.compute_weight for t, g in GPU_TYPES.items()}
        if leaf_demand_columns is None or demands_mode == "maps":
            demands = inp.demands
            assert isinstance(demands, Mapping), "the case's demands are maps"
            leaves = [q.name for q in inp.queues if q.name in demands]
            return lambda: queue_demands(leaves, held, waiting, serving_type, weights)
        plan = FairSharePlan.compile(inp.pool, inp.policy, inp.gpu_types, inp.queues)
        return lambda: leaf_demand_columns(
            plan.leaf_names, plan.type_names, held, waiting, serving_type, weights
        )
    if FairSharePlan is None or plan_mode == "none":
        return lambda: compute_fair_shares(inp)
    if plan_mode == "compile":
        return lambda: FairSharePlan.compile(inp.pool, inp.policy, inp.gpu_types, inp.queues)
    plan = FairSharePlan.compile(inp.pool, inp.policy, inp.gpu_types, inp.queues)
    if LeafDemands is not None and demands_mode == "columns":
        maps = inp.demands
        assert isinstance(maps, Mapping), "the case's demands are maps"
        columns = LeafDemands.from_maps(plan.leaf_names, plan.type_names, maps)
        assert columns is not None, "every demand names a leaf of the plan"
        inp = dataclasses.replace(inp, demands=columns)
    return lambda: compute_fair_shares(inp, plan)


def time_division(
    inp: FairShareInput, repeats: int, plan_mode: str = "reuse", demands_mode: str = "columns"
) -> tuple[list[float], list[float]]:
    """`repeats` samples of one call, in ms: (CPU, wall), after 3 warm-up calls."""
    call = _call(inp, plan_mode, demands_mode)
    for _ in range(3):
        call()
    cpu_ms, wall_ms = [], []
    for _ in range(repeats):
        wall = time.perf_counter()
        cpu = time.process_time()
        call()
        cpu_ms.append((time.process_time() - cpu) * 1000.0)
        wall_ms.append((time.perf_counter() - wall) * 1000.0)
    return cpu_ms, wall_ms


# (leaves, rounding, division) of every row; a baseline without the kai division skips its rows.
CASES = [
    (10, "continuous", "gpufair"),
    (100, "continuous", "gpufair"),
    (1000, "continuous", "gpufair"),
    (1000, "whole_gpus", "gpufair"),
    (1000, "whole_gpus", "kai"),
    (10000, "continuous", "gpufair"),
    (10000, "whole_gpus", "kai"),
]


def _repeats(leaves: int, asked: int) -> int:
    return asked or max(10, min(300, 200_000 // leaves))


def worker(
    leaves: int,
    rounding: str,
    division: str,
    repeats: int,
    plan_mode: str,
    gc_mode: str,
    demands_mode: str = "columns",
) -> None:
    """One case in this process; prints its samples as JSON."""
    inp = build_input(leaves, rounding=Rounding(rounding), division=division)
    if gc_mode == "serve":
        tune_for_serving()
    cpu_ms, wall_ms = time_division(inp, repeats, plan_mode, demands_mode)
    print(json.dumps({"cpu_ms": cpu_ms, "wall_ms": wall_ms, "queues": len(inp.queues)}))


def _run_worker(
    service_dir: Path,
    case: tuple[int, str, str],
    repeats: int,
    plan_mode: str,
    gc_mode: str,
    demands_mode: str,
) -> dict[str, list[float]]:
    leaves, rounding, division = case
    env = {**os.environ, "PYTHONPATH": str(service_dir)}
    command = [sys.executable, __file__, "--worker", str(leaves), rounding, division]
    command += ["--repeats", str(repeats), "--plan", plan_mode, "--gc", gc_mode]
    command += ["--demands", demands_mode]
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
    samples: dict[str, list[float]] = json.loads(done.stdout)
    return samples


def _export(revision: str, into: Path) -> Path:
    """The `service` folder of git revision `revision`, written under `into`."""
    archive = subprocess.run(
        ["git", "archive", revision, "service"], capture_output=True, check=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into / "service"


def _median(values: list[float]) -> float:
    return statistics.median(values)


def compare(
    baseline: str,
    sizes: list[int],
    rounds: int,
    asked_repeats: int,
    plan_mode: str,
    gc_mode: str,
    demands_mode: str = "columns",
) -> None:
    new_service = Path(__file__).resolve().parents[1] / "service"
    with tempfile.TemporaryDirectory() as folder:
        old_service = _export(baseline, Path(folder))
        print(
            f"baseline {baseline} against the working tree; {rounds} rounds, taking turns; "
            f"plan {plan_mode}, gc {gc_mode}, demands {demands_mode}\n"
        )
        print(
            "| leaves | rounding | division | old CPU ms | new CPU ms | CPU old/new "
            "| old wall ms | new wall ms | wall old/new | new µs/queue (CPU) |"
        )
        print("|---:|---|---|---:|---:|---:|---:|---:|---:|---:|")
        for case in CASES:
            leaves, rounding, division = case
            if leaves not in sizes:
                continue
            repeats = max(3, _repeats(leaves, asked_repeats) // rounds)
            old: dict[str, list[float]] = {"cpu_ms": [], "wall_ms": []}
            new: dict[str, list[float]] = {"cpu_ms": [], "wall_ms": []}
            queues = 0
            old_runs = True  # until the baseline turns out not to know the case (kai)
            for _ in range(rounds):
                if old_runs:
                    try:
                        got = _run_worker(
                            old_service, case, repeats, plan_mode, gc_mode, demands_mode
                        )
                    except subprocess.CalledProcessError:
                        old_runs = False
                    else:
                        old["cpu_ms"] += got["cpu_ms"]
                        old["wall_ms"] += got["wall_ms"]
                got = _run_worker(new_service, case, repeats, plan_mode, gc_mode, demands_mode)
                new["cpu_ms"] += got["cpu_ms"]
                new["wall_ms"] += got["wall_ms"]
                queues = int(got["queues"])  # type: ignore[call-overload]
            new_cpu, new_wall = _median(new["cpu_ms"]), _median(new["wall_ms"])
            if old["cpu_ms"]:
                old_cpu, old_wall = _median(old["cpu_ms"]), _median(old["wall_ms"])
                old_cells = (
                    f"{old_cpu:.2f} | {new_cpu:.2f} | {old_cpu / new_cpu:.2f} "
                    f"| {old_wall:.2f} | {new_wall:.2f} | {old_wall / new_wall:.2f}"
                )
            else:
                old_cells = f"- | {new_cpu:.2f} | - | - | {new_wall:.2f} | -"
            print(
                f"| {leaves:,} | {rounding} | {division} | {old_cells} "
                f"| {1000 * new_cpu / queues:.1f} |"
            )


def alone(
    sizes: list[int], asked_repeats: int, plan_mode: str, gc_mode: str, demands_mode: str
) -> None:
    print(
        f"python {platform.python_version()} on {platform.machine()}; "
        f"plan {plan_mode}, gc {gc_mode}, demands {demands_mode}\n"
    )
    if gc_mode == "serve":
        tune_for_serving()
    print(
        "| leaves | departments | rounding | division | CPU median ms | wall median ms "
        "| wall p90 ms | µs per queue (CPU) |"
    )
    print("|---:|---:|---|---|---:|---:|---:|---:|")
    for leaves, rounding, division in CASES:
        if leaves not in sizes:
            continue
        inp = build_input(leaves, rounding=Rounding(rounding), division=division)
        cpu_ms, wall_ms = time_division(
            inp, _repeats(leaves, asked_repeats), plan_mode, demands_mode
        )
        cpu, wall = _median(cpu_ms), _median(wall_ms)
        p90 = statistics.quantiles(wall_ms, n=10)[-1]
        queues = len(inp.queues)
        print(
            f"| {leaves:,} | {queues - leaves:,} | {rounding} | {division} | {cpu:.2f} "
            f"| {wall:.2f} | {p90:.2f} | {1000 * cpu / queues:.1f} |"
        )
        target = TARGETS_MS.get(leaves)
        if target is not None and rounding == "continuous" and plan_mode in ("reuse", "none"):
            verdict = "met" if cpu <= target else "MISSED"
            print(f"|  |  | target ≤ {target:.0f} ms (CPU median): {verdict} | | | | | |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10, 100, 1000, 10000])
    parser.add_argument("--repeats", type=int, default=0, help="samples per size (0: by size)")
    parser.add_argument("--baseline", default=None, help="git revision to compare against")
    parser.add_argument("--rounds", type=int, default=4, help="turns per case with --baseline")
    parser.add_argument(
        "--plan",
        choices=["reuse", "none", "compile", "demands"],
        default="reuse",
        help="reuse one compiled plan (default), compile in every call, time the compile, or "
        "time building the demands from rows",
    )
    parser.add_argument(
        "--demands",
        choices=["columns", "maps"],
        default="columns",
        help="pass the demands as columns in the plan's order (default) or as maps",
    )
    parser.add_argument(
        "--gc", choices=["default", "serve"], default="default", help="garbage collector settings"
    )
    parser.add_argument("--worker", nargs=3, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker is not None:
        leaves, rounding, division = args.worker
        worker(
            int(leaves),
            rounding,
            division,
            _repeats(int(leaves), args.repeats),
            args.plan,
            args.gc,
            args.demands,
        )
    elif args.baseline is not None:
        compare(
            args.baseline, args.sizes, args.rounds, args.repeats, args.plan, args.gc, args.demands
        )
    else:
        alone(args.sizes, args.repeats, args.plan, args.gc, args.demands)


if __name__ == "__main__":
    main()
