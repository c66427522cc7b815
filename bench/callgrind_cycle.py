"""One measured cycle under Valgrind's callgrind with its cache simulation: the driver shared by
`cycle_instructions.py --cache` and `cycle_parts.py`.

A child builds the benchmark's pool (`bench_cycle.build_snapshot`) and runs its warm-up cycles
with callgrind's instrumentation off (a 4,000-node pool is built in minutes instead of an hour),
then says it is ready (its pid in a file) and waits; the parent turns the instrumentation on
(`callgrind_control -i on`) and lets it go. Only what runs inside `operator.call` is collected,
with a simulated 32 KiB 8-way first-level data cache and a 1 MiB 16-way last level (the size of
this machine's L2 per core). The collector is off in the child and string hashes are fixed
(`PYTHONHASHSEED=0`), so the same code counts the same.

The measured part is the caller's (`child_code`'s `measured`, calling `operator.call` itself);
the counts are read from callgrind's output file by the caller.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

BENCH = str(Path(__file__).resolve().parent)

# callgrind's options: instrumentation off until the parent turns it on, the cache simulation,
# and collection inside `operator.call` only.
CACHE_OPTIONS = [
    "--tool=callgrind",
    "--instr-atstart=no",
    "--cache-sim=yes",
    "--D1=32768,8,64",
    "--LL=1048576,16,64",
    "--collect-atstart=no",
    "--toggle-collect=_operator_call",
]

# A count in `callgrind_annotate`'s listing: digits with commas or ".", and maybe a percentage.
ANNOTATED_NUMBER = r"([\d,]+|\.)\s+(?:\([^)]*\)\s+)?"

# `warm_up`'s code; `{arguments}` is the child's line that sets `mix`, `size` and `queues`.
_WARM_UP = """
gc.disable()
sys.path.insert(0, {bench!r})
from bench_cycle import build_snapshot, next_snapshot
from gpufair.domain.cycle import run_cycle
from gpufair.domain.cycle_memory import CarriedLoad
{arguments}
snapshot = build_snapshot(size, scrambled=mix == "scrambled", queues=queues)
carried = CarriedLoad()
first = run_cycle(snapshot, carried)
if mix == "next":
    snapshot = next_snapshot(snapshot, first)
else:
    run_cycle(snapshot, carried)
"""

# The child's arguments: mix, nodes, leaf queues, the folder of the handshake's files, then the
# caller's (`sys.argv[5:]`). `given` is the carried records the measured cycle is given.
_ARGUMENTS = (
    "mix, size, queues, folder = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]"
)


def warm_up(arguments: str) -> str:
    """A child's code from its `gc.disable()` to the pool the measured cycle runs on, after the
    warm-up cycles (`steady` and `scrambled`: two cycles, the second given the records of the
    first; `next`: one cycle, then the next snapshot): it leaves `snapshot`, `carried` (the
    records the measured cycle is given a copy of) and `run_cycle`. `arguments` is the child's
    line that sets `mix`, `size` and `queues` from its arguments (after the imports, before the
    pool is built). The child has imported `copy`, `gc` and `sys`. Shared by this driver's child
    and `cycle_instructions.py`'s plain cachegrind child, so both count the same cycle."""
    return _WARM_UP.format(bench=BENCH, arguments=arguments)


_HANDSHAKE = """
with open(os.path.join(folder, "ready.tmp"), "w") as out:
    out.write(str(os.getpid()))
os.rename(os.path.join(folder, "ready.tmp"), os.path.join(folder, "ready"))
while not os.path.exists(os.path.join(folder, "go")):
    time.sleep(0.2)
"""


def child_code(measured: str, *, prepare: str = "", imports: Sequence[str] = ()) -> str:
    """The child's code: the pool and its warm-up cycles (`steady` and `scrambled`: a cycle
    given the records of the warm-up cycle; `next`: the next cycle given the steady one's),
    then `prepare` (uninstrumented), the handshake, and `measured`. `imports`: modules imported
    beside the prelude's."""
    extra = "".join(f", {name}" for name in imports)
    return (
        f"\nimport copy, gc, operator, os, sys, time{extra}"
        + warm_up(_ARGUMENTS)
        + "given = copy.copy(carried)\n"
        + prepare.strip("\n")
        + "\n"
        + _HANDSHAKE
        + measured.strip("\n")
        + "\n"
    )


def run_measured(
    tree: str,
    code: str,
    mix: str,
    size: int,
    queues: int,
    out: Path,
    *,
    options: Sequence[str] = (),
    argv: Sequence[str] = (),
) -> None:
    """Run `code` (`child_code`'s) under callgrind with the code of the checkout at `tree`,
    writing its counts to `out` (and, with `--dump-after` among `options`, to `out.N`). The
    handshake's files are made beside `out`."""
    folder = out.parent
    command = [
        "valgrind",
        *CACHE_OPTIONS,
        *options,
        f"--callgrind-out-file={out}",
        sys.executable,
        "-c",
        code,
        mix,
        str(size),
        str(queues),
        str(folder),
        *argv,
    ]
    env = dict(os.environ, PYTHONPATH=str(Path(tree).resolve() / "service"), PYTHONHASHSEED="0")
    with subprocess.Popen(
        command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    ) as child:
        ready = folder / "ready"
        while not ready.exists():
            if child.poll() is not None:
                _, stderr = child.communicate()
                raise RuntimeError(f"the child ended before its cycle: {stderr[-500:]}")
            time.sleep(0.5)
        subprocess.run(
            ["callgrind_control", "-i", "on", ready.read_text()],
            check=True,
            capture_output=True,
        )
        (folder / "go").touch()
        _, stderr = child.communicate()
        if child.returncode:
            raise RuntimeError(f"valgrind failed: {stderr[-500:]}")
