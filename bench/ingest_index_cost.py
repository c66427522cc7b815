"""What each index of `allocation_intervals` and `workloads` costs the per-run writes of a steady
ingest message, in PostgreSQL's CPU (the backend's /proc/<pid>/schedstat, nanoseconds).

    python bench/ingest_index_cost.py [--messages 400] [--repeats 3]

In a scratch database (migrated), for each variant a table made like the real one (`LIKE ...
INCLUDING ALL`: its columns, checks and indexes) with one index dropped, or none, filled as the
steady mix of `bench_ingest.py` leaves it: 5,000 runs going (open rows) and 5,000 closed; 10,000
workloads. Then, message after message, what a steady message of 2,000 events writes for its 20 run
changes, in statements of the shapes the ingest sends (`runs_repo.queue_writes`'s delete and JSON
insert, here returning the new ids; the ingest's `FOR NO KEY UPDATE` read and `unnest` state
update, without the join to `queues`), one at a time rather than pipelined: the delete of the 10
open rows that 10 stops close, the insert of 20 rows (the 10 closed ones and 10 new open starts),
and 20 workloads locked and their states updated, each message committed. The variants take turns,
`--repeats` times; printed: the median CPU per message of each, beside the full set's.
"""

from __future__ import annotations

import argparse
import json
import statistics
import uuid
from pathlib import Path
from typing import Any

import psycopg
from sqlalchemy.engine import make_url

from gpufair.store import migrate
from gpufair.store.database import normalise_url
from gpufair.store.scratch import scratch_database, test_server

INTERVAL_INDEXES = (
    "ix_allocation_intervals_workload",
    "ix_allocation_intervals_pool_span",
    "ix_allocation_intervals_open",
    "ix_allocation_intervals_long_span",
)
WORKLOAD_INDEXES = ("ix_workloads_pool_state", "ix_workloads_queue_state")
_INSERT = """
    INSERT INTO {t} (workload_uid, start_event_id, gpu_type, pool, gpus, cu,
        started_at, ended_at, queue, end_kind, pods)
    SELECT r->>0, (r->>1)::uuid, r->>2, r->>3, (r->>4)::float8, (r->>5)::float8,
           to_timestamp((r->>6)::float8), to_timestamp((r->>7)::float8), r->>8, r->>9, r->10
    FROM jsonb_array_elements(%s::jsonb) AS r RETURNING id
"""
T0 = 1.7e9


def cpu_ns(pid: int) -> int:
    return int(Path(f"/proc/{pid}/schedstat").read_text().split()[0])


def interval(uid: str, at: float, ended: float | None) -> list[Any]:
    pods = [{"node": "n1", "gpu_indices": [0], "gpu_fraction": 1.0}]
    end_kind = None if ended is None else "stopped"
    return [uid, str(uuid.uuid4()), "a100", "main", 1.0, 10.0, at, ended, "q0", end_kind, pods]


def probe_table(pg: psycopg.Connection[Any], source: str, dropped: str) -> str:
    """A table made like `source`, without its copy of index `dropped` (if any)."""
    table = f"{source}_probe"
    pg.execute(f"CREATE TABLE {table} (LIKE {source} INCLUDING ALL)")
    if dropped:
        found = pg.execute(
            "SELECT p.indexname FROM pg_indexes p JOIN pg_indexes s "
            "ON split_part(p.indexdef, ' USING ', 2) = split_part(s.indexdef, ' USING ', 2) "
            "WHERE p.tablename = %s AND s.indexname = %s",
            (table, dropped),
        ).fetchall()
        assert len(found) == 1, found
        pg.execute(f"DROP INDEX {found[0][0]}")
    return table


def intervals_run(pg: psycopg.Connection[Any], dropped: str, messages: int) -> float:
    """Median CPU (ms) per message of the intervals' writes."""
    table = probe_table(pg, "allocation_intervals", dropped)
    going = [interval(f"w{j}", T0 + j * 0.004, None) for j in range(5000)]
    done = [
        interval(f"w{j + 5000}", T0 - 600 + j * 0.004, T0 - 300 + j * 0.004) for j in range(5000)
    ]
    open_ids = [r[0] for r in pg.execute(_INSERT.format(t=table), (json.dumps(going),))]
    pg.execute(_INSERT.format(t=table), (json.dumps(done),))
    pg.commit()
    pg.execute(f"ANALYZE {table}")
    pg.commit()
    pid = pg.info.backend_pid
    spent: list[int] = []
    for m in range(messages):
        at = T0 + 30.0 * (m + 1)
        stops, open_ids = open_ids[:10], open_ids[10:]
        rows = [interval(f"n{m}-{k}", at, None) for k in range(10)]
        rows += [interval(f"s{m}-{k}", at - 200.0, at) for k in range(10)]
        before = cpu_ns(pid)
        with pg.cursor() as cur:
            cur.execute(f"DELETE FROM {table} WHERE id = ANY(%s::int8[])", (stops,))
            new_ids = cur.execute(_INSERT.format(t=table), (json.dumps(rows),)).fetchall()
        pg.commit()
        spent.append(cpu_ns(pid) - before)
        open_ids += [r[0] for r in new_ids[:10]]
    pg.execute(f"DROP TABLE {table}")
    pg.commit()
    return statistics.median(spent) / 1e6


def workloads_run(pg: psycopg.Connection[Any], dropped: str, messages: int) -> float:
    """Median CPU (ms) per message of 20 workloads locked and their states updated."""
    table = probe_table(pg, "workloads", dropped)
    pg.execute(
        f"INSERT INTO {table} (uid, queue, pool, state, spec, spec_digest, submit_time) "
        "SELECT 'w' || g, 'q' || (g % 8), 'main', 'running', '{}'::jsonb, '', now() "
        "FROM generate_series(0, 9999) g"
    )
    pg.commit()
    pg.execute(f"ANALYZE {table}")
    pg.commit()
    pid = pg.info.backend_pid
    spent: list[int] = []
    for m in range(messages):
        uids = sorted(f"w{(m * 20 + k) % 10000}" for k in range(20))
        state = "finished" if (m // 500) % 2 == 0 else "running"
        before = cpu_ns(pid)
        with pg.cursor() as cur:
            cur.execute(
                f"SELECT uid FROM {table} WHERE uid = ANY(%s::text[]) ORDER BY uid "
                "FOR NO KEY UPDATE",
                (uids,),
            )
            cur.execute(
                f"UPDATE {table} w SET state = r.state, state_changed_at = now() "
                "FROM unnest(%s::text[], %s::text[]) AS r(uid, state) WHERE w.uid = r.uid",
                (uids, [state] * 20),
            )
        pg.commit()
        spent.append(cpu_ns(pid) - before)
    pg.execute(f"DROP TABLE {table}")
    pg.commit()
    return statistics.median(spent) / 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=400)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    with test_server() as server, scratch_database(server.url, prefix="gpufair_bench") as url:
        migrate.upgrade(url)
        libpq = make_url(normalise_url(url)).set(drivername="postgresql").render_as_string(False)
        with psycopg.connect(libpq) as pg:
            found: dict[str, list[float]] = {}
            for _ in range(args.repeats):
                for dropped in ("", *INTERVAL_INDEXES):
                    key = f"intervals' writes, without {dropped or 'none'}"
                    found.setdefault(key, []).append(intervals_run(pg, dropped, args.messages))
                for dropped in ("", *WORKLOAD_INDEXES):
                    key = f"workloads' lock and update, without {dropped or 'none'}"
                    found.setdefault(key, []).append(workloads_run(pg, dropped, args.messages))
            for key, values in found.items():
                runs = ", ".join(f"{v:.3f}" for v in values)
                print(f"{key:66s} {statistics.median(values):.3f} ms per message ({runs})")


if __name__ == "__main__":
    main()
