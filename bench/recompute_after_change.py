"""A recompute right after a config change, on one ledger: a node drained, against a quota raised.

    python bench/recompute_after_change.py [--events 500000] [--repeat 5]

The ledger of `bench_recompute.py` (`--events` events, one run every 6 minutes back from now:
500,000 events are about 1.1 years), rolled up to now. Then, in turn, each inside a transaction
that is rolled back so every repetition starts from the same state:

- `node`: one node marked not ready (as a batch system drains one, by `UpsertNodes`), then
  `recompute_pool`, the periodic job, timed;
- `quota`: one leaf queue's deserved CU raised by one, then the same recompute, timed;
- `none`: the recompute alone, timed.

A quota enters every hourly bucket (the over-quota usage is counted against it), so after its
change the recompute redoes the buckets the pool's usage window reads (here the week of the
7-day sliding window); until 2026-12-09 it redid the pool's whole history, a cost that grew with
it. A node enters the buckets only through the pool's capacity, whose change marks the rollups
dirty from its instant; until round 22 any new config version redid the whole history too, so a
drained node cost what a quota does (`results/recompute.md`).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from dataclasses import replace
from functools import partial

from bench_recompute import prepare, recompute_s
from sqlalchemy import Connection

from gpufair.domain.config_diff import diff_configs
from gpufair.domain.model import ClusterConfig, frozen_map
from gpufair.store import capacity_repo, config_repo
from gpufair.store.scratch import scratch_database, test_server


def drained(config: ClusterConfig) -> ClusterConfig:
    first = config.nodes[0].name
    nodes = tuple(replace(n, ready=False) if n.name == first else n for n in config.nodes)
    return replace(config, nodes=nodes)


def raised(config: ClusterConfig) -> ClusterConfig:
    leaf = next(iter(config.leaf_queues()))
    quotas = {pool: replace(q, deserved_cu=q.deserved_cu + 1) for pool, q in leaf.quotas.items()}
    queues = tuple(
        replace(q, quotas=frozen_map(quotas)) if q.name == leaf.name else q for q in config.queues
    )
    return replace(config, queues=queues)


def change(conn: Connection, edit: Callable[[ClusterConfig], ClusterConfig], now_s: float) -> None:
    """What an apply of `edit` to the stored config writes (`api/config_write.write`)."""
    stored = config_repo.load_config(conn)
    wanted = edit(stored)
    changes = diff_configs(stored, wanted)
    assert changes, "the edit changed nothing"
    config_repo.apply_changes(conn, wanted, changes)
    config_repo.record_version(conn, changes)
    capacity_repo.record_if_changed(conn, now_s, "config")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=500_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    now_s = time.time()
    edits: dict[str, Callable[[ClusterConfig], ClusterConfig] | None] = {
        "none": None,
        "node": drained,
        "quota": raised,
    }
    with test_server() as server, scratch_database(server.url, prefix="gpufair_bench") as url:
        engine, info = prepare(url, args.events, now_s, first_rollup_days=365)
        try:
            recompute_s(engine, now_s)  # warm caches and connections
            times: dict[str, list[float]] = {name: [] for name in edits}
            for _ in range(args.repeat):  # in turn, so the machine's load hits all alike
                for name, edit in edits.items():
                    before = None if edit is None else partial(change, edit=edit, now_s=now_s)
                    times[name].append(recompute_s(engine, now_s, before))
        finally:
            engine.dispose()
    print(json.dumps(info))
    for name, spent in times.items():
        print(
            json.dumps(
                {
                    "after": name,
                    "recompute_median_ms": round(1000 * statistics.median(spent), 1),
                    "recompute_max_ms": round(1000 * max(spent), 1),
                }
            )
        )


if __name__ == "__main__":
    main()
