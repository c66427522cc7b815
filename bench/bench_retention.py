"""Retention's run time on a large ledger: the daily job's first run over a backlog, and the next.

    python bench/bench_retention.py [--pools 4] [--days 730] [--no-decay-pools 0] [--repeat 3]
                                    [--now UNIX_S]

One scratch database is filled with SQL: `--pools` pools, each of 8 leaf queues in 2
departments with a deserved quota in every pool, a 7-day sliding window with a 1-day half-life
(the first `--no-decay-pools` of them count all history without decay), and `--days` of
history per pool: a finished run every 10 minutes, an hourly usage row per leaf queue and a
fairness row per queue of the tree (the root's too), and a capacity change a day. No events and
no workloads: their purge works per workload and is not what this measures.

Each repetition copies that database (`CREATE DATABASE ... TEMPLATE`: rows, indexes and
statistics alike), then times, in one process and on one connection, `apply_retention` with the
default ages (rollups 400 days) at `--now`: the first run, which deletes the backlog older than
400 days in committed batches, then the run a day later, which deletes a day's worth. For each:
wall seconds, this process's CPU seconds, and the CPU seconds of the database backend that ran
the statements (from /proc, when the server runs on this machine; null otherwise). The rows
each run deleted are printed beside them, so two checkouts can be seen to do the same work.

Both checkouts' code must be able to run it: to compare with another checkout, run this file
with `PYTHONPATH=<checkout>/service`; `--now` makes the two histories identical.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
from psycopg import sql
from sqlalchemy import Connection, text
from sqlalchemy.engine import make_url

from gpufair.api.convert_cluster import config_from_proto
from gpufair.config_file import parse_config
from gpufair.domain.config_diff import diff_configs
from gpufair.store import capacity_repo, config_repo, migrate
from gpufair.store.database import make_engine, normalise_url
from gpufair.store.retention_repo import Retention, apply_retention
from gpufair.store.scratch import scratch_database, test_server

DAY_S = 86400.0
RUN_STEP_S = 600.0  # a run starts every 10 minutes in each pool
DEPARTMENTS = 2
TEAMS = 4  # per department


def cluster(pools: int, no_decay: int) -> dict[str, object]:
    names = [f"pool{p}" for p in range(pools)]

    def quotas(deserved: float) -> list[dict[str, object]]:
        return [{"pool": n, "deserved_cu": deserved, "over_quota_weight": 1} for n in names]

    queues: list[dict[str, object]] = [
        {"name": f"dept{d}", "quotas": quotas(100)} for d in range(DEPARTMENTS)
    ]
    queues += [
        {"name": f"team{d}-{t}", "parent": f"dept{d}", "quotas": quotas(20)}
        for d in range(DEPARTMENTS)
        for t in range(TEAMS)
    ]
    decaying = {"window_s": 7 * DAY_S, "half_life_s": "1d"}
    return {
        "gpu_types": [{"name": "a100", "memory_gib": 80, "compute_weight": 1}],
        "pools": [
            {"name": n, "policy": {"window_kind": "none"} if p < no_decay else decaying}
            for p, n in enumerate(names)
        ],
        "nodes": [
            {
                "name": f"{n}-n{i:02d}",
                "pool": n,
                "gpu_type": "a100",
                "gpu_count": 8,
                "cpu_millicores": 64000,
                "memory_mib": 524288,
            }
            for n in names
            for i in range(32)
        ],
        "queues": queues,
    }


_LEAVES = (
    "SELECT 'team' || d || '-' || t AS queue FROM generate_series(0, 1) d, generate_series(0, 3) t"
)
_TREE = _LEAVES + " UNION ALL SELECT 'dept' || d FROM generate_series(0, 1) d UNION ALL SELECT ''"


def populate(url: str, pools: int, no_decay: int, days: float, now_s: float) -> dict[str, int]:
    migrate.upgrade(url)
    engine = make_engine(url, pool_size=1, statement_timeout_ms=3_600_000)
    config, problems = config_from_proto(parse_config(cluster(pools, no_decay)))
    assert not problems, problems
    first_s = now_s - days * DAY_S
    params = {"first": first_s, "now": now_s, "step": RUN_STEP_S}
    with engine.begin() as conn:
        changes = diff_configs(config_repo.load_config(conn), config)
        config_repo.apply_changes(conn, config, changes)
        config_repo.record_version(conn, changes)
        capacity_repo.record_if_changed(conn, first_s, "config")
        for p in range(pools):
            pool = {**params, "pool": f"pool{p}"}
            conn.execute(
                text(
                    """
                    INSERT INTO allocation_intervals (workload_uid, start_event_id, queue, pool,
                        gpu_type, gpus, cu, started_at, ended_at, end_kind, pods)
                    SELECT :pool || '-' || i, md5(:pool || i)::uuid,
                           'team' || (i % 2) || '-' || (i % 4), :pool, 'a100', 1 + i % 8,
                           1 + i % 8, to_timestamp(:first + i * :step),
                           to_timestamp(:first + i * :step + 300 + (i * 7919) % 6900),
                           'stopped', '[]'::jsonb
                    FROM generate_series(0, floor((:now - :first - 7200) / :step)::int) AS i
                    """
                ),
                pool,
            )
            hours = "generate_series(0, floor((:now - :first) / 3600)::int - 1) AS h"
            conn.execute(
                text(
                    f"""
                    INSERT INTO usage_hourly (pool, queue, gpu_type, bucket_start, gpu_seconds,
                                              cu_seconds, over_quota_cu_seconds)
                    SELECT :pool, l.queue, 'a100',
                           to_timestamp(floor(:first / 3600) * 3600 + h * 3600),
                           3600, 3600, 1800
                    FROM ({_LEAVES}) AS l, {hours}
                    """
                ),
                pool,
            )
            conn.execute(
                text(
                    f"""
                    INSERT INTO fairness_hourly (pool, queue, bucket_start, half_life_s,
                        usage_basis, usage_moment, group_capacity_moment)
                    SELECT :pool, q.queue, to_timestamp(floor(:first / 3600) * 3600 + h * 3600),
                           86400, 'over_quota', 1800, 3600
                    FROM ({_TREE}) AS q, {hours}
                    """
                ),
                pool,
            )
            conn.execute(
                text(
                    """
                    INSERT INTO pool_capacity_changes (pool, changed_at, capacity_cu,
                                                       capacity_gpus_by_type, source)
                    SELECT :pool, to_timestamp(:first + d * 86400 + 1), 256 - d % 2 * 8,
                           jsonb_build_object('a100', 256 - d % 2 * 8), 'node_capacity'
                    FROM generate_series(0, floor((:now - :first) / 86400)::int - 1) AS d
                    """
                ),
                pool,
            )
        counts = {
            table: int(conn.execute(text(f"SELECT count(*) FROM {table}")).scalar_one())
            for table in (
                "allocation_intervals",
                "usage_hourly",
                "fairness_hourly",
                "pool_capacity_changes",
            )
        }
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("VACUUM ANALYZE"))
    engine.dispose()
    return counts


def _backend_cpu_s(pid: int) -> float | None:
    """User + system CPU seconds of a server process on this machine; None if it is elsewhere."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def timed_run(conn: Connection, now_s: float) -> dict[str, object]:
    pid = int(conn.execute(text("SELECT pg_backend_pid()")).scalar_one())
    conn.commit()
    server_before = _backend_cpu_s(pid)
    wall, cpu = time.perf_counter(), time.process_time()
    deleted = apply_retention(conn, now_s, Retention())
    conn.commit()
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    server_after = _backend_cpu_s(pid)
    server = None if server_before is None or server_after is None else server_after - server_before
    kinds = ("intervals", "usage_hourly", "fairness_hourly", "capacity")
    return {
        "wall_s": wall,
        "cpu_s": cpu,
        "server_cpu_s": server,
        "deleted": {k: deleted.get(k, 0) for k in kinds},
    }


@contextmanager
def copy_of(server_url: str, template: str) -> Iterator[str]:
    """A new database made from `template`; dropped afterwards."""
    admin = make_url(normalise_url(server_url)).set(drivername="postgresql")
    name = f"gpufair_bench_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(admin.render_as_string(False), autocommit=True) as c:
        c.execute(
            sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
                sql.Identifier(name), sql.Identifier(template)
            )
        )
    try:
        yield admin.set(database=name).render_as_string(False)
    finally:
        with psycopg.connect(admin.render_as_string(False), autocommit=True) as c:
            c.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(name)))


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--pools", type=int, default=4)
    parser.add_argument("--days", type=float, default=730.0)
    parser.add_argument("--no-decay-pools", type=int, default=0)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--now", type=float, default=float(int(time.time())))
    args = parser.parse_args()
    with test_server() as server, scratch_database(server.url, prefix="gpufair_bench") as url:
        start = time.perf_counter()
        counts = populate(url, args.pools, args.no_decay_pools, args.days, args.now)
        info: dict[str, object] = {
            "pools": args.pools,
            "no_decay_pools": args.no_decay_pools,
            "days": args.days,
            "now": args.now,
            "rows": counts,
            "populate_s": round(time.perf_counter() - start, 1),
        }
        runs: dict[str, list[dict[str, object]]] = {"first": [], "next_day": []}
        template = make_url(normalise_url(url)).database
        assert template is not None
        for _ in range(args.repeat):
            with copy_of(server.url, template) as copy:
                migrate.upgrade(copy)  # nothing to do: the copy is of a migrated database
                engine = make_engine(copy, pool_size=1, statement_timeout_ms=3_600_000)
                try:
                    with engine.connect() as conn:
                        runs["first"].append(timed_run(conn, args.now))
                        runs["next_day"].append(timed_run(conn, args.now + DAY_S))
                finally:
                    engine.dispose()
    for name, timed in runs.items():
        info[name] = {
            "deleted": timed[0]["deleted"],
            **{
                f"{key}_median": (
                    None
                    if any(t[key] is None for t in timed)
                    else round(statistics.median(float(str(t[key])) for t in timed), 3)
                )
                for key in ("wall_s", "cpu_s", "server_cpu_s")
            },
            "wall_s": [round(float(str(t["wall_s"])), 3) for t in timed],
        }
    print(json.dumps(info))


if __name__ == "__main__":
    main()
