"""Instructions and simulated last-level data misses inside chosen functions of one cycle, by
Valgrind's callgrind: which parts of a phase grow faster than the pool.

callgrind names the interpreter's C functions, not Python's: every Python function is inside
`_PyEval_EvalFrameDefault`. So each function named (`module:attribute`, or
`module:Class.method`) is called through a C function of its own, one nothing else in the
cycle calls (`_MARKERS`: `contextvars.Context.run`, a `functools.partial`, `sys.call_tracing`,
...), and that C function's inclusive counts are the named function's, every call of it
included. A module that took the function by `from ... import` is the one to name (the
attribute there is what its code calls). The wrappers add a few instructions per call.

The measured cycle is the scrambled, steady or next one `cycle_instructions.py --cache` counts: the
pool built and its warm-up cycles run with the instrumentation off, then one carried cycle inside
`operator.call`, collected there only, with the same cache simulation (a 32 KiB 8-way first level,
a 1 MiB 16-way last level): the driver both share, `callgrind_cycle.py`. Run from the repository
root, for a checkout at TREE:

    python bench/cycle_parts.py --tree TREE --size 4000 \\
        gpufair.domain.cycle:preempt gpufair.domain.cycle_preempt:select_victims \\
        gpufair.domain.cycle_preempt:_room_short gpufair.domain.cycle_preempt:commit

At most `len(_MARKERS)` functions at once. 1,000 nodes take about a minute and a half, 4,000
nodes five minutes (bench/results/cycle.md, round 30).
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_cycle import QUEUES
from callgrind_cycle import ANNOTATED_NUMBER, child_code, run_measured

# Per marker, the C function callgrind names (inclusive counts read by that name).
_MARKERS = [
    "context_run",
    "partial_vectorcall",
    "sys_call_tracing",
    "methodcaller_call",
    "starmap_next",
    "functools_reduce",
    "dropwhile_next",
]

# Each named function wrapped in its marker's C function, after the warm-up cycles
# (`callgrind_cycle.child_code`); the targets are the child's arguments after the prelude's.
_CHILD = child_code(
    "operator.call(run_cycle, snapshot, given)",
    imports=["contextvars", "functools", "importlib", "itertools"],
    prepare="""
def via(marker, function):
    if marker == "context_run":
        return lambda *a, **k: contextvars.copy_context().run(function, *a, **k)
    if marker == "partial_vectorcall":
        bound = functools.partial(function)
        return lambda *a, **k: bound(*a, **k)
    if marker == "sys_call_tracing":
        return lambda *a, **k: sys.call_tracing(lambda: function(*a, **k), ())
    if marker == "methodcaller_call":
        return lambda *a, **k: operator.methodcaller("__call__", *a, **k)(function)
    if marker == "starmap_next":
        return lambda *a, **k: next(itertools.starmap(lambda: function(*a, **k), [()]))
    if marker == "functools_reduce":
        return lambda *a, **k: functools.reduce(lambda _, __: function(*a, **k), [0], None)

    def dropped(*a, **k):
        box = []
        next(itertools.dropwhile(lambda _: box.append(function(*a, **k)), [0]), None)
        return box[0]

    return dropped


for spec in sys.argv[5:]:
    marker, target = spec.split("=", 1)
    module, path = target.split(":")
    owner = importlib.import_module(module)
    *outer, name = path.split(".")
    for part in outer:
        owner = getattr(owner, part)
    setattr(owner, name, via(marker, getattr(owner, name)))
""",
)


def counts(tree: str, mix: str, size: int, targets: list[str]) -> dict[str, tuple[int, int]]:
    """Per target (and "cycle", the whole measured cycle), its inclusive instructions and
    last-level data misses (reads + writes)."""
    specs = [f"{marker}={target}" for marker, target in zip(_MARKERS, targets, strict=False)]
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "callgrind.out"
        run_measured(tree, _CHILD, mix, size, QUEUES, out, argv=specs)
        annotated = subprocess.run(
            [
                "callgrind_annotate",
                "--inclusive=yes",
                "--show=Ir,DLmr,DLmw",
                "--threshold=100",
                str(out),
            ],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    found: dict[str, tuple[int, int]] = {}
    names = {marker: target for marker, target in zip(_MARKERS, targets, strict=False)}
    names["_operator_call"] = "cycle"
    for line in annotated.splitlines():
        row = re.match(r"\s*" + ANNOTATED_NUMBER * 3 + r"(\S.*)$", line)
        if row is None:
            continue
        function = row.group(4).split(" [")[0].rsplit(":", 1)[-1]
        label = names.get(function)
        if label is None:
            continue
        ir, read, write = (
            0 if cell == "." else int(cell.replace(",", "")) for cell in row.groups()[:3]
        )
        # A function's lines may be listed under several files: the largest is its own.
        if ir > found.get(label, (0, 0))[0]:
            found[label] = (ir, read + write)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", default=".", help="a checkout")
    parser.add_argument("--mix", default="scrambled", choices=("steady", "next", "scrambled"))
    parser.add_argument("--size", type=int, default=1000, help="nodes")
    parser.add_argument("targets", nargs="+", help="module:function or module:Class.method")
    args = parser.parse_args()
    if len(args.targets) > len(_MARKERS):
        parser.error(f"at most {len(_MARKERS)} functions at once")
    found = counts(args.tree, args.mix, args.size, args.targets)
    print("| part | instructions (M) | LL misses (k) |")
    print("|---|---:|---:|")
    for label in ["cycle", *args.targets]:
        ir, misses = found.get(label, (0, 0))
        print(f"| {label} | {ir / 1e6:.1f} | {misses / 1e3:.1f} |")


if __name__ == "__main__":
    main()
