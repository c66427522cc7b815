"""What ingest's per-run update of `workloads` costs PostgreSQL with the state in an index (as
now) and without, at the table's fill factor and with room left on its pages: whether making the
update HOT (a heap-only tuple: no new index entries) would pay, and what it needs.

    python bench/workload_update.py [--workloads 50000] [--repeats 2]

A scratch database at the latest migration gets `--workloads` workloads of one pool in eight
queues, submitted in batches as `bench_ingest.py` submits them (so the table's pages are full, as
a bulk submission leaves them). For each layout in turn (alternating, `--repeats` times each, the
table built again each time) ten batches of 400 workloads are updated as ingest updates them
(`ingest_writes._STATE_UPDATE_SQL`): once to `running` (their runs start) and once more to
`finished` (they end), each in a transaction that commits. PostgreSQL's CPU per statement is read
from `/proc/<pid>/schedstat`; the share of HOT updates from `pg_stat_user_tables`.

Layouts: the two indexes that hold `state` ((pool, state), (queue, state), as now) or the same
without it ((pool), (queue)); fill factor 100 (PostgreSQL's default, as now), 80 or 50. A row version
can stay on its page without new index entries only when no indexed column changes (columns of
an index's predicate count too, so a partial index `WHERE state IN (...)` is no way around it)
and the page has room for it. PostgreSQL must run on this machine.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import psycopg
from bench_ingest import libpq_url

from gpufair.store import ingest_writes, migrate
from gpufair.store.event_codec import text_array
from gpufair.store.scratch import scratch_database, test_server

BATCH = 400
BATCHES = 10
LAYOUTS = {
    "state indexed (as now), fill factor 100": (100, ["pool, state", "queue, state"]),
    "state indexed (as now), fill factor 80": (80, ["pool, state", "queue, state"]),
    "state in no index, fill factor 100": (100, ["pool", "queue"]),
    "state in no index, fill factor 80": (80, ["pool", "queue"]),
    "state in no index, fill factor 50": (50, ["pool", "queue"]),
}
# A workload's spec as `workload_repo.submit` stores it for the benchmark's workloads (one pod,
# one GPU): the row's width matters, every new version copies it.
SPEC = (
    '{"uid": "w", "pods": 1, "pool": "main", "queue": "q0", "topology": null, "min_pods": null, '
    '"preemptible": true, "submit_time": 1700000000.0, "gpus_per_pod": 1.0, '
    '"compute_units": 0.0, "min_runtime_s": 0.0, "priority_class": 0, '
    '"allowed_gpu_types": [], "partition_profile": "", "memory_mib_per_pod": 0, '
    '"min_gpu_memory_gib": 0.0, "cpu_millicores_per_pod": 0, "mixed_gpu_types": false, '
    '"pods_on_distinct_nodes": false}'
)


def build(pg: psycopg.Connection, n: int, fillfactor: int, indexes: list[str]) -> None:
    pg.execute("TRUNCATE workloads")
    pg.execute("DROP INDEX IF EXISTS ix_workloads_pool_state, ix_workloads_queue_state")
    pg.execute(f"ALTER TABLE workloads SET (fillfactor = {fillfactor})")
    for i, columns in enumerate(indexes):
        pg.execute(f"CREATE INDEX ix_probe_{i} ON workloads ({columns})")
    for lo in range(0, n, 5000):
        pg.execute(
            "INSERT INTO workloads (uid, queue, pool, state, spec, spec_digest, submit_time) "
            "SELECT 'w' || g, 'q' || (g %% 8), 'main', 'pending', %s::jsonb, md5(g::text), now() "
            "FROM generate_series(%s::int, %s::int) AS g",
            (SPEC, lo, min(n, lo + 5000) - 1),
        )
    pg.execute("VACUUM ANALYZE workloads")
    pg.execute("SELECT pg_stat_reset_single_table_counters('workloads'::regclass)")


def measure(url: str, n: int, repeats: int) -> dict[str, list[tuple[float, float]]]:
    spent: dict[str, list[tuple[float, float]]] = {name: [] for name in LAYOUTS}
    hot: dict[str, list[float]] = {name: [] for name in LAYOUTS}
    with psycopg.connect(libpq_url(url), autocommit=True) as pg:
        row = pg.execute("SELECT pg_backend_pid()").fetchone()
        assert row is not None
        stat = Path(f"/proc/{row[0]}/schedstat")

        def cpu_ms() -> float:
            return int(stat.read_text().split()[0]) / 1e6

        def update(uids: list[str], state: str) -> float:
            with pg.transaction():
                before = cpu_ms()
                done = pg.execute(
                    ingest_writes._STATE_UPDATE_SQL,
                    (text_array(uids), text_array([state] * len(uids))),
                ).rowcount
                spent_ms = cpu_ms() - before
            assert done == len(uids), f"{done} of {len(uids)} workloads updated"
            return spent_ms

        for _ in range(repeats):
            for name, (fillfactor, indexes) in LAYOUTS.items():
                build(pg, n, fillfactor, indexes)
                for k in range(BATCHES):
                    first = n // 2 + k * BATCH
                    uids = [f"w{u}" for u in range(first, first + BATCH)]
                    spent[name].append((update(uids, "running"), update(uids, "finished")))
                time.sleep(1.0)  # the backend's table counters are flushed at most once a second
                pg.execute("SELECT pg_stat_clear_snapshot()")
                counts = pg.execute(
                    "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables "
                    "WHERE relname = 'workloads'"
                ).fetchone()
                if counts and counts[0]:
                    hot[name].append(counts[1] / counts[0])
                pg.execute(
                    "DROP INDEX IF EXISTS "
                    + ", ".join(f"ix_probe_{i}" for i in range(len(indexes)))
                )
    for name in LAYOUTS:
        runs, ends = zip(*spent[name], strict=True)
        share = f"{statistics.median(hot[name]):.2f}" if hot[name] else "n/a"
        print(
            f"  {name:42s} to running {statistics.median(runs):6.2f} ms   "
            f"to finished {statistics.median(ends):6.2f} ms   HOT share {share}"
        )
    return spent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", type=int, default=50_000)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    if args.workloads < 2 * BATCHES * BATCH:  # the updated ones are all in the second half
        parser.error(f"--workloads must be at least {2 * BATCHES * BATCH}")
    with test_server() as server, scratch_database(server.url, prefix="gpufair_bench") as url:
        migrate.upgrade(url)
        print(
            f"PostgreSQL CPU per update of {BATCH} workloads "
            f"(median of {BATCHES * args.repeats}), {args.workloads} workloads:"
        )
        measure(url, args.workloads, args.repeats)


if __name__ == "__main__":
    main()
