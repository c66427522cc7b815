"""The index on an allocation interval's time range: GiST over all runs (as before migration
0015), GiST over long and open runs only (`split`, as now), SP-GiST, and none: what each costs
an ingest that writes intervals, and what each gives the window queries that read them.

    python bench/span_index.py [--intervals 300000] [--days 30] [--repeats 9]

A scratch database at the latest migration gets `--intervals` intervals of one pool, started
evenly over `--days` days, lasting from minutes to days (a few of them still open), as a cluster
at work leaves them. For each index kind in turn (alternating, `--repeats` times each):

- the write: a churn message's intervals (400 closed runs of the last hour) inserted in a
  transaction that is rolled back; PostgreSQL's CPU from `/proc/<pid>/schedstat`;
- the reads: `rollup_repo.intervals_between`'s statement (for `split`; the single statement
  before it for the others) for the last hour (what a fair share's
  edge reads), an hour 20 days back (a rollup that redoes history), and the last day; CPU of the
  backend and wall time, and the plan's index.

PostgreSQL must run on this machine (its backend's CPU is read from /proc).
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import psycopg
from bench_ingest import libpq_url

from gpufair.store import migrate, rollup_repo
from gpufair.store.ledger_tables import LONG_OR_OPEN
from gpufair.store.scratch import scratch_database, test_server

KINDS = {
    "gist": "CREATE INDEX ix_allocation_intervals_span ON allocation_intervals "
    "USING gist (tstzrange(started_at, ended_at, '[)'))",
    "spgist": "CREATE INDEX ix_allocation_intervals_span ON allocation_intervals "
    "USING spgist (tstzrange(started_at, ended_at, '[)'))",
    "split": "CREATE INDEX ix_allocation_intervals_long_span ON allocation_intervals "
    "USING gist (tstzrange(started_at, ended_at, '[)')) WHERE " + LONG_OR_OPEN,
    "none": "",  # the floor: what the rest of the table's indexes cost
}
# Durations: a quarter each of about 5 minutes, 1 hour, 8 hours and 2 days (random within
# each); one interval in 50 still open.
_POPULATE_SQL = """
    INSERT INTO allocation_intervals
        (workload_uid, start_event_id, queue, pool, gpu_type, gpus, cu, started_at, ended_at,
         end_kind, pods)
    SELECT 'w' || g, gen_random_uuid(), 'q' || (g %% 8), 'main', 'a100', 1, 10, s,
           CASE WHEN g %% 50 = 0 THEN NULL
                ELSE s + make_interval(secs => (ARRAY[300, 3600, 28800, 172800])[1 + g %% 4]
                                               * (0.5 + random()))
           END,
           CASE WHEN g %% 50 = 0 THEN NULL ELSE 'stopped' END,
           jsonb_build_array(jsonb_build_object(
               'node', 'n' || (g %% 64), 'gpu_indices', jsonb_build_array(g %% 8),
               'gpu_fraction', 1.0))
    FROM generate_series(1, %(n)s) AS g,
         LATERAL (SELECT now() - make_interval(secs => %(span_s)s * (1 - g::float8 / %(n)s))
                  AS s) AS t
"""
_WRITE_SQL = """
    INSERT INTO allocation_intervals
        (workload_uid, start_event_id, queue, pool, gpu_type, gpus, cu, started_at, ended_at,
         end_kind, pods)
    SELECT 'new' || g, gen_random_uuid(), 'q' || mod(g, 8), 'main', 'a100', 1, 10,
           now() - make_interval(secs => 3600 - g), now() - make_interval(secs => 3300 - g),
           'stopped', '[{"node": "n1", "gpu_indices": [1], "gpu_fraction": 1.0}]'
    FROM generate_series(1, 400) AS g
"""
# rollup_repo.intervals_between's statement before migration 0015, and now.
_WINDOW_SQL = """
    SELECT queue, gpu_type, gpus, cu, extract(epoch FROM started_at)::float8 AS s,
           COALESCE(extract(epoch FROM ended_at)::float8, 'Infinity'::float8) AS e
    FROM allocation_intervals
    WHERE tstzrange(started_at, ended_at, '[)')
          && tstzrange(to_timestamp(%(lo)s), to_timestamp(%(hi)s), '[)')
      AND pool = %(pool)s
      AND gpus < 'Infinity'::float8 AND cu < 'Infinity'::float8
"""
_SPLIT_SQL = re.sub(r"(?<!:):(lo|hi|pool)\b", r"%(\1)s", str(rollup_repo._BETWEEN_SQL))


def measure(pg: psycopg.Connection, kind: str, now_s: float) -> dict[str, float | str]:
    stat = Path(f"/proc/{pg.info.backend_pid}/schedstat")

    def cpu_ms() -> float:
        return int(stat.read_text().split()[0]) / 1e6

    def timed(action: Callable[[], object]) -> tuple[float, float]:
        cpu, wall = cpu_ms(), time.perf_counter()
        action()
        return cpu_ms() - cpu, (time.perf_counter() - wall) * 1e3

    pg.execute("DROP INDEX IF EXISTS ix_allocation_intervals_span")
    pg.execute("DROP INDEX IF EXISTS ix_allocation_intervals_long_span")
    if KINDS[kind]:
        pg.execute(KINDS[kind])
    pg.execute("ANALYZE allocation_intervals")
    pg.commit()
    found: dict[str, float | str] = {}
    write = []
    for _ in range(3):
        write.append(timed(lambda: pg.execute(_WRITE_SQL))[0])
        pg.rollback()
    found["write 400 intervals, CPU ms"] = statistics.median(write)
    windows = {
        "last hour": (now_s - 3600, now_s),
        "an hour 20 days back": (now_s - 20 * 86400, now_s - 20 * 86400 + 3600),
        "last day": (now_s - 86400, now_s),
    }
    for name, (lo, hi) in windows.items():
        params = {"lo": lo, "hi": hi, "pool": "main"}
        sql = _SPLIT_SQL if kind == "split" else _WINDOW_SQL

        def read(q: str = sql, p: dict[str, object] = params) -> object:
            return pg.execute(q, p).fetchall()

        runs = [timed(read) for _ in range(3)]
        found[f"read {name}, CPU ms"] = statistics.median(r[0] for r in runs)
        found[f"read {name}, wall ms"] = statistics.median(r[1] for r in runs)
        plan = pg.execute("EXPLAIN (FORMAT JSON) " + sql, params).fetchone()
        found[f"read {name}, plan"] = _index_of(plan[0] if plan else None)
        found[f"read {name}, rows"] = len(pg.execute(sql, params).fetchall())
    pg.rollback()
    return found


def _index_of(plan: object) -> str:
    """The scan types and indexes of a JSON plan, as one line."""
    parts: list[str] = []

    def walk(node: dict[str, object]) -> None:
        parts.append(str(node.get("Node Type")) + ":" + str(node.get("Index Name", "-")))
        for child in node.get("Plans", []) or []:  # type: ignore[attr-defined]
            walk(child)

    if isinstance(plan, list) and plan:
        walk(plan[0]["Plan"])
    return " / ".join(parts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--intervals", type=int, default=300_000)
    parser.add_argument("--days", type=float, default=30.0)
    parser.add_argument("--repeats", type=int, default=9)
    args = parser.parse_args()
    results: dict[str, list[dict[str, float | str]]] = {kind: [] for kind in KINDS}
    with test_server() as server, scratch_database(server.url, prefix="gpufair_bench") as url:
        migrate.upgrade(url)
        with psycopg.connect(libpq_url(url)) as pg:
            pg.execute("SET jit = off")
            pg.execute(_POPULATE_SQL, {"n": args.intervals, "span_s": args.days * 86400})
            pg.commit()
            pg.autocommit = True
            pg.execute("VACUUM ANALYZE allocation_intervals")
            pg.autocommit = False
            now_s = time.time()
            for k in range(args.repeats):
                order = list(KINDS) if k % 2 == 0 else list(reversed(KINDS))
                for kind in order:
                    results[kind].append(measure(pg, kind, now_s))
                    print(json.dumps({"kind": kind, **results[kind][-1]}), flush=True)
    print(f"medians of {args.repeats}, {args.intervals} intervals over {args.days} days:")
    for kind, rounds in results.items():
        print(f"  {kind}:")
        for key, value in rounds[0].items():
            if isinstance(value, str):
                print(f"    {key:40s} {value}")
            else:
                median = statistics.median(float(r[key]) for r in rounds)
                print(f"    {key:40s} {median:9.2f}")


if __name__ == "__main__":
    main()
