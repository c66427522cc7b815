"""The cycle benchmark for several checkouts side by side, in one run: each round runs
`bench_cycle.py --json` once per checkout, one after the other, so all of them see the same
machine load; medians are taken over every cycle of every round.

Run from the repository root, e.g. the code before issue 14, main, and this checkout:

    python bench/compare_cycle.py --trees OLD,MAIN,. --mix steady,next,scrambled --sizes 1000,4000

Each checkout's code is imported from `TREE/service`; the pools are built by this checkout's
`bench_cycle.py`, so every version decides over the same snapshots. Prints one Markdown row per
mix, size and checkout: wall and CPU medians, and each median's ratio to the first checkout's.

A checkout written `TREE@PYTHON` runs under that interpreter (one with this project's
dependencies, e.g. a virtual environment's `bin/python`) instead of the one running this script:
the same code on two builds of Python, side by side, e.g. `--trees .,.@OTHER_VENV/bin/python`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import cast

BENCH = Path(__file__).resolve().parent / "bench_cycle.py"


def run(tree: str, mix: str, size: int, repeats: int, gc: str, carry: bool) -> dict[str, object]:
    """One `bench_cycle.py --json` run of the checkout `tree` (`TREE` or `TREE@PYTHON`)."""
    root, _, python = tree.partition("@")
    env = dict(os.environ, PYTHONPATH=str(Path(root).resolve() / "service"))
    command = [python or sys.executable, str(BENCH), "--json", "--mix", mix, "--sizes", str(size)]
    command += ["--repeats", str(repeats), "--gc", gc] + (["--carry"] if carry else [])
    output = subprocess.run(command, env=env, check=True, capture_output=True, text=True).stdout
    line: dict[str, object] = json.loads(output.strip().splitlines()[-1])
    return line


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trees", required=True, help="checkout roots, comma-separated")
    parser.add_argument("--mix", default="steady,next,scrambled")
    parser.add_argument("--sizes", default="1000,4000")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of one run per checkout")
    parser.add_argument("--repeats", type=int, default=3, help="timed cycles per run")
    parser.add_argument(
        "--gc",
        choices=("default", "serve", "cycle"),
        default="default",
        help="the collector as bench_cycle.py's --gc sets it (cycle: as the service runs one)",
    )
    parser.add_argument(
        "--carry",
        action="store_true",
        help="bench_cycle.py --carry: each cycle given the records the one before loaded "
        "(where a checkout has them; the table says which)",
    )
    args = parser.parse_args()
    trees = args.trees.split(",")
    print(
        "| mix | nodes | code | cycles | wall median s | CPU median s | CPU ratio | wall ratio "
        "| binds / evictions / holds |"
    )
    print("|---|---:|---|---:|---:|---:|---:|---:|---|")
    for mix in args.mix.split(","):
        for size in (int(s) for s in args.sizes.split(",")):
            wall: dict[str, list[float]] = {tree: [] for tree in trees}
            cpu: dict[str, list[float]] = {tree: [] for tree in trees}
            decisions: dict[str, list[int]] = {}
            carried: dict[str, bool] = {}
            for _ in range(args.rounds):
                for tree in trees:
                    line = run(tree, mix, size, args.repeats, args.gc, args.carry)
                    wall[tree] += line["wall_s"]  # type: ignore[arg-type]
                    cpu[tree] += line["cpu_s"]  # type: ignore[arg-type]
                    decisions[tree] = cast(list[int], line["decisions"])
                    carried[tree] = bool(line.get("carried"))
            first_cpu = statistics.median(cpu[trees[0]])
            first_wall = statistics.median(wall[trees[0]])
            for tree in trees:
                cpu_median = statistics.median(cpu[tree])
                wall_median = statistics.median(wall[tree])
                binds, evicts, holds = decisions[tree]
                print(
                    f"| {mix} | {size:,} | {tree}{' (carried)' if carried[tree] else ''} "
                    f"| {len(cpu[tree])} | {wall_median:.3f} | "
                    f"{cpu_median:.3f} | {cpu_median / first_cpu:.2f} | "
                    f"{wall_median / first_wall:.2f} | {binds:,} / {evicts:,} / {holds:,} |",
                    flush=True,
                )


if __name__ == "__main__":
    main()
