"""What defragmentation buys: the same scenario with and without moves, side by side.

Run from the repository root, e.g.:

    PYTHONPATH=service python bench/bench_defrag.py examples/scenarios/fragmentation.yaml
    PYTHONPATH=service python bench/bench_defrag.py examples/scenarios/alibaba-trace-replay.yaml \\
        --share 0.05 --large-gpus 4

Each scenario runs twice: with its pools' `max_moved_share_per_hour` removed (no moves) and set
to `--share` (or the scenario's own value when it has one and `--share` is not given). Printed
per run: the pool's utilisation, wait P50 / P99 of the large jobs (those asking for at least
`--large-gpus` GPUs in all) and their count still waiting at the end, moves and GPUs moved, and
the run's CPU seconds (`time.process_time`, steadier than wall-clock on a shared machine) beside
its wall seconds.

A second table traces the evictions (`engine.DecisionRow`): by the phase that decided them, and
by how the run they ended had started (`started_as`: within the share, beyond it, on capacity
evicted for it, or where a move sent it), with those of workloads evicted before in the run.
`--cycle-s` runs the scenario with another cycle length: how far the counts move under a change
that has nothing to do with moves, against which the difference moves make can be read.

`--seed` and `--duration-s` override the scenario's; `--only off|moves` runs one of the two;
`--write DIR` writes each run's outputs (summary.json, events.csv, jobs.csv, timeline.csv) into
DIR/off and DIR/moves, so two trees can be shown to decide the same by comparing the files.
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from collections import Counter
from pathlib import Path

from gpufair.sim.engine import SimResult, simulate
from gpufair.sim.metrics import compute_metrics, percentile
from gpufair.sim.outputs import write_run
from gpufair.sim.scenario import Scenario, load_scenario


def with_share(scenario: Scenario, share: float | None) -> Scenario:
    pools = tuple(
        dataclasses.replace(pool, max_moved_share_per_hour=share) for pool in scenario.cluster.pools
    )
    return dataclasses.replace(scenario, cluster=dataclasses.replace(scenario.cluster, pools=pools))


def row(label: str, result: SimResult, cpu_s: float, wall_s: float, large_gpus: float) -> str:
    metrics = compute_metrics(result)
    large = [j for j in result.jobs if j.workload.total_gpus >= large_gpus]
    waits = [j.wait_s for j in large]
    p50, p99 = percentile(waits, 50), percentile(waits, 99)
    waiting = sum(1 for j in large if j.pending_since_s is not None)
    pool = metrics.pools[0]
    run = result.pools[0]

    def hours(s: float | None) -> str:
        return "-" if s is None else f"{s / 3600:.2f}"

    return (
        f"| {label} | {100 * pool.utilisation:.1f} | {len(large)} | {hours(p50)} | {hours(p99)} "
        f"| {waiting} | {pool.idle_gpu_hours_while_pending:.0f} | {run.moves} "
        f"| {run.moved_gpus:.0f} | {pool.evictions} | {cpu_s:.1f} | {wall_s:.1f} |"
    )


def chain_row(label: str, result: SimResult) -> str:
    """The evictions of the run's first pool by reason, by how their run started, and repeats."""
    evictions = [
        d for d in result.decisions if d.event == "evict" and d.pool == result.pools[0].name
    ]
    reasons = Counter(d.reason for d in evictions)
    started = Counter(d.started_as.split(":")[0] for d in evictions)
    return (
        f"| {label} | {len(evictions)} | {reasons['reclaim']} | {reasons['preempt']} "
        f"| {reasons['entitlement']} | {reasons['defragment']} | {started['within_share']} "
        f"| {started['beyond_share']} | {started['claim']} | {started['move']} "
        f"| {sum(1 for d in evictions if d.evicted_before > 0)} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("scenario", type=Path)
    parser.add_argument("--share", type=float, default=None, help="max_moved_share_per_hour")
    parser.add_argument("--large-gpus", type=float, default=8.0, help="a large job's GPUs")
    parser.add_argument("--trace-dir", type=Path, default=None)
    parser.add_argument("--cycle-s", type=float, default=None, help="another cycle length")
    parser.add_argument("--seed", type=int, default=None, help="override the scenario's seed")
    parser.add_argument("--duration-s", type=float, default=None, help="a shorter run")
    parser.add_argument("--only", choices=("off", "moves"), default=None, help="one run")
    parser.add_argument("--write", type=Path, default=None, help="folder for the runs' outputs")
    args = parser.parse_args()
    kwargs = {} if args.trace_dir is None else {"trace_dir": args.trace_dir}
    scenario = load_scenario(args.scenario, seed=args.seed, **kwargs)
    if args.cycle_s is not None:
        scenario = dataclasses.replace(scenario, cycle_s=args.cycle_s)
    if args.duration_s is not None:
        scenario = dataclasses.replace(scenario, duration_s=args.duration_s)
    own = next(
        (p.max_moved_share_per_hour for p in scenario.cluster.pools if p.max_moved_share_per_hour),
        None,
    )
    share = args.share if args.share is not None else own if own is not None else 0.1
    print(
        f"scenario {scenario.name}, cycle {scenario.cycle_s:g} s, "
        f"large jobs: at least {args.large_gpus:g} GPUs"
    )
    print()
    print(
        "| moves | utilisation % | large jobs | large wait P50 h | large wait P99 h "
        "| large waiting at end | idle GPU-h while pending | moves | GPUs moved | evictions "
        "| CPU s | wall s |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    chains = []
    for name, label, value in (("off", "off", None), ("moves", f"share {share:g}/h", share)):
        if args.only is not None and args.only != name:
            continue
        started_wall = time.perf_counter()
        started = time.process_time()
        result = simulate(with_share(scenario, value))
        cpu_s = time.process_time() - started
        wall_s = time.perf_counter() - started_wall
        print(row(label, result, cpu_s, wall_s, args.large_gpus), flush=True)
        if args.write is not None:
            write_run(result, compute_metrics(result), args.write / name)
        chains.append(chain_row(label, result))
    print()
    print(
        "| moves | evictions | reclaim | preempt | entitlement | defragment "
        "| run began within share | beyond share | on a claim | by a move | evicted before |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    print("\n".join(chains))


if __name__ == "__main__":
    main()
