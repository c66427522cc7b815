"""Instructions one cycle takes, counted by Valgrind's cachegrind: a measure the machine's load
does not move (whole-cycle times here vary by 15 % between runs of the same code).

A child runs the benchmark's pool (`bench_cycle.build_snapshot`) to just before the measured
cycle, under `valgrind --tool=cachegrind --cache-sim=no`, once with that cycle and once
without; the difference is the cycle's instructions. `steady`: one steady cycle given the
records of the warm-up cycle (`cycle_memory`); `next`: one next cycle given the steady cycle's
records, as `bench_cycle.py --carry` times them; `scrambled`: as `steady`, on the scrambled
pool (`build_snapshot(scrambled=True)`). The collector is off in the child (the
service pauses it for a cycle) and string hashes are fixed (`PYTHONHASHSEED=0`), so the same
code counts the same.

Run from the repository root, for the code of a checkout at `TREE` (several: side by side):

    python bench/cycle_instructions.py --trees TREE[,TREE...] --mix steady,next --size 1000

Needs `valgrind` (Debian package `valgrind`). 1,000 nodes take about 3 minutes per checkout.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

_CHILD = """
import copy, gc, sys
gc.disable()
sys.path.insert(0, {bench!r})
from bench_cycle import build_snapshot, next_snapshot
from gpufair.domain.cycle import run_cycle
from gpufair.domain.cycle_memory import CarriedLoad
mix, size, measured = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1"
snapshot = build_snapshot(size, scrambled=mix == "scrambled")
carried = CarriedLoad()
first = run_cycle(snapshot, carried)
if mix == "next":
    snapshot = next_snapshot(snapshot, first)
else:
    run_cycle(snapshot, carried)
if measured:
    run_cycle(snapshot, copy.copy(carried))
"""


def instructions(tree: str, mix: str, size: int, measured: bool) -> int:
    """Instructions of the whole child process (`measured`: with the cycle)."""
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "cachegrind.out"
        done = subprocess.run(
            [
                "valgrind",
                "--tool=cachegrind",
                "--cache-sim=no",
                f"--cachegrind-out-file={out}",
                sys.executable,
                "-c",
                _CHILD.format(bench=str(Path(__file__).resolve().parent)),
                mix,
                str(size),
                "1" if measured else "0",
            ],
            env=dict(
                os.environ,
                PYTHONPATH=str(Path(tree).resolve() / "service"),
                PYTHONHASHSEED="0",
            ),
            capture_output=True,
            text=True,
            check=True,
        )
        found = re.search(r"I\s+refs:\s+([\d,]+)", done.stderr)
        if found is None:
            raise RuntimeError(f"no instruction count from valgrind: {done.stderr[-500:]}")
        return int(found.group(1).replace(",", ""))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trees", default=".", help="checkouts, comma-separated")
    parser.add_argument("--mix", default="steady,next", help="steady, next and/or scrambled")
    parser.add_argument("--size", type=int, default=1000, help="nodes")
    args = parser.parse_args()
    trees = args.trees.split(",")
    for tree in trees:
        if not (Path(tree) / "service" / "gpufair" / "domain" / "cycle.py").is_file():
            parser.error(f"{tree}: no service/gpufair/domain/cycle.py there")
    print("| checkout | mix | nodes | instructions (G) | of the first |")
    print("|---|---|---:|---:|---:|")
    for mix in args.mix.split(","):
        first = 0
        for tree in trees:
            count = instructions(tree, mix, args.size, True) - instructions(
                tree, mix, args.size, False
            )
            first = first or count
            print(
                f"| {tree} | {mix} | {args.size:,} | {count / 1e9:.4f} | {count / first:.3f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
