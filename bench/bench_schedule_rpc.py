"""Schedule over gRPC at the issue's size, and how much of it is the pure cycle.

    python bench/bench_schedule_rpc.py [--nodes 1000] [--pending 20000] [--running 5000]

1,000 nodes x 8 GPUs of 3 types, 200 leaf queues, 20,000 pending and 5,000 running workloads,
written with SQL. Timed, interleaved, in one run:

- `rpc`: `Schedule(dry_run=True)` through a real gRPC server (in this process, over a real
  channel): snapshot under the pool lock, brought up to date from the servicer's kept state
  (`services/snapshot_source.py`), fair shares, cycle, reply;
- `cycle`: `run_cycle` alone on the same snapshot;
- `fresh`: what the handler did before it kept anything between cycles, in this process without
  gRPC: the snapshot read whole (`schedule.decide` without a source) and the reply built a
  message per pending workload.

Then, after those (they change the pool): the pool's rows after a change such as a cycle makes,
as many pending workloads bound as one cycle binds, read by kept rows and by the full read.

Each arm's wall time, the CPU time of this process (client and server threads: the RPC's cost
on both ends) and the CPU time the PostgreSQL backends of the database used (read from /proc,
when they run on this machine). The server runs on the real clock, so, as in production, fair
shares are recomputed once after the workloads change (the warm-up call) and read from history
by the timed calls.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import statistics
import time
from collections.abc import Iterator

from server_process import cpu_seconds
from sqlalchemy import Engine, text

from gpufair.api.convert_schedule import result_to_proto
from gpufair.api.server import build_server
from gpufair.client import GpufairClient
from gpufair.config_file import parse_config
from gpufair.domain.cycle import run_cycle
from gpufair.services import schedule
from gpufair.services.recompute import recompute_pool
from gpufair.services.snapshot_source import SnapshotSource
from gpufair.store import migrate, schedule_repo
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
                backends = _backends(engine)
                arms: dict[str, list[tuple[float, float, float]]] = {
                    "rpc": [],
                    "cycle": [],
                    "fresh": [],
                }
                binds = 0
                for _ in range(args.repeat):
                    with _measure(arms["rpc"], backends):
                        binds = len(client.schedule("main", dry_run=True).binds)
                    with _measure(arms["cycle"], backends):
                        run_cycle(snapshot)
                    with _measure(arms["fresh"], backends):
                        _fresh(engine)
                changed = _after_binds(engine, backends, args.repeat, binds)
        finally:
            running.stop(1)
            engine.dispose()
    medians = {
        arm: [round(statistics.median(x[i] for x in samples), 3) for i in range(3)]
        for arm, samples in arms.items()
    }
    rpc, cycle, fresh = medians["rpc"], medians["cycle"], medians["fresh"]
    print(
        json.dumps(
            {
                "nodes": args.nodes,
                "pending": args.pending,
                "running": args.running,
                "repeat": args.repeat,
                "binds_per_cycle": binds,
                "median_wall_cpu_pg_s": medians,
                "rpc_over_cycle_wall": round(rpc[0] / cycle[0], 2),
                "rpc_over_cycle_cpu": round(rpc[1] / cycle[1], 2),
                "rpc_over_cycle_cpu_with_pg": round((rpc[1] + rpc[2]) / cycle[1], 2),
                "fresh_over_cycle_wall": round(fresh[0] / cycle[0], 2),
                "fresh_over_cycle_cpu_with_pg": round((fresh[1] + fresh[2]) / cycle[1], 2),
                "after_binds_median_wall_cpu_pg_s": changed,
            },
            indent=2,
        )
    )


def _after_binds(
    engine: Engine, backends: list[int], repeat: int, binds: int
) -> dict[str, list[float]]:
    """The pool's rows read after a change as a cycle makes one: `binds` pending workloads of
    the bulk submission bound (with SQL, committed), then read by the kept rows (warmed before
    the change) and by the full read (`schedule_repo.holding_and_pending`), `repeat` times."""
    source = SnapshotSource()
    samples: dict[str, list[tuple[float, float, float]]] = {"kept": [], "full": []}
    with engine.connect() as conn:
        source.holding_and_pending(conn, "main")
        conn.commit()
        for _ in range(repeat):
            conn.execute(
                text(
                    "UPDATE workloads SET state = 'bound', bound_at = now(), binding = "
                    "jsonb_build_object('gpu_type', 'a100', 'pods', jsonb_build_array("
                    "jsonb_build_object('node', 'n0000', 'gpu_indices', jsonb_build_array(0)))) "
                    "WHERE uid IN (SELECT uid FROM workloads WHERE state = 'pending' "
                    "ORDER BY uid LIMIT :n)"
                ),
                {"n": binds},
            )
            conn.commit()
            with _measure(samples["kept"], backends):
                source.holding_and_pending(conn, "main")
            with _measure(samples["full"], backends):
                schedule_repo.holding_and_pending(conn, "main")
            conn.rollback()
    return {
        arm: [round(statistics.median(x[i] for x in rows), 3) for i in range(3)]
        for arm, rows in samples.items()
    }


def _fresh(engine: Engine) -> None:
    """The snapshot read whole and the reply built a message at a time (the handler before)."""
    now_s = time.time()
    with engine.connect() as conn:
        decided = schedule.decide(conn, "main", now_s)
        conn.rollback()
    result_to_proto("main", decided.result, now_s, 0).SerializeToString()


def _backends(engine: Engine) -> list[int]:
    with engine.connect() as conn:
        return list(
            conn.execute(
                text("SELECT pid FROM pg_stat_activity WHERE datname = current_database()")
            ).scalars()
        )


def _pg_cpu(pids: list[int]) -> float:
    try:
        return sum(cpu_seconds(pid) for pid in pids)
    except OSError:  # backends not on this machine
        return math.nan


@contextlib.contextmanager
def _measure(samples: list[tuple[float, float, float]], backends: list[int]) -> Iterator[None]:
    wall, cpu, pg = time.perf_counter(), time.process_time(), _pg_cpu(backends)
    yield
    samples.append((time.perf_counter() - wall, time.process_time() - cpu, _pg_cpu(backends) - pg))


if __name__ == "__main__":
    main()
