"""What counting a drained node's held GPUs costs the reads that run often, base beside new.

    python bench/drain_capacity_reads.py [--events 10000] [--rounds 9] [--batch 200]
                                         [--view-batch 5] [--bound 20]

Builds bench_recompute.py's database twice (100 nodes x 8 GPUs, 200 running runs, 500 pending,
`--events` of history, rolled up): once with no node ever drained, once with n000 drained 24 h
ago under four runs holding its 8 GPUs. In both, `--bound` of the pending workloads are then
bound (a Schedule's decision, not started) on nodes n001 onwards, 2 GPUs each, so the reads of
bound work have rows to read. Then, on one connection, alternating base and new in each round:

- `scrape`: the state gauges' reads, as `StateCollector._read` makes them, with the capacity
  read as before (`capacity_repo.capacity_now`, ready nodes only) or as now
  (`capacity_repo.counted_now`: one statement that also says whether a node is not ready, and
  only then a second);
- `division`: the recompute's statement of what work holds on the pool's nodes not ready
  (`capacity_repo.held_on_not_ready`), before (open intervals) and now (bound workloads too); run only
  while a node of the pool is not ready;
- `view`: `report.pool_utilisation_daily` read whole, its SELECT as migration 0020 left it and
  as 0032 makes it (ad hoc, by platform teams; not on a periodic path).

Each measure is a batch of `--batch` executions (`--view-batch` for the view): wall time, this
process's CPU time (`time.process_time`) and the PostgreSQL backend's (utime + stime from
/proc, 10 ms ticks: hence batches), per execution. The medians over the rounds are printed as
JSON, with the load average before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, Engine, text

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "migrations" / "versions"))

import bench_recompute

from gpufair.api import state_metrics
from gpufair.store import capacity_repo, metrics_repo
from gpufair.store.scratch import scratch_database, test_server

TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")

# `capacity_repo._HELD_SQL` before bound work counted: open intervals only.
BASE_HELD_SQL = text(
    f"""
    SELECT n.name, n.gpu_type, COALESCE(g.compute_weight, 0.0) AS cu_per_gpu,
           LEAST(n.gpu_count, COALESCE(c.gpu_count, n.gpu_count)) AS counted,
           sum({capacity_repo._POD_GPUS}) AS held
    FROM allocation_intervals i
    CROSS JOIN LATERAL jsonb_array_elements(i.pods) AS p(pod)
    JOIN nodes n ON n.name = p.pod->>'node'
    LEFT JOIN gpu_types g ON g.name = n.gpu_type
    LEFT JOIN node_capacity c ON c.node = n.name
    WHERE i.pool = :pool AND i.ended_at IS NULL
      AND p.pod->>'node' = ANY(:names) AND n.pool = :pool AND NOT n.ready
    GROUP BY n.name, n.gpu_type, g.compute_weight, n.gpu_count, c.gpu_count
    ORDER BY n.name
    """
)


def _view_select(module: str) -> str:
    import importlib

    sql: str = importlib.import_module(module)._UTILISATION
    head = "CREATE OR REPLACE VIEW report.pool_utilisation_daily AS"
    assert head in sql
    return "SELECT * FROM (" + sql.split(head, 1)[1] + ") AS v"


def _base_capacity(conn: Connection) -> dict[str, dict[str, tuple[float, float]]]:
    """`metrics_repo.capacity` before: the ready nodes only."""
    weights = {
        r.name: r.compute_weight
        for r in conn.execute(text("SELECT name, compute_weight FROM gpu_types"))
    }
    return {
        pool: {t: (gpus, gpus * weights.get(t, 0.0)) for t, gpus in by_type.items()}
        for pool, (_cu, by_type) in capacity_repo.capacity_now(conn).items()
    }


def _scrape(conn: Connection) -> None:
    metrics_repo.begin_light_read(conn, state_metrics.READ_TIMEOUT_MS)
    state_metrics._fair_shares(conn)
    state_metrics._capacity(conn)
    state_metrics._pending(conn)
    state_metrics._budgets(conn, datetime.now(UTC))
    state_metrics._jobs(conn)
    conn.rollback()


def _backend_cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * TICK_S


def _batch(conn: Connection, pid: int, n: int, run: Callable[[], Any]) -> tuple[float, ...]:
    wall, cpu, server = time.perf_counter(), time.process_time(), _backend_cpu_s(pid)
    for _ in range(n):
        run()
    return (
        (time.perf_counter() - wall) / n,
        (time.process_time() - cpu) / n,
        (_backend_cpu_s(pid) - server) / n,
    )


def _bind_some(engine: Engine, bound: int) -> None:
    with engine.begin() as conn:
        conn.execute(
            text(
                """
                UPDATE workloads w SET state = 'bound', bound_at = now(),
                    bind_expires_at = now() + interval '300 s',
                    binding = jsonb_build_object('gpu_type', 'a100', 'pods', jsonb_build_array(
                        jsonb_build_object('pod_index', 0, 'node', 'n' || lpad(b.i::text, 3, '0'),
                                           'gpu_indices', jsonb_build_array(6, 7),
                                           'gpu_fraction', 1.0)))
                FROM generate_series(1, :bound) AS b(i) WHERE w.uid = 'p' || b.i
                """
            ),
            {"bound": bound},
        )
        conn.execute(text("ANALYZE workloads"))


def measure(engine: Engine, args: argparse.Namespace) -> dict[str, Any]:
    base_view, new_view = (
        _view_select("0020_utilisation_days_in_utc"),
        _view_select("0032_utilisation_counts_drained_work"),
    )
    results: dict[str, dict[str, list[tuple[float, ...]]]] = {}
    with engine.connect() as conn:
        pid = int(conn.execute(text("SELECT pg_backend_pid()")).scalar_one())
        conn.rollback()
        names = sorted(
            r.name for r in conn.execute(text("SELECT name FROM nodes WHERE NOT ready"))
        ) or ["n000"]
        params = {"pool": "main", "names": names}
        original = metrics_repo.capacity
        cases: dict[str, dict[str, tuple[int, Callable[[], Any]]]] = {
            "scrape": {
                "base": (args.batch, lambda: _scrape_with(conn, _base_capacity)),
                "new": (args.batch, lambda: _scrape_with(conn, original)),
            },
            "division": {
                "base": (args.batch, lambda: conn.execute(BASE_HELD_SQL, params).all()),
                "new": (args.batch, lambda: capacity_repo.held_on_not_ready(conn, ["main"])),
            },
            "view": {
                "base": (args.view_batch, lambda: conn.execute(text(base_view)).all()),
                "new": (args.view_batch, lambda: conn.execute(text(new_view)).all()),
            },
        }
        checks = {
            "division_rows": (
                [tuple(r) for r in conn.execute(BASE_HELD_SQL, params)],
                [
                    (name, *node)
                    for name, node in capacity_repo.held_on_not_ready(conn, ["main"]).get(
                        "main", []
                    )
                    if name in names
                ],
            ),
            "scrape_capacity": (_base_capacity(conn), original(conn)),
        }
        conn.rollback()
        try:
            for round_ in range(args.rounds):
                for case, sides in cases.items():
                    order = ("base", "new") if round_ % 2 == 0 else ("new", "base")
                    for side in order:
                        n, run = sides[side]
                        run()  # warm
                        results.setdefault(case, {}).setdefault(side, []).append(
                            _batch(conn, pid, n, run)
                        )
                        conn.rollback()
        finally:
            _set(original)
    summary: dict[str, Any] = {"checks": {k: [str(v) for v in pair] for k, pair in checks.items()}}
    for case, measured in results.items():
        summary[case] = {
            side: {
                name: round(statistics.median(m[i] for m in measures) * 1e6, 1)
                for i, name in enumerate(("wall_us", "cpu_us", "pg_cpu_us"))
            }
            for side, measures in measured.items()
        }
    return summary


Capacities = dict[str, dict[str, tuple[float, float]]]


def _set(capacity: Callable[[Connection], Capacities]) -> None:
    setattr(metrics_repo, "capacity", capacity)  # noqa: B010 (mypy refuses a function assigned)


def _scrape_with(conn: Connection, capacity: Callable[[Connection], Capacities]) -> None:
    _set(capacity)
    _scrape(conn)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--batch", type=int, default=200)
    parser.add_argument("--view-batch", type=int, default=5)
    parser.add_argument("--bound", type=int, default=20)
    args = parser.parse_args()
    now_s = time.time()
    out: dict[str, Any] = {"args": vars(args), "loadavg_before": os.getloadavg()}
    with test_server() as server:
        for label, drain_hours in (("no_drain", 0.0), ("drained_24h", 24.0)):
            with scratch_database(server.url, prefix="gpufair_bench") as url:
                engine, info = bench_recompute.prepare(url, args.events, now_s, 0.0, drain_hours)
                try:
                    _bind_some(engine, args.bound)
                    out[label] = {"ledger": info, **measure(engine, args)}
                finally:
                    engine.dispose()
    out["loadavg_after"] = os.getloadavg()
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
