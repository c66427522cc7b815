"""Gang entitlement, side by side: every example scenario with the pool policy `gang_entitlement`
off and on, in one run (issue 20's targets and its "no existing scenario gets worse" check).

Run from the repository root:

    .venv/bin/python bench/bench_entitlement.py [--trace-dir DIR] [--only NAME ...]

Per scenario and k (time-based k = 1, classic k = 0), for entitlement off and on: each queue's
share of the over-quota CU-hours, Jain's index of the top level, the worst queue's P99 wait,
evictions per 1,000 GPU-hours, the wait to its first start of the first gang of the queue a
scenario names (`first_gang_queue`), and the CPU and wall seconds of the run. The scenarios run
with their own settings (cycle_s, recompute_s), the trace replay with the trace folder from
--trace-dir or $GPUFAIR_TRACE_DIR (skipped without one). Results: bench/results/entitlement.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPOSITORY / "service"))

from gpufair.sim.engine import SimResult, simulate  # noqa: E402
from gpufair.sim.metrics import RunMetrics, compute_metrics  # noqa: E402
from gpufair.sim.scenario import Scenario, load_scenario  # noqa: E402
from gpufair.sim.trace import TRACE_DIR_ENV  # noqa: E402

SCENARIOS = REPOSITORY / "examples" / "scenarios"
# The queue whose first gang's wait a scenario is about (issue 20's burst case).
FIRST_GANG_QUEUE = {"burst-gang": "team-c"}


def run_once(
    scenario: Scenario, k: float, entitled: bool
) -> tuple[SimResult, RunMetrics, float, float]:
    changed = scenario.with_policy(lambda p: dataclasses.replace(p, k=k)).with_pools(
        lambda p: dataclasses.replace(p, gang_entitlement=entitled)
    )
    cpu0, wall0 = time.process_time(), time.perf_counter()
    result = simulate(changed)
    metrics = compute_metrics(result)
    return result, metrics, time.process_time() - cpu0, time.perf_counter() - wall0


def first_gang_wait_h(result: SimResult, queue: str) -> str:
    jobs = [job for job in result.jobs if job.workload.queue == queue]
    if not jobs:
        return "-"
    first = jobs[0]
    if first.first_start_s is None:
        return "never"
    return f"{(first.first_start_s - first.workload.submit_time_s) / 3600:.1f}"


def row(
    name: str,
    k: float,
    entitled: bool,
    result: SimResult,
    metrics: RunMetrics,
    cpu: float,
    wall: float,
) -> str:
    pool = metrics.pools[0]
    leaves = [q for q in metrics.queues if q.is_leaf and q.competed]
    shares = " / ".join(
        f"{q.queue} {100 * q.over_quota_share:.1f}"
        for q in leaves
        if q.over_quota_share is not None
    )
    p99s = [q.wait_p99_s for q in leaves if q.wait_p99_s is not None]
    worst_p99_h = max(p99s) / 3600 if p99s else float("nan")
    jain = pool.jain_index.get("")
    queue = FIRST_GANG_QUEUE.get(name)
    first = first_gang_wait_h(result, queue) if queue else "-"
    return (
        f"| {name} | {k:g} | {'on' if entitled else 'off'} | {shares} | "
        f"{'-' if jain is None else f'{jain:.3f}'} | {worst_p99_h:.1f} | "
        f"{10 * pool.evictions_per_100_gpu_hours:.2f} | {first} | {cpu:.1f} | {wall:.1f} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trace-dir", type=Path, default=None)
    parser.add_argument("--only", nargs="*", default=None, help="scenario names (file stems)")
    parser.add_argument("--k", nargs="*", type=float, default=[1.0, 0.0])
    args = parser.parse_args()
    trace_dir = args.trace_dir or (
        Path(os.environ[TRACE_DIR_ENV]) if TRACE_DIR_ENV in os.environ else None
    )
    print(
        "| scenario | k | entitlement | over-quota share % | Jain | worst P99 wait h | "
        "evictions / 1000 GPU-h | first gang wait h | CPU s | wall s |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for path in sorted(SCENARIOS.glob("*.yaml")):
        name = path.stem
        if args.only and name not in args.only:
            continue
        if "trace" in name and trace_dir is None:
            print(f"| {name} | - | - | skipped: no trace folder | | | | | | |")
            continue
        scenario = (
            load_scenario(path, trace_dir=trace_dir) if "trace" in name else load_scenario(path)
        )
        for k in args.k:
            for entitled in (False, True):
                result, metrics, cpu, wall = run_once(scenario, k, entitled)
                print(row(name, k, entitled, result, metrics, cpu, wall), flush=True)


if __name__ == "__main__":
    main()
