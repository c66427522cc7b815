"""Are two versions of the cycle's code deciding the same? Runs `run_cycle` over the benchmark's
pools (every mix, several sizes and seeds) with this checkout's code and with the code of another
checkout, and compares the `CycleResult`s field by field: binds, evictions, pending reasons,
reservations and queue summaries, floats bit for bit (by `repr`).

The mix `carried` is a chain as the service runs it: a steady cycle, then three next cycles,
each given the records the cycle before it loaded (`cycle_memory.CarriedLoad`) and each run
again without them; every cycle of the chain is compared with the reference's, and each carried
cycle with its own run without records (`carried/...: next2 carried != uncarried`).

Run from the repository root:

    PYTHONPATH=service python bench/cycle_equivalence.py --reference OTHER_CHECKOUT

The reference checkout runs in a child process (`PYTHONPATH=OTHER_CHECKOUT/service`), with this
file's pools, so both versions see the same snapshots. Exit status 1 on the first difference.
`--queues N` builds the pools with N leaf queues instead of the benchmark's 200.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_cycle import QUEUES, build_snapshot, next_snapshot

from gpufair.domain.cycle import run_cycle
from gpufair.domain.snapshot import CycleResult


def _parts(result: CycleResult) -> dict[str, str]:
    """Each field of the result as one canonical text (mappings in key order)."""
    return {
        "binds": repr(result.binds),
        "evicts": repr(result.evicts),
        "pending": repr(sorted(result.pending.items())),
        "reservations": repr(result.reservations),
        "queues": repr(sorted(result.queues.items())),
    }


def _digest(result: CycleResult) -> dict[str, str]:
    return {
        name: hashlib.sha256(text.encode()).hexdigest() for name, text in _parts(result).items()
    }


def _chain(size: int, seed: int, queues: int) -> dict[str, str]:
    """The `carried` mix: a digest of each field of each cycle of the chain, and a mark of
    each carried cycle that decided otherwise than the same cycle without records."""
    from gpufair.domain.cycle_memory import CarriedLoad

    carried = CarriedLoad()
    snapshot = build_snapshot(size, seed=seed, queues=queues)
    out: dict[str, str] = {}
    for step in ("steady", "next1", "next2", "next3"):
        result = run_cycle(snapshot, carried)
        fields = _digest(result)
        out |= {f"{step} {name}": digest for name, digest in fields.items()}
        if fields != _digest(run_cycle(snapshot)):
            out[f"{step} carried != uncarried"] = "differs"
        snapshot = next_snapshot(snapshot, result)
    return out


def digests(cases: list[tuple[str, int, int]], queues: int = QUEUES) -> dict[str, dict[str, str]]:
    """Per case `mix/size/seed`, a digest of each field of its result (pools of `queues` leaf
    queues)."""
    out = {}
    for mix, size, seed in cases:
        if mix == "carried":
            out[f"{mix}/{size}/{seed}"] = _chain(size, seed, queues)
            continue
        snapshot = build_snapshot(size, scrambled=mix == "scrambled", seed=seed, queues=queues)
        if mix == "next":
            snapshot = next_snapshot(snapshot, run_cycle(snapshot))
        out[f"{mix}/{size}/{seed}"] = _digest(run_cycle(snapshot))
    return out


def _cases(sizes: str, seeds: int, mixes: str) -> list[tuple[str, int, int]]:
    return [
        (mix, int(size), seed)
        for mix in mixes.split(",")
        for size in sizes.split(",")
        for seed in range(1, seeds + 1)
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reference", help="root of the checkout to compare with")
    parser.add_argument("--sizes", default="100,300,1000", help="node counts, comma-separated")
    parser.add_argument("--seeds", type=int, default=3, help="seeds 1..N per mix and size")
    parser.add_argument("--mix", default="steady,next,scrambled", help="and/or carried")
    parser.add_argument("--queues", type=int, default=QUEUES, help="leaf queues per pool")
    parser.add_argument("--json", action="store_true", help="print the digests as JSON and stop")
    args = parser.parse_args()
    cases = _cases(args.sizes, args.seeds, args.mix)
    if args.json:
        print(json.dumps(digests(cases, args.queues)))
        return
    if not args.reference:
        parser.error("--reference is required unless --json")
    if not (Path(args.reference) / "service" / "gpufair" / "domain" / "cycle.py").is_file():
        # Else the child would import this checkout's code and compare it with itself.
        parser.error(f"--reference {args.reference}: no service/gpufair/domain/cycle.py there")
    env = dict(os.environ, PYTHONPATH=str(Path(args.reference) / "service"))
    child = subprocess.run(
        [
            sys.executable,
            __file__,
            "--json",
            "--sizes",
            args.sizes,
            "--seeds",
            str(args.seeds),
            "--mix",
            args.mix,
            "--queues",
            str(args.queues),
        ],
        env=env,
        check=True,
        capture_output=True,
        text=True,
    )
    theirs = json.loads(child.stdout)
    ours = digests(cases, args.queues)
    differing = [
        f"{case}: {name}"
        for case, fields in ours.items()
        for name, digest in fields.items()
        if theirs[case].get(name) != digest
    ]
    differing += [
        f"{case}: {name}"
        for case, fields in theirs.items()
        for name in fields
        if name not in ours[case]
    ]
    for line in differing:
        print("differs:", line)
    print(f"{len(ours)} cases, {len(differing)} differing fields")
    sys.exit(1 if differing else 0)


if __name__ == "__main__":
    main()
