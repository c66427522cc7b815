"""The parts of `bench_ingest.py`'s warm method, switched on one set at a time, alternated.

    python bench/ingest_warm_parts.py [--events 50000] [--cycles 3] [--mix steady]
                                      [--variants none;sampler;...] [--timeline]

Each cycle runs one round (`bench_ingest.one_round`, two streams spread over the server's
workers) of every variant, in an order that turns by one each cycle, so that every variant
meets the same stretch of a shared machine's load. A variant is a set of the parts in
`bench_ingest.WARM_PARTS` (`none` for none: the old method; `sampler,setup,runs` is the warm
method). Prints each round as a JSON line, and per variant the medians of: the ratio to the raw
COPY, the COPY's and the stream's seconds, the server's and PostgreSQL's CPU over the stream, the
gap between the two streams' replies, and how often the later one was the stream whose worker
holds the client's connection (in the old method, the worker that took the setup stream).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from typing import Any

import bench_ingest

DEFAULT_VARIANTS = (
    "none;sampler;sampler,transport;sampler,transport,connect;sampler,setup;sampler,runs;"
    "sampler,setup,runs"
)


def load_average() -> float:
    return os.getloadavg()[0]


def summary(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    def med(values: list[float]) -> float:
        return round(statistics.median(values), 4) if values else float("nan")

    gaps, later_client = [], 0
    for r in rounds:
        t = r["stream_timings"]
        if len(t) == 2:
            gaps.append(abs(t[0]["reply_s"] - t[1]["reply_s"]))
            later = max(t, key=lambda x: x["reply_s"])
            later_client += int(later.get("client_worker", 0.0) == 1.0)
    return {
        "rounds": len(rounds),
        "ratio": med([r["ratio_grpc_to_copy"] for r in rounds]),
        "copy_s": med([r["copy_s"] for r in rounds]),
        "stream_s": med([r["stream_s"] for r in rounds]),
        "server_cpu_us_per_event": med([r["us_per_event_server_cpu"] for r in rounds]),
        "postgres_cpu_ms_in_stream": med([r["postgres_cpu_ms_in_stream"] for r in rounds]),
        "copy_postgres_cpu_us_per_event": med(
            [r["copy_us_per_event_postgres_cpu"] for r in rounds]
        ),
        "reply_gap_s": med(gaps),
        "later_stream_on_client_worker": f"{later_client} of {len(gaps)}",
        "backends_started_in_stream": sum(r["postgres_backends_started_in_stream"] for r in rounds),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=50_000)
    parser.add_argument("--batch", type=int, default=2000)
    parser.add_argument("--cycles", type=int, default=3)
    parser.add_argument("--mix", choices=["churn", "steady"], default="steady")
    parser.add_argument("--variants", default=DEFAULT_VARIANTS, help="';'-separated part sets")
    parser.add_argument("--timeline", action="store_true")
    args = parser.parse_args()
    variants = [
        frozenset(p for p in v.split(",") if p and p != "none") for v in args.variants.split(";")
    ]
    names = ["+".join(sorted(v)) or "none" for v in variants]
    rounds: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    for cycle in range(args.cycles):
        shift = cycle % len(variants)
        for name, warm in (
            list(zip(names, variants, strict=True))[shift:]
            + list(zip(names, variants, strict=True))[:shift]
        ):
            load = load_average()
            result = bench_ingest.one_round(
                args.mix,
                args.events,
                args.batch,
                2,
                spread=True,
                warm=warm,
                timeline=args.timeline,
            )
            rounds[name].append(result)
            line = {"cycle": cycle, "variant": name, "load_1min": round(load, 2), **result}
            print(json.dumps(line), file=sys.stderr, flush=True)
    print(json.dumps({name: summary(r) for name, r in rounds.items()}, indent=2))


if __name__ == "__main__":
    main()
