"""How a cycle's cost grows with the pool, beside how its decisions grow (issue 17's 1,000 ->
4,000 nodes at most 4 x).

`bench_cycle.py` keeps 200 leaf queues at every size, so at 4,000 nodes each queue holds four
times the work and the victims, and the cycle decides more than four times as much (steady:
evictions 4.16 x, preemptions 4.8 x). Here each size is run twice: with the benchmark's 200
queues, and with its queues grown with the pool (200 per 1,000 nodes: a cluster that grows with
its teams), where the work per queue stays the same. Each row gives the CPU time of a cycle, the
decisions it made, and both as ratios to the smallest size, so a cost that grows faster than
its decisions shows apart from one that follows them.

All pools are built in one process first; then their cycles run interleaved, one of each in
turn, so every pool sees the same machine load. Each cycle is given the records the warm-up
cycle left (`cycle_memory`, as the service carries them), the collector paused during the cycle
and one young pass after it, timed with it (as `pair_cycle.py --gc cycle --carry`).

The growth is given twice: `CPU x`, the ratio of the pools' medians, and `paired x`, the median
over rounds of each round's ratio (a pool's cycle over the smallest pool's cycle of the same
round, run seconds apart), with the rounds' range. Pairing would cancel a drift of the host's
speed over a run; on the shared host of round 33 it steadied the read little (runs of one code:
`CPU x` 3.72-4.34, `paired x` 3.70-4.15), because the speed changes from one cycle to the next
(a run's rounds gave ratios of 3.1 to 6.4): the range shows how noisy the host was.

With `--phases` each cycle is run phase by phase, as `pair_cycle.py` times them (its `run_phases`,
then the result and the young pass after the cycle), and a second table gives each phase's CPU
median per pool beside the total and its ratio to the smallest pool's, so the growth of each
phase can be read beside that of the decisions.

Run from the repository root:

    PYTHONPATH=service python bench/cycle_scaling.py --mix steady --sizes 1000,2000,4000 --cycles 8
    PYTHONPATH=service python bench/cycle_scaling.py --mix steady --sizes 1000,4000 --cycles 6 --phases
"""

from __future__ import annotations

import argparse
import copy
import gc
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_cycle import QUEUES, build_snapshot
from pair_cycle import run_phases

from gpufair.domain import cycle
from gpufair.domain.cycle import run_cycle
from gpufair.domain.cycle_memory import CarriedLoad
from gpufair.domain.cycle_state import CycleState
from gpufair.domain.snapshot import CycleSnapshot


@dataclass
class Pool:
    nodes: int
    queues: int
    snapshot: CycleSnapshot
    carried: Any
    decisions: int
    evictions: int
    times: list[float]
    phases: dict[str, list[float]]


def _build(nodes: int, queues: int, scrambled: bool) -> Pool:
    snapshot = build_snapshot(nodes, scrambled=scrambled, queues=queues)
    carried = CarriedLoad()
    result = run_cycle(snapshot, carried)  # warm-up: leaves the records every timed cycle gets
    decisions = len(result.binds) + len(result.evicts) + len(result.reservations)
    return Pool(nodes, queues, snapshot, carried, decisions, len(result.evicts), [], {})


def _time_one(pool: Pool, phased: bool) -> None:
    gc.collect()
    given = copy.copy(pool.carried)
    started = time.process_time()
    gc.disable()
    if phased:
        _run_phases(pool, given)
    else:  # its result dropped before the young pass, as in pair_cycle.py
        run_cycle(pool.snapshot, given)
    freed = time.process_time()
    gc.enable()
    gc.collect(0)
    ended = time.process_time()
    pool.times.append(ended - started)
    if phased:
        pool.phases.setdefault("free, young pass", []).append(ended - freed)


def _run_phases(pool: Pool, given: CarriedLoad) -> None:
    """One cycle as `run_cycle` runs it, each phase timed as `pair_cycle.py` times it (the
    state's construction counts in the total only)."""
    times = run_phases(cycle, CycleState(pool.snapshot, given))
    for label, seconds in times.items():
        pool.phases.setdefault(label, []).append(seconds)


def _print_phases(pools: list[Pool]) -> None:
    """Per phase, its CPU median per pool (ms) and, in brackets, its ratio to the smallest
    pool's; phases under 1 ms in every pool are left out."""
    smallest = pools[0]
    print()
    print("| phase | " + " | ".join(f"{p.nodes:,} / {p.queues} ms (x)" for p in pools) + " |")
    print("|---|" + "---:|" * len(pools))
    rows = [*smallest.phases, "total"]
    for label in rows:
        samples = [p.times if label == "total" else p.phases[label] for p in pools]
        medians = [statistics.median(found) for found in samples]
        if max(medians) < 0.001:
            continue
        base = medians[0]
        cells = [
            f"{1e3 * median:.1f} ({median / base:.2f})" if base > 0 else f"{1e3 * median:.1f}"
            for median in medians
        ]
        print(f"| {label} | " + " | ".join(cells) + " |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mix", choices=("steady", "scrambled"), default="steady")
    parser.add_argument("--sizes", default="1000,2000,4000", help="node counts, smallest first")
    parser.add_argument("--cycles", type=int, default=8, help="timed cycles per pool")
    parser.add_argument(
        "--phases",
        action="store_true",
        help="time each phase as pair_cycle.py does and print their growth beside the totals",
    )
    args = parser.parse_args()
    sizes = [int(size) for size in args.sizes.split(",")]
    scrambled = args.mix == "scrambled"
    pools: list[Pool] = []
    for nodes in sizes:
        pools.append(_build(nodes, QUEUES, scrambled))
        grown = QUEUES * nodes // sizes[0]
        if grown != QUEUES:
            pools.append(_build(nodes, grown, scrambled))
    started_wall, started_cpu = time.perf_counter(), time.process_time()
    for _ in range(args.cycles):
        for pool in pools:
            _time_one(pool, args.phases)
    wall, cpu = time.perf_counter() - started_wall, time.process_time() - started_cpu
    smallest = pools[0]
    base_cpu = statistics.median(smallest.times)
    print(f"{args.mix}, {args.cycles} cycles per pool, carried records, collector paused per cycle")
    print()
    print(
        "| nodes | queues | CPU median / min s | decisions (evictions) | CPU x "
        "| paired x (rounds' range) | decisions x | CPU µs per decision |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for pool in pools:
        median = statistics.median(pool.times)
        paired = [own / base for own, base in zip(pool.times, smallest.times, strict=True)]
        print(
            f"| {pool.nodes:,} | {pool.queues} | {median:.3f} / {min(pool.times):.3f} "
            f"| {pool.decisions:,} ({pool.evictions:,}) | {median / base_cpu:.2f} "
            f"| {statistics.median(paired):.2f} ({min(paired):.2f}-{max(paired):.2f}) "
            f"| {pool.decisions / smallest.decisions:.2f} "
            f"| {1e6 * median / pool.decisions:.1f} |"
        )
    if args.phases:
        _print_phases(pools)
    print(f"\ntimed cycles: {wall:.1f} s wall, {cpu:.1f} s CPU")


if __name__ == "__main__":
    main()
