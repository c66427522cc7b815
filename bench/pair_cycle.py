"""Cycles of several checkouts interleaved one by one, phase by phase: a paired comparison for a
loaded machine.

`compare_cycle.py` starts a process per checkout and round and builds the pool in each, which at
4,000 nodes costs more than the cycles it times. Here each checkout gets one worker process that
builds the pool once (this checkout's `bench_cycle.py`, so all decide over the same snapshot) and
then runs one cycle per request; the checkouts' cycles alternate, one each in turn, so
neighbouring cycles of different checkouts see the same machine load. Each cycle is timed per
phase (CPU seconds of the worker), where the checkout's `cycle` module has the phases of
`run_cycle`; otherwise only in total.

Run from the repository root, e.g. the code a change started from and this checkout:

    python bench/pair_cycle.py --trees BASE,. --mix steady --size 4000 --cycles 6

Prints one Markdown row per phase: the minimum and median CPU seconds per checkout and each
minimum's ratio to that of the first checkout timing the phase (the minimum is the figure least disturbed by the load).
"""

from __future__ import annotations

import argparse
import copy
import gc
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent

# The phases of `cycle.run_cycle`, in order, with the keyword arguments they take.
PHASES: list[tuple[str, dict[str, bool]]] = [
    ("load", {}),
    ("honour_moves", {}),
    ("honour_claims", {}),
    ("allocate", {"within_share": True}),
    ("allocate_mixed", {"within_share": True}),
    ("reclaim", {}),
    ("reclaim_for_guarantees", {}),
    ("preempt", {}),
    ("defragment", {}),
    ("admit_entitled_gangs", {}),
    ("reserve_for_long_waits", {}),
    ("allocate", {"within_share": False}),
    ("allocate_mixed", {"within_share": False}),
]


def run_phases(cycle: Any, state: Any) -> dict[str, float]:
    """Run the phases of `cycle` (a checkout's `gpufair.domain.cycle` module) on `state` in
    `run_cycle`'s order, then its result; the CPU seconds of each, by label (the allocations
    after the guarantees as "... beyond share")."""
    times: dict[str, float] = {}
    for name, kwargs in PHASES:
        started = time.process_time()
        getattr(cycle, name)(state, **kwargs)
        label = f"{name} beyond share" if kwargs.get("within_share") is False else name
        times[label] = times.get(label, 0.0) + time.process_time() - started
    started = time.process_time()
    state.result()
    times["result"] = time.process_time() - started
    return times


def worker(
    mix: str, size: int, collector: str = "default", carry: bool = False, queues: int = 0
) -> None:
    """Build the pool, then time one cycle per line read from stdin (one JSON line each).
    `carry`: each timed cycle is given the records the cycle before it left
    (`cycle_memory.CarriedLoad`, where the checkout has it): for the *next* mix those of the
    steady cycle that made its snapshot, for the others those of the warm-up cycle.
    `queues`: the pool's leaf queues (0: the benchmark's, `bench_cycle.QUEUES`)."""
    sys.path.insert(0, str(BENCH))
    from bench_cycle import QUEUES, build_snapshot, next_snapshot

    from gpufair.domain import cycle
    from gpufair.domain.cycle import run_cycle
    from gpufair.domain.cycle_state import CycleState

    carried: Any = None
    if carry and importlib.util.find_spec("gpufair.domain.cycle_memory") is not None:
        from gpufair.domain.cycle_memory import CarriedLoad

        carried = CarriedLoad()
    snapshot = build_snapshot(size, scrambled=mix == "scrambled", queues=queues or QUEUES)
    if mix == "next":
        first = run_cycle(snapshot, carried) if carried is not None else run_cycle(snapshot)
        snapshot = next_snapshot(snapshot, first)
        result = run_cycle(snapshot)  # warm-up, leaving `carried` as the steady cycle left it
    elif carried is not None:
        result = run_cycle(snapshot, carried)  # warm-up
    else:
        result = run_cycle(snapshot)  # warm-up
    decisions = [len(result.binds), len(result.evicts), len(result.reservations)]
    print(json.dumps({"decisions": decisions, "carried": carried is not None}), flush=True)
    phased = all(hasattr(cycle, name) for name, _ in PHASES)
    for _ in sys.stdin:
        gc.collect()
        times: dict[str, float] = {}
        # A shallow copy is the carried state as it is now (`cycle_memory`): every timed
        # cycle starts from the same.
        given = copy.copy(carried)
        started = time.process_time()
        if collector == "cycle":  # as the service runs a cycle (`gc_tuning.collector_paused`)
            gc.disable()
        state: Any = None
        if phased:
            state = CycleState(snapshot, given) if given is not None else CycleState(snapshot)
            times.update(run_phases(cycle, state))
        elif given is not None:
            run_cycle(snapshot, given)
        else:
            run_cycle(snapshot)
        if collector == "cycle":
            # The cycle's state freed (as `run_cycle` frees it on returning), then the pass.
            phase_started = time.process_time()
            state = None
            gc.enable()
            gc.collect(0)
            times["free, young pass"] = time.process_time() - phase_started
        times["total"] = time.process_time() - started
        print(json.dumps(times), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trees", required=True, help="checkout roots, comma-separated")
    parser.add_argument("--mix", default="steady")
    parser.add_argument("--size", type=int, default=1000)
    parser.add_argument("--cycles", type=int, default=6, help="timed cycles per checkout")
    parser.add_argument(
        "--gc",
        choices=("default", "cycle"),
        default="default",
        help="the collector as Python starts it, or paused for each cycle and one young pass "
        "after it, timed as its own row (as the service runs a cycle)",
    )
    parser.add_argument(
        "--carry",
        action="store_true",
        help="give each cycle the records the cycle before it loaded (cycle_memory), where a "
        "checkout has them",
    )
    parser.add_argument(
        "--queues", type=int, default=0, help="leaf queues of the pool (default: the benchmark's)"
    )
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.mix, args.size, args.gc, args.carry, args.queues)
        return
    trees = args.trees.split(",")
    workers = []
    for tree in trees:
        env = dict(os.environ, PYTHONPATH=str(Path(tree).resolve() / "service"))
        command = [sys.executable, __file__, "--worker", "--trees", tree]
        command += ["--mix", args.mix, "--size", str(args.size), "--gc", args.gc]
        command += ["--carry"] if args.carry else []
        command += ["--queues", str(args.queues)] if args.queues else []
        workers.append(
            subprocess.Popen(
                command, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
            )
        )
    decisions = {}
    carrying = {}
    for tree, process in zip(trees, workers, strict=True):
        assert process.stdout is not None
        ready = json.loads(process.stdout.readline())
        decisions[tree] = ready["decisions"]
        carrying[tree] = ready["carried"]
    samples: dict[str, dict[str, list[float]]] = {tree: {} for tree in trees}
    for _ in range(args.cycles):
        for tree, process in zip(trees, workers, strict=True):
            assert process.stdin is not None and process.stdout is not None
            process.stdin.write("cycle\n")
            process.stdin.flush()
            for phase, seconds in json.loads(process.stdout.readline()).items():
                samples[tree].setdefault(phase, []).append(seconds)
    for process in workers:
        assert process.stdin is not None
        process.stdin.close()
        process.wait()
    print(
        f"{args.mix}, {args.size:,} nodes"
        + (f", {args.queues:,} queues" if args.queues else "")
        + f", collector {args.gc}, {args.cycles} cycles each; "
        "decisions (binds / evictions / holds): "
        + "; ".join(f"{t}: {' / '.join(map(str, d))}" for t, d in decisions.items())
        + "; carried state: "
        + ", ".join(f"{t}: {'yes' if c else 'no'}" for t, c in carrying.items())
    )
    print()
    print("| phase | " + " | ".join(f"{tree} min / median" for tree in trees) + " | ratio of min |")
    print("|---|" + "---:|" * (len(trees) + 1))
    phases = [phase for phase in samples[trees[-1]] if max(samples[trees[-1]][phase]) >= 0.002]
    for phase in phases:
        cells = []
        for tree in trees:
            found = samples[tree].get(phase)
            cells.append("–" if not found else f"{min(found):.3f} / {statistics.median(found):.3f}")
        having = [tree for tree in trees if phase in samples[tree]]
        ratios = [
            f"{min(samples[tree][phase]) / min(samples[having[0]][phase]):.2f}"
            for tree in having[1:]
            if min(samples[having[0]][phase]) > 0
        ]
        print(f"| {phase} | " + " | ".join(cells) + " | " + " / ".join(ratios or ["–"]) + " |")


if __name__ == "__main__":
    main()
