"""The cost of a node capacity event: what a batch system's node reports (a GPU gone bad, back)
cost the ledger, in time order and with every other one late.

    python bench/node_capacity_ingest.py [--nodes 64] [--events 2000] [--warm 200]
                                         [--order in-order|pairs-swapped] [--repeat 3]

A scratch database holds one pool of `--nodes` nodes of 8 A100s (`bench_retention.cluster`'s
first pool and queues). `--events` node_capacity events follow, one a second, node by node in turn, each
node alternating between 6 and 8 usable GPUs, so every event changes the pool's capacity and
writes a capacity row. Each is ingested alone in its own transaction (`ingest_pipeline.ingest`,
then commit), as the StreamEvents of a node agent that reports one change at a time. In
`pairs-swapped` order, events 2i+1 and 2i arrive in that order: every other event is older than
the pool's latest capacity row, the case that rebuilds the pool's history from its instant.

After the first `--warm` events, per event: wall, this process's CPU and the database backend's
CPU (from /proc, when the server runs on this machine), medians over `--repeat` fresh databases.
To compare checkouts, run it with `PYTHONPATH=<checkout>/service` for each.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import uuid

from bench_retention import _backend_cpu_s, cluster
from sqlalchemy import text

from gpufair.api.convert_cluster import config_from_proto
from gpufair.config_file import parse_config
from gpufair.domain.config_diff import diff_configs
from gpufair.domain.ledger import EventKind, LedgerEvent
from gpufair.store import capacity_repo, config_repo, ingest_pipeline, migrate
from gpufair.store.database import make_engine
from gpufair.store.scratch import scratch_database, test_server


def events(nodes: int, count: int, start_s: float, order: str) -> list[LedgerEvent]:
    made = [
        LedgerEvent(
            str(uuid.uuid4()),
            EventKind.NODE_CAPACITY,
            start_s + i,
            node=f"pool0-n{i % nodes:02d}",
            gpu_count=6 if (i // nodes) % 2 == 0 else 8,
        )
        for i in range(count)
    ]
    if order == "pairs-swapped":
        for i in range(0, count - 1, 2):
            made[i], made[i + 1] = made[i + 1], made[i]
    return made


def one_run(server_url: str, args: argparse.Namespace) -> dict[str, float | None]:
    with scratch_database(server_url, prefix="gpufair_bench") as url:
        migrate.upgrade(url)
        spec = cluster(1, 0)
        spec["nodes"] = [
            {
                "name": f"pool0-n{i:02d}",
                "pool": "pool0",
                "gpu_type": "a100",
                "gpu_count": 8,
                "cpu_millicores": 64000,
                "memory_mib": 524288,
            }
            for i in range(args.nodes)
        ]
        config, problems = config_from_proto(parse_config(spec))
        assert not problems, problems
        now_s = float(int(time.time()))
        start_s = now_s - args.events - 3600
        engine = make_engine(url, pool_size=1)
        try:
            with engine.connect() as conn:
                changes = diff_configs(config_repo.load_config(conn), config)
                config_repo.apply_changes(conn, config, changes)
                config_repo.record_version(conn, changes)
                capacity_repo.record_if_changed(conn, start_s - 60, "config")
                conn.commit()
                pid = int(conn.execute(text("SELECT pg_backend_pid()")).scalar_one())
                conn.commit()
                stream = events(args.nodes, args.events, start_s, args.order)
                for event in stream[: args.warm]:
                    ingest_pipeline.ingest(conn, [event], now_s)
                    conn.commit()
                server = _backend_cpu_s(pid)
                wall, cpu = time.perf_counter(), time.process_time()
                for event in stream[args.warm :]:
                    [outcome] = ingest_pipeline.ingest(conn, [event], now_s)
                    assert outcome.status is ingest_pipeline.EventStatus.STORED, outcome
                    conn.commit()
                wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
                server_after = _backend_cpu_s(pid)
                rows = conn.execute(text("SELECT count(*) FROM pool_capacity_changes")).scalar_one()
        finally:
            engine.dispose()
    timed = args.events - args.warm
    backend = None if server is None or server_after is None else server_after - server
    return {
        "wall_ms": 1000 * wall / timed,
        "cpu_ms": 1000 * cpu / timed,
        "backend_cpu_ms": None if backend is None else 1000 * backend / timed,
        "capacity_rows": float(rows),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--nodes", type=int, default=64)
    parser.add_argument("--events", type=int, default=2000)
    parser.add_argument("--warm", type=int, default=200)
    parser.add_argument("--order", choices=("in-order", "pairs-swapped"), default="in-order")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    with test_server() as server:
        runs = [one_run(server.url, args) for _ in range(args.repeat)]
    info: dict[str, object] = {"order": args.order, "nodes": args.nodes, "events": args.events}
    for key in ("wall_ms", "cpu_ms", "backend_cpu_ms", "capacity_rows"):
        values = [r[key] for r in runs]
        info[key] = (
            None if any(v is None for v in values) else [round(float(v or 0.0), 3) for v in values]
        )
        if info[key] is not None:
            info[f"{key}_median"] = round(statistics.median(float(v or 0.0) for v in values), 3)
    print(json.dumps(info))


if __name__ == "__main__":
    main()
