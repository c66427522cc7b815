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

With `--cache` the measured cycle's memory traffic is counted too: callgrind with its cache
simulation (`--cache-sim=yes`, a 32 KiB 8-way first-level data cache and a 1 MiB 16-way last level,
the size of this machine's L2 per core), the instrumentation off while the pool is built and the
warm-up cycles run (`callgrind_control -i on` just before the measured cycle: a 4,000-node pool is
built in minutes instead of an hour), collecting inside the cycle's `operator.call` only (the
driver `callgrind_cycle.py`, shared with `cycle_parts.py`). It prints the cycle's instructions,
first-level data misses (reads + writes) and last-level data misses beside the first checkout's;
`--top N` lists the N functions of the interpreter with the most last-level misses in the last
count. The first level starts cold (a few thousand lines: nothing beside tens of millions of
misses).

With `--cache --by-phase` the measured cycle is run phase by phase as `run_cycle` runs them
(`pair_cycle.PHASES`): the state's construction, each phase, the result and the state's release
each inside its own `operator.call`, callgrind writing its counts after each call
(`--dump-after`), so each part's instructions and misses are printed, and their growth from one
pool size to another can be read part by part.

Run from the repository root, for the code of a checkout at `TREE` (several: side by side):

    python bench/cycle_instructions.py --trees TREE[,TREE...] --mix steady,next --size 1000
    python bench/cycle_instructions.py --mix scrambled --size 4000 --phase reclaim
    python bench/cycle_instructions.py --mix steady --size 4000 --queues 800
    python bench/cycle_instructions.py --trees TREE --mix scrambled --size 4000 --cache --top 20
    python bench/cycle_instructions.py --trees TREE --mix scrambled --size 4000 --cache --by-phase

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
from callgrind_cycle import ANNOTATED_NUMBER, child_code, run_measured, warm_up
from pair_cycle import PHASES

# The pool and its warm-up cycles (`callgrind_cycle.warm_up`, as `--cache` runs them), then the
# measured cycle when the third argument is "1".
_CHILD = (
    "\nimport copy, gc, sys"
    + warm_up(
        'mix, size, measured, queues = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1", '
        "int(sys.argv[5])"
    )
    + """if measured:
    run_cycle(snapshot, copy.copy(carried))
"""
)

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


# The measured cycle inside `operator.call` (`callgrind_cycle`'s child, once the parent has turned
# the instrumentation on); phase by phase when the child's last argument is "1".
_CACHED = child_code(
    """
if sys.argv[5] == "1":  # phase by phase, each inside its own call (a dump after each)
    from gpufair.domain import cycle
    from gpufair.domain.cycle_state import CycleState
    from pair_cycle import PHASES
    box = [operator.call(CycleState, snapshot, given)]
    for name, kwargs in PHASES:
        operator.call(getattr(cycle, name), box[0], **kwargs)
    result = operator.call(box[0].result)
    operator.call(box.clear)  # the state freed, as `run_cycle`'s return frees it
else:
    operator.call(run_cycle, snapshot, given)
"""
)

# The labels of `--by-phase`'s counts, in the order of the calls that `_CACHED` makes.
_PHASE_LABELS = [
    "state",
    *(
        f"{name} beyond share" if kwargs.get("within_share") is False else name
        for name, kwargs in PHASES
    ),
    "result",
    "free",
]

# callgrind's event names for the counts printed: instructions, data misses per level.
_EVENTS = {"Ir": ("Ir",), "D1": ("D1mr", "D1mw"), "LL": ("DLmr", "DLmw")}


def cache_counts(
    tree: str, mix: str, size: int, queues: int, top: int, by_phase: bool = False
) -> dict[str, int]:
    """The measured cycle's instructions and data misses (`_EVENTS`), simulated by callgrind
    with the instrumentation turned on just before it; with `top`, the functions with the most
    last-level data misses are printed. `by_phase`: the cycle is run phase by phase as
    `run_cycle` runs them (the state's construction, each phase, the result and the state's
    release each in its own `operator.call`, callgrind dumping its counts after each), and
    each part's counts are printed, labelled (`_PHASE_LABELS`)."""
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "callgrind.out"
        run_measured(
            tree,
            _CACHED,
            mix,
            size,
            queues,
            out,
            options=["--dump-after=_operator_call"] if by_phase else [],
            argv=["1" if by_phase else "0"],
        )
        if by_phase:
            return _print_parts(out)
        found = _totals(out)
        if top:
            _print_top(out, top)
        return {name: sum(found[event] for event in parts) for name, parts in _EVENTS.items()}


def _totals(out: Path) -> dict[str, int]:
    """The event totals of callgrind's file `out`."""
    text = out.read_text()
    events = re.search(r"^events:\s+(.+)$", text, re.MULTILINE)
    totals = re.search(r"^totals:\s+(.+)$", text, re.MULTILINE)
    if events is None or totals is None:
        raise RuntimeError(f"no totals in {out.name}")
    return dict(zip(events.group(1).split(), map(int, totals.group(1).split()), strict=True))


def _print_parts(out: Path) -> dict[str, int]:
    """`--by-phase`: the counts of each dump callgrind made after an `operator.call` (files
    `out.N`, in order; the last, at exit, is empty), labelled; their sum is returned."""
    parts = sorted(out.parent.glob(out.name + ".*"), key=lambda path: int(path.suffix[1:]))
    counted = [_totals(path) for path in parts][: len(_PHASE_LABELS)]
    if len(counted) != len(_PHASE_LABELS):
        raise RuntimeError(f"{len(counted)} dumps for {len(_PHASE_LABELS)} calls")
    print("| part | instructions (M) | D1 misses (k) | LL misses (k) |")
    print("|---|---:|---:|---:|")
    summed = dict.fromkeys(_EVENTS, 0)
    for label, found in zip(_PHASE_LABELS, counted, strict=True):
        counts = {name: sum(found[event] for event in e) for name, e in _EVENTS.items()}
        for name in summed:
            summed[name] += counts[name]
        print(
            f"| {label} | {counts['Ir'] / 1e6:.1f} | {counts['D1'] / 1e3:.0f} "
            f"| {counts['LL'] / 1e3:.1f} |"
        )
    return summed


def _print_top(out: Path, top: int) -> None:
    """The `top` functions of callgrind's file `out` with the most last-level data misses
    (reads + writes), each with its instructions and first-level misses (exclusive counts)."""
    annotated = subprocess.run(
        ["callgrind_annotate", "--show=Ir,D1mr,D1mw,DLmr,DLmw", "--threshold=100", str(out)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    rows: dict[str, list[int]] = {}
    for line in annotated.splitlines():
        found = re.match(r"\s*" + ANNOTATED_NUMBER * 5 + r"(\S.*)$", line)
        if found is None or "PROGRAM TOTALS" in line:
            continue
        values = [0 if cell == "." else int(cell.replace(",", "")) for cell in found.groups()[:5]]
        # One row per function: its recursion levels (name'2) and its files' paths merged.
        name = re.sub(r"'\d+", "", found.group(6).split(" [")[0]).rsplit("/", 1)[-1]
        summed = rows.setdefault(name, [0] * 5)
        for position, value in enumerate(values):
            summed[position] += value
    ranked = sorted(rows.items(), key=lambda row: -(row[1][3] + row[1][4]))[:top]
    print("| function | instructions (M) | D1 misses (k) | LL misses (k) |")
    print("|---|---:|---:|---:|")
    for name, (ir, d1r, d1w, llr, llw) in ranked:
        print(f"| {name} | {ir / 1e6:.1f} | {(d1r + d1w) / 1e3:.0f} | {(llr + llw) / 1e3:.1f} |")


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
        code = _CHILD + _PHASED
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
        code = _CHILD
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
    parser.add_argument(
        "--cache",
        action="store_true",
        help="count the whole cycle's data cache misses too (callgrind's cache simulation)",
    )
    parser.add_argument(
        "--top", type=int, default=0, help="with --cache: the functions with most LL misses"
    )
    parser.add_argument(
        "--by-phase",
        action="store_true",
        help="with --cache: the counts of each phase (the cycle run phase by phase)",
    )
    args = parser.parse_args()
    trees = args.trees.split(",")
    for tree in trees:
        if not (Path(tree) / "service" / "gpufair" / "domain" / "cycle.py").is_file():
            parser.error(f"{tree}: no service/gpufair/domain/cycle.py there")
    if args.cache:
        if args.phase:
            parser.error("--cache counts the whole cycle: no --phase")
        _print_cache(trees, args.mix.split(","), args.size, args.queues, args.top, args.by_phase)
        return
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


def _print_cache(
    trees: list[str], mixes: list[str], size: int, queues: int, top: int, by_phase: bool
) -> None:
    """`--cache`: per mix and checkout, the cycle's counts (`cache_counts`) and their ratios
    to the first checkout's."""
    print("| checkout | mix | nodes | queues | instructions (G) | D1 misses (M) | LL misses (M) |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for mix in mixes:
        first: dict[str, int] = {}
        for tree in trees:
            counts = cache_counts(tree, mix, size, queues, top, by_phase)
            first = first or counts
            ratios = {name: counts[name] / first[name] if first[name] else 0.0 for name in counts}
            print(
                f"| {tree} | {mix} | {size:,} | {queues:,} "
                f"| {counts['Ir'] / 1e9:.4f} ({ratios['Ir']:.3f}) "
                f"| {counts['D1'] / 1e6:.3f} ({ratios['D1']:.3f}) "
                f"| {counts['LL'] / 1e6:.3f} ({ratios['LL']:.3f}) |",
                flush=True,
            )


if __name__ == "__main__":
    main()
