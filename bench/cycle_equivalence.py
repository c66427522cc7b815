"""Are two versions of the cycle's code deciding the same? Runs `run_cycle` over the benchmark's
pools (every mix, several sizes and seeds) with this checkout's code and with the code of another
checkout, and compares the `CycleResult`s field by field: binds, evictions, pending reasons,
reservations and queue summaries, floats bit for bit (by `repr`).

Run from the repository root:

    PYTHONPATH=service python bench/cycle_equivalence.py --reference OTHER_CHECKOUT

The reference checkout runs in a child process (`PYTHONPATH=OTHER_CHECKOUT/service`), with this
file's pools, so both versions see the same snapshots. Exit status 1 on the first difference.
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

from bench_cycle import build_snapshot, next_snapshot

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


def digests(cases: list[tuple[str, int, int]]) -> dict[str, dict[str, str]]:
    """Per case `mix/size/seed`, a digest of each field of its result."""
    out = {}
    for mix, size, seed in cases:
        snapshot = build_snapshot(size, scrambled=mix == "scrambled", seed=seed)
        if mix == "next":
            snapshot = next_snapshot(snapshot, run_cycle(snapshot))
        parts = _parts(run_cycle(snapshot))
        out[f"{mix}/{size}/{seed}"] = {
            name: hashlib.sha256(text.encode()).hexdigest() for name, text in parts.items()
        }
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
    parser.add_argument("--mix", default="steady,next,scrambled")
    parser.add_argument("--json", action="store_true", help="print the digests as JSON and stop")
    args = parser.parse_args()
    cases = _cases(args.sizes, args.seeds, args.mix)
    if args.json:
        print(json.dumps(digests(cases)))
        return
    if not args.reference:
        parser.error("--reference is required unless --json")
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
        ],
        env=env,
        check=True,
        capture_output=True,
        text=True,
    )
    theirs = json.loads(child.stdout)
    ours = digests(cases)
    differing = [
        f"{case}: {name}"
        for case, fields in ours.items()
        for name, digest in fields.items()
        if theirs[case][name] != digest
    ]
    for line in differing:
        print("differs:", line)
    print(f"{len(ours)} cases, {len(differing)} differing fields")
    sys.exit(1 if differing else 0)


if __name__ == "__main__":
    main()
