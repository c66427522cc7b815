"""Simulator speed: wall seconds of `gpufair simulate` runs (the simulation itself, no files).

Run from the repository root:

    .venv/bin/python bench/bench_sim.py --trace-dir ../shared/traces/alibaba-gpu-2023

Cases:

- `week-100-gpus`: examples/scenarios/llm-vs-vision-week.yaml as written: 100 GPUs, 2 queues,
  one simulated week, a cycle and a fair-share recompute every 60 s, time-based (k = 1); and the
  same with classic fair share (k = 0).
- `alibaba-all-pods`: examples/scenarios/alibaba-trace-replay.yaml on every node of the trace
  (1,213 nodes, 6,212 GPUs) with all 8,152 pods (the 7,064 asking for GPUs are replayed),
  arrivals compressed 10 times as in the example: 15 simulated days, cycles every 60 s,
  recomputes every 5 minutes.
- `alibaba-uncompressed` (with `--uncompressed`): the same at the trace's own pace, 150 days.
- `alibaba-example` (k = 1 and k = 0): examples/scenarios/alibaba-trace-replay.yaml as written (30
  nodes, 157 GPUs, arrivals compressed 10 times, 15 days): the two runs of its `--compare`.

`--only CASE ...` runs only the cases whose label starts with one of the words given; run one case
per process to read its peak memory (the process's peak resident set, printed last, covers every
case the process ran). Wall and CPU seconds are those of the simulation alone.

The trace folder comes from --trace-dir, else $GPUFAIR_TRACE_DIR, else the scenario's
`../shared/traces/alibaba-gpu-2023` (relative to the current directory); without it the trace
cases are skipped. Results are recorded in bench/results/sim.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import resource
import sys
import time
from pathlib import Path
from typing import Any

import yaml

# Benchmark the code of this tree, whatever copy of gpufair the environment has installed.
REPOSITORY = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPOSITORY / "service"))

from gpufair.sim.engine import simulate  # noqa: E402
from gpufair.sim.scenario import Scenario, load_scenario, parse_scenario  # noqa: E402

EXAMPLES = REPOSITORY / "examples" / "scenarios"


def timed(label: str, scenario: Scenario, load_s: float = 0.0) -> dict[str, Any]:
    started = time.perf_counter()
    started_cpu = time.process_time()
    result = simulate(scenario)
    cpu_s = time.process_time() - started_cpu
    wall_s = time.perf_counter() - started
    pools = result.pools
    return {
        "case": label,
        "simulated_days": scenario.duration_s / 86_400.0,
        "gpus": sum(p.capacity_gpus for p in pools),
        "jobs": len(result.jobs),
        "cycles_run": sum(p.cycles_run for p in pools),
        "recomputes": sum(p.recomputes for p in pools),
        "load_s": load_s,
        "wall_s": wall_s,
        "cpu_s": cpu_s,
    }


def trace_scenario(
    trace_dir: Path | None, compression: float, days: float
) -> tuple[Scenario, float]:
    data = yaml.safe_load((EXAMPLES / "alibaba-trace-replay.yaml").read_text())
    del data["trace"]["node_count"]  # every node of the trace
    data["trace"]["time_compression"] = compression
    data["duration_s"] = days * 86_400.0
    started = time.perf_counter()
    scenario = parse_scenario(yaml.safe_dump(data), "alibaba", trace_dir=trace_dir)
    return scenario, time.perf_counter() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace-dir", type=Path, default=None)
    parser.add_argument("--uncompressed", action="store_true", help="also the 150-day replay")
    parser.add_argument("--only", nargs="*", default=None, help="labels starting with these")
    args = parser.parse_args()
    rows = []

    def wanted(label: str) -> bool:
        return args.only is None or any(label.startswith(word) for word in args.only)

    week = load_scenario(EXAMPLES / "llm-vs-vision-week.yaml")
    if wanted("week-100-gpus (k=1)"):
        rows.append(timed("week-100-gpus (k=1)", week))
    if wanted("week-100-gpus (k=0)"):
        classic = week.with_policy(lambda p: dataclasses.replace(p, k=0.0))
        rows.append(timed("week-100-gpus (k=0)", classic))
    trace_dir = args.trace_dir
    if trace_dir is None and os.environ.get("GPUFAIR_TRACE_DIR"):
        trace_dir = Path(os.environ["GPUFAIR_TRACE_DIR"])
    if trace_dir is None and Path("../shared/traces/alibaba-gpu-2023").is_dir():
        trace_dir = Path("../shared/traces/alibaba-gpu-2023")
    if trace_dir is None:
        print("no trace folder: trace cases skipped", file=sys.stderr)
    else:
        if wanted("alibaba-all-pods (10x)"):
            scenario, load_s = trace_scenario(trace_dir, compression=10.0, days=15.0)
            rows.append(timed("alibaba-all-pods (10x)", scenario, load_s))
        if args.uncompressed and wanted("alibaba-uncompressed"):
            scenario, load_s = trace_scenario(trace_dir, compression=1.0, days=150.5)
            rows.append(timed("alibaba-uncompressed", scenario, load_s))
        if wanted("alibaba-example (k=1)") or wanted("alibaba-example (k=0)"):
            started = time.perf_counter()
            example = load_scenario(EXAMPLES / "alibaba-trace-replay.yaml", trace_dir=trace_dir)
            load_s = time.perf_counter() - started
            if wanted("alibaba-example (k=1)"):
                rows.append(timed("alibaba-example (k=1)", example, load_s))
            if wanted("alibaba-example (k=0)"):
                classic = example.with_policy(lambda p: dataclasses.replace(p, k=0.0))
                rows.append(timed("alibaba-example (k=0)", classic, load_s))
    print(
        "| case | simulated days | GPUs | jobs | cycles run | recomputes | load s | wall s "
        "| CPU s |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for row in rows:
        print(
            f"| {row['case']} | {row['simulated_days']:g} | {row['gpus']:g} | {row['jobs']} "
            f"| {row['cycles_run']} | {row['recomputes']} | {row['load_s']:.1f} "
            f"| {row['wall_s']:.1f} | {row['cpu_s']:.1f} |"
        )
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    print(f"peak resident set of the process: {peak_mib:.0f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
