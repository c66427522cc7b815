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

With `--phase NAME` (a phase of `pair_cycle.PHASES`, such as `reclaim` or `preempt`) only that
phase of the measured cycle is counted: the cycle is run phase by phase as `run_cycle` runs them,
that phase called through `operator.call`, under `valgrind --tool=callgrind` collecting only
inside that call; one child per count, none without the cycle. `--queues` sets the pool's leaf
queues (`bench_cycle.build_snapshot`'s; 200 unless given), as `cycle_scaling.py` grows them with
the pool.

Run from the repository root, for the code of a checkout at `TREE` (several: side by side):

    python bench/cycle_instructions.py --trees TREE[,TREE...] --mix steady,next --size 1000
    python bench/cycle_instructions.py --mix scrambled --size 4000 --phase reclaim
    python bench/cycle_instructions.py --mix steady --size 4000 --queues 800

Needs `valgrind` (Debian package `valgrind`). 1,000 nodes take 1.5-3 minutes per checkout,
by the machine's speed (`--phase`, one child: half of that); 4,000 nodes, 3.5 times as long.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_cycle import QUEUES
from pair_cycle import PHASES

_CHILD = """
import copy, gc, sys
gc.disable()
sys.path.insert(0, {bench!r})
from bench_cycle import build_snapshot, next_snapshot
from gpufair.domain.cycle import run_cycle
from gpufair.domain.cycle_memory import CarriedLoad
mix, size, measured, queues = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1", int(sys.argv[5])
snapshot = build_snapshot(size, scrambled=mix == "scrambled", queues=queues)
carried = CarriedLoad()
first = run_cycle(snapshot, carried)
if mix == "next":
    snapshot = next_snapshot(snapshot, first)
else:
    run_cycle(snapshot, carried)
if measured:
    run_cycle(snapshot, copy.copy(carried))
"""

# The measured cycle phase by phase, `phase` alone inside `operator.call` (what callgrind collects).
_PHASED = """
import operator
from gpufair.domain import cycle
from gpufair.domain.cycle_state import CycleState
from pair_cycle import PHASES
phase = sys.argv[4]
state = CycleState(snapshot, copy.copy(carried))
for name, kwargs in PHASES:
    if name == phase:
        operator.call(getattr(cycle, name), state, **kwargs)
    else:
        getattr(cycle, name)(state, **kwargs)
state.result()
"""


def _child(tree: str, tool: list[str], code: str, argv: list[str]) -> str:
    """Run `code` under valgrind with `tool`'s options and `argv`, with `tree`'s code, the
    hashes fixed; its standard error (valgrind's summary)."""
    done = subprocess.run(
        ["valgrind", *tool, sys.executable, "-c", code, *argv],
        env=dict(os.environ, PYTHONPATH=str(Path(tree).resolve() / "service"), PYTHONHASHSEED="0"),
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stderr


def phase_instructions(tree: str, mix: str, size: int, phase: str, queues: int) -> int:
    """Instructions inside `phase` of the measured cycle (every call of it, as `run_cycle` makes
    them: `allocate` is called twice)."""
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "callgrind.out"
        tool = [
            "--tool=callgrind",
            "--collect-atstart=no",
            "--toggle-collect=_operator_call",
            f"--callgrind-out-file={out}",
        ]
        code = _CHILD.format(bench=str(Path(__file__).resolve().parent)) + _PHASED
        _child(tree, tool, code, [mix, str(size), "0", phase, str(queues)])
        found = re.search(r"^summary:\s+(\d+)", out.read_text(), re.MULTILINE)
        if found is None:
            raise RuntimeError(f"no instruction count in {out.name}")
        return int(found.group(1))


def instructions(tree: str, mix: str, size: int, measured: bool, queues: int) -> int:
    """Instructions of the whole child process (`measured`: with the cycle)."""
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "cachegrind.out"
        tool = ["--tool=cachegrind", "--cache-sim=no", f"--cachegrind-out-file={out}"]
        code = _CHILD.format(bench=str(Path(__file__).resolve().parent))
        stderr = _child(
            tree, tool, code, [mix, str(size), "1" if measured else "0", "", str(queues)]
        )
        found = re.search(r"I\s+refs:\s+([\d,]+)", stderr)
        if found is None:
            raise RuntimeError(f"no instruction count from valgrind: {stderr[-500:]}")
        return int(found.group(1).replace(",", ""))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trees", default=".", help="checkouts, comma-separated")
    parser.add_argument("--mix", default="steady,next", help="steady, next and/or scrambled")
    parser.add_argument("--size", type=int, default=1000, help="nodes")
    parser.add_argument(
        "--phase",
        default="",
        choices=["", *dict.fromkeys(name for name, _ in PHASES)],
        help="count this phase of the cycle alone",
    )
    parser.add_argument("--queues", type=int, default=QUEUES, help="leaf queues of the pool")
    args = parser.parse_args()
    trees = args.trees.split(",")
    for tree in trees:
        if not (Path(tree) / "service" / "gpufair" / "domain" / "cycle.py").is_file():
            parser.error(f"{tree}: no service/gpufair/domain/cycle.py there")
    label = f" ({args.phase})" if args.phase else ""
    print(f"| checkout | mix | nodes | queues | instructions{label} (G) | of the first |")
    print("|---|---|---:|---:|---:|---:|")
    for mix in args.mix.split(","):
        first = 0
        for tree in trees:
            if args.phase:
                count = phase_instructions(tree, mix, args.size, args.phase, args.queues)
            else:
                count = instructions(tree, mix, args.size, True, args.queues) - instructions(
                    tree, mix, args.size, False, args.queues
                )
            first = first or count
            print(
                f"| {tree} | {mix} | {args.size:,} | {args.queues:,} | {count / 1e9:.4f} "
                f"| {count / first:.3f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
