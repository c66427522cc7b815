"""Schedule over gRPC at the issue's size, and how much of it is the pure cycle.

    python bench/bench_schedule_rpc.py [--nodes 1000] [--pending 20000] [--running 5000]

1,000 nodes x 8 GPUs of 3 types, 200 leaf queues, 20,000 pending and 5,000 running workloads,
written with SQL. Timed, interleaved, in one run: `Schedule(dry_run=True)` through a real gRPC
server (snapshot read under the pool lock, fair shares, cycle, reply) and `run_cycle` alone on the
same snapshot. The difference is what the service adds around the domain code. The server runs
on the real clock, so, as in production, fair shares are recomputed once after the workloads
change (the warm-up call) and read from history by the timed calls.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from sqlalchemy import Engine, text

from gpufair.api.server import build_server
from gpufair.client import GpufairClient
from gpufair.config_file import parse_config
from gpufair.domain.cycle import run_cycle
from gpufair.services import schedule
from gpufair.services.recompute import recompute_pool
from gpufair.store import migrate
from gpufair.store.database import make_engine
from gpufair.store.scratch import scratch_database, test_server

TYPES = (("a100", 80, 10), ("v100", 16, 4), ("rtx4090", 24, 2))


def cluster(nodes: int) -> dict[str, object]:
    return {
        "gpu_types": [{"name": n, "memory_gib": m, "compute_weight": w} for n, m, w in TYPES],
        "pools": [{"name": "main"}],
        "nodes": [
            {
                "name": f"n{i:04d}",
                "pool": "main",
                "gpu_type": TYPES[i % 3][0],
                "gpu_count": 8,
                "cpu_millicores": 128000,
                "memory_mib": 1048576,
                "labels": {"rack": f"r{i // 20}"},
            }
            for i in range(nodes)
        ],
        "queues": [
            {"name": f"d{d}", "quotas": [{"pool": "main", "deserved_cu": 50 * nodes / 20}]}
            for d in range(20)
        ]
        + [
            {
                "name": f"q{q}",
                "parent": f"d{q % 20}",
                "quotas": [
                    {"pool": "main", "deserved_cu": 5 * nodes / 200, "over_quota_weight": 1 + q % 4}
                ],
            }
            for q in range(200)
        ],
    }


def populate(engine: Engine, nodes: int, pending: int, running: int, now_s: float) -> None:
    params = {"now": now_s, "pending": pending, "running": running, "nodes": nodes}
    with engine.begin() as conn:
        # Running: one GPU each, on GPU (i / nodes) of node (i % nodes): never two on one GPU.
        conn.execute(
            text(
                """
                INSERT INTO workloads (uid, queue, pool, state, spec, spec_digest, submit_time)
                SELECT 'r' || i, 'q' || (i % 200), 'main', 'running',
                       jsonb_build_object('uid', 'r' || i, 'queue', 'q' || (i % 200), 'pool', 'main',
                           'pods', 1, 'gpus_per_pod', 1, 'submit_time_s', :now - 3600,
                           'cpu_millicores_per_pod', 1000, 'memory_mib_per_pod', 4096),
                       md5('r' || i), to_timestamp(:now - 3600)
                FROM generate_series(0, :running - 1) AS i
                """
            ),
            params,
        )
        conn.execute(
            text(
                """
                INSERT INTO allocation_intervals (workload_uid, start_event_id, queue, pool,
                    gpu_type, gpus, cu, started_at, ended_at, end_kind, pods)
                SELECT 'r' || i, md5('r' || i)::uuid, 'q' || (i % 200), 'main',
                       (ARRAY['a100', 'v100', 'rtx4090'])[1 + (i % :nodes) % 3], 1,
                       (ARRAY[10, 4, 2])[1 + (i % :nodes) % 3], to_timestamp(:now - 3600), NULL,
                       NULL, jsonb_build_array(jsonb_build_object(
                           'node', 'n' || lpad((i % :nodes)::text, 4, '0'),
                           'gpu_indices', jsonb_build_array(i / :nodes), 'gpu_fraction', 1.0))
                FROM generate_series(0, :running - 1) AS i
                """
            ),
            params,
        )
        conn.execute(
            text(
                """
                INSERT INTO workloads (uid, queue, pool, state, spec, spec_digest, submit_time)
                SELECT 'p' || i, 'q' || (i % 200), 'main', 'pending',
                       jsonb_build_object('uid', 'p' || i, 'queue', 'q' || (i % 200), 'pool', 'main',
                           'pods', (ARRAY[1, 1, 2, 4, 8])[1 + i % 5],
                           'gpus_per_pod', (ARRAY[1, 0.5, 1, 2, 1])[1 + (i / 5) % 5],
                           'submit_time_s', :now - 600 + i * 0.01,
                           'cpu_millicores_per_pod', 2000, 'memory_mib_per_pod', 8192,
                           'preemptible', i % 7 <> 0),
                       md5('p' || i), to_timestamp(:now - 600 + i * 0.01)
                FROM generate_series(0, :pending - 1) AS i
                """
            ),
            params,
        )
        conn.execute(
            text(
                "INSERT INTO pool_capacity_changes VALUES ('main', to_timestamp(:now - 86400), "
                ":cu, '{}', 'config')"
            ),
            {"now": now_s, "cu": 8 * nodes * 16 / 3},
        )
    with engine.connect() as conn:
        conn.execute(text("ANALYZE"))
        conn.commit()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--pending", type=int, default=20_000)
    parser.add_argument("--running", type=int, default=5_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    now_s = time.time()
    with test_server() as server, scratch_database(server.url, prefix="gpufair_bench") as url:
        migrate.upgrade(url)
        engine = make_engine(url, pool_size=4, statement_timeout_ms=600_000)
        running = build_server(engine, "127.0.0.1:0", max_workers=4)
        try:
            with GpufairClient(f"127.0.0.1:{running.port}", timeout_s=600) as client:
                client.apply_config(parse_config(cluster(args.nodes)))
                populate(engine, args.nodes, args.pending, args.running, now_s)
                with engine.connect() as conn:  # what the periodic job does: shares stored
                    recompute_pool(conn, "main", time.time())
                    conn.commit()
                client.schedule("main", dry_run=True)  # warm caches
                with engine.connect() as conn:
                    snapshot, _ = schedule.build_snapshot(conn, "main", time.time())
                    conn.rollback()
                rpc, cycle, binds = [], [], 0
                for _ in range(args.repeat):
                    start = time.perf_counter()
                    reply = client.schedule("main", dry_run=True)
                    rpc.append(time.perf_counter() - start)
                    binds = len(reply.binds)
                    start = time.perf_counter()
                    run_cycle(snapshot)
                    cycle.append(time.perf_counter() - start)
        finally:
            running.stop(1)
            engine.dispose()
    print(
        json.dumps(
            {
                "nodes": args.nodes,
                "pending": args.pending,
                "running": args.running,
                "binds_per_cycle": binds,
                "schedule_rpc_median_s": round(statistics.median(rpc), 3),
                "pure_cycle_median_s": round(statistics.median(cycle), 3),
                "service_overhead_s": round(statistics.median(rpc) - statistics.median(cycle), 3),
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
