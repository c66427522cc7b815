"""Recompute cost must not grow with the ledger: one pool with a small vs a large ledger.

    python bench/bench_recompute.py [--small 10000] [--large 10000000] [--repeat 7]

Two scratch databases hold the same cluster (100 nodes x 8 GPUs, 20 leaf queues in 4
departments, a 7-day sliding window with a 1-day half-life) and the same present (200 running
runs, 500 pending workloads); they differ only in history: `--small` vs `--large` ledger events
spread over the past year (5 events per run: start, 3 heartbeats, stop; runs of 5 min to 2 h).
History is written with SQL (the ingest path has its own benchmark), then rolled up once, untimed
but reported. What is timed is `recompute_pool` — the periodic job: rollups brought up to date,
decayed usage from rollups plus the window's edges, demand, the fair-share division — inside a
transaction that is rolled back, so every repetition sees the same state.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from sqlalchemy import Engine, text

from gpufair.api.convert_cluster import config_from_proto
from gpufair.config_file import parse_config
from gpufair.domain.config_diff import diff_configs
from gpufair.services.recompute import recompute_pool
from gpufair.store import capacity_repo, config_repo, migrate, rollup_repo
from gpufair.store.database import make_engine
from gpufair.store.scratch import scratch_database, test_server

YEAR_S = 365 * 86400.0


def cluster() -> dict[str, object]:
    queues: list[dict[str, object]] = [
        {
            "name": f"dept{d}",
            "quotas": [{"pool": "main", "deserved_cu": 160, "over_quota_weight": 1 + d}],
        }
        for d in range(4)
    ]
    queues += [
        {
            "name": f"team{d}-{t}",
            "parent": f"dept{d}",
            "quotas": [{"pool": "main", "deserved_cu": 30, "over_quota_weight": 1 + t % 3}],
        }
        for d in range(4)
        for t in range(5)
    ]
    return {
        "gpu_types": [{"name": "a100", "memory_gib": 80, "compute_weight": 1}],
        "pools": [{"name": "main", "policy": {"window_s": "7d", "half_life_s": "1d", "k": 1}}],
        "nodes": [
            {
                "name": f"n{i:03d}",
                "pool": "main",
                "gpu_type": "a100",
                "gpu_count": 8,
                "cpu_millicores": 64000,
                "memory_mib": 524288,
            }
            for i in range(100)
        ],
        "queues": queues,
    }


def populate(engine: Engine, events: int, now_s: float) -> None:
    runs = max(1, events // 5)
    config, problems = config_from_proto(parse_config(cluster()))
    assert not problems
    with engine.begin() as conn:
        changes = diff_configs(config_repo.load_config(conn), config)
        config_repo.apply_changes(conn, config, changes)
        config_repo.record_version(conn, changes)
        capacity_repo.record_if_changed(conn, now_s - YEAR_S - 86400, "config")
        params = {"runs": runs, "now": now_s, "year": YEAR_S}
        # Past runs: uniform over the year, 1-8 GPUs, 5 min to 2 h, on leaf queues.
        conn.execute(
            text(
                """
                INSERT INTO workloads (uid, queue, pool, state, spec, spec_digest, submit_time)
                SELECT 'h' || i, 'team' || (i % 4) || '-' || (i % 5), 'main', 'finished', '{}',
                       md5(i::text), to_timestamp(:now - :year)
                FROM generate_series(1, :runs) AS i
                """
            ),
            params,
        )
        conn.execute(
            text(
                """
                INSERT INTO allocation_intervals (workload_uid, start_event_id, queue, pool,
                    gpu_type, gpus, cu, started_at, ended_at, end_kind, pods)
                SELECT 'h' || i, md5('s' || i)::uuid, 'team' || (i % 4) || '-' || (i % 5), 'main',
                       'a100', 1 + i % 8, 1 + i % 8,
                       to_timestamp(:now - :year + (i::float8 / :runs) * (:year - 7200)),
                       to_timestamp(:now - :year + (i::float8 / :runs) * (:year - 7200)
                                    + 300 + (i::bigint * 7919) % 6900),
                       'stopped', '[]'::jsonb
                FROM generate_series(1, :runs) AS i
                """
            ),
            params,
        )
        conn.execute(
            text(
                """
                INSERT INTO ledger_events (event_id, workload_uid, kind, occurred_at, payload,
                                           payload_digest)
                SELECT md5('e' || i || '-' || k)::uuid, 'h' || i,
                       CASE k WHEN 0 THEN 'started' WHEN 4 THEN 'stopped' ELSE 'heartbeat' END,
                       to_timestamp(:now - :year + (i::float8 / :runs) * (:year - 7200) + 60 * k),
                       '{}'::jsonb, md5(i || '-' || k)
                FROM generate_series(1, :runs) AS i, generate_series(0, 4) AS k
                """
            ),
            params,
        )
        # The present, identical in both databases: 200 running runs and 500 pending workloads.
        conn.execute(
            text(
                """
                INSERT INTO workloads (uid, queue, pool, state, spec, spec_digest, submit_time)
                SELECT 'r' || i, 'team' || (i % 4) || '-' || (i % 5), 'main', 'running',
                       jsonb_build_object('uid', 'r' || i, 'queue', 'team' || (i % 4) || '-' || (i % 5),
                           'pool', 'main', 'pods', 1, 'gpus_per_pod', 2, 'submit_time_s', :now - 7200),
                       md5('r' || i), to_timestamp(:now - 7200)
                FROM generate_series(1, 200) AS i
                """
            ),
            params,
        )
        conn.execute(
            text(
                """
                INSERT INTO allocation_intervals (workload_uid, start_event_id, queue, pool,
                    gpu_type, gpus, cu, started_at, ended_at, end_kind, pods)
                SELECT 'r' || i, md5('r' || i)::uuid, 'team' || (i % 4) || '-' || (i % 5), 'main',
                       'a100', 2, 2, to_timestamp(:now - 7200 + i), NULL, NULL, '[]'::jsonb
                FROM generate_series(1, 200) AS i
                """
            ),
            params,
        )
        conn.execute(
            text(
                """
                INSERT INTO workloads (uid, queue, pool, state, spec, spec_digest, submit_time)
                SELECT 'p' || i, 'team' || (i % 4) || '-' || (i % 5), 'main', 'pending',
                       jsonb_build_object('uid', 'p' || i, 'queue', 'team' || (i % 4) || '-' || (i % 5),
                           'pool', 'main', 'pods', 1 + i % 4, 'gpus_per_pod', 1,
                           'submit_time_s', :now - 600),
                       md5('p' || i), to_timestamp(:now - 600)
                FROM generate_series(1, 500) AS i
                """
            ),
            params,
        )
    with engine.connect() as conn:
        conn.execute(text("ANALYZE"))
        conn.commit()


def prepare(url: str, events: int, now_s: float) -> tuple[Engine, dict[str, float]]:
    migrate.upgrade(url)
    engine = make_engine(url, pool_size=2, statement_timeout_ms=3_600_000)
    start = time.perf_counter()
    populate(engine, events, now_s)
    populate_s = time.perf_counter() - start
    start = time.perf_counter()
    with engine.connect() as conn:
        config = config_repo.load_config(conn)
        rollup_repo.rollup_pool(conn, config, config.pool("main"), now_s)
        conn.commit()
    return engine, {
        "events": events,
        "populate_s": round(populate_s, 1),
        "first_rollup_s": round(time.perf_counter() - start, 1),
    }


def recompute_s(engine: Engine, now_s: float) -> float:
    with engine.connect() as conn:
        start = time.perf_counter()
        recompute_pool(conn, "main", now_s)
        elapsed = time.perf_counter() - start
        conn.rollback()
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", type=int, default=10_000)
    parser.add_argument("--large", type=int, default=10_000_000)
    parser.add_argument("--repeat", type=int, default=15)
    args = parser.parse_args()
    now_s = time.time()
    with (
        test_server() as server,
        scratch_database(server.url, prefix="gpufair_bench") as small_url,
        scratch_database(server.url, prefix="gpufair_bench") as large_url,
    ):
        small, small_info = prepare(small_url, args.small, now_s)
        large, large_info = prepare(large_url, args.large, now_s)
        try:
            for engine in (small, large):  # warm caches and connections alike
                recompute_s(engine, now_s)
            times: dict[str, list[float]] = {"small": [], "large": []}
            # Interleaved, so that whatever else the machine does hits both alike.
            for _ in range(args.repeat):
                times["small"].append(recompute_s(small, now_s))
                times["large"].append(recompute_s(large, now_s))
        finally:
            small.dispose()
            large.dispose()
    for info, key in ((small_info, "small"), (large_info, "large")):
        info["recompute_median_ms"] = round(1000 * statistics.median(times[key]), 1)
        info["recompute_p90_ms"] = round(
            1000 * sorted(times[key])[int(0.9 * (len(times[key]) - 1))], 1
        )
        print(json.dumps(info))
    ratio = statistics.median(times["large"]) / statistics.median(times["small"])
    print(json.dumps({"ratio_large_to_small": round(ratio, 3), "target": 1.5}))


if __name__ == "__main__":
    main()
