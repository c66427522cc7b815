"""PostgreSQL's CPU per statement of one ingest batch of the churn mix, against the COPY of the
batch's events alone: what a run costs the database beyond its events.

    python bench/ingest_statements.py [--events 50000] [--batches 5]

A database is made as `bench_ingest.py` makes it and the churn mix is streamed through a
`gpufair serve` process until `--batches` messages are left. Each of those is then taken apart
on one connection, statement by statement as `store/ingest_pipeline.py` sends them (not
pipelined), in a transaction that is rolled back, and the CPU the backend spent on each is read
from `/proc/<pid>/schedstat` (nanoseconds on CPU: steady on a shared machine, where wall time
is not). Variants of the interval insert show where its cost lies: the same rows by binary
COPY, by COPY with the GiST index on the run's time range dropped, and with that index built as
SP-GiST instead (all inside the transaction, rolled back).
PostgreSQL must run on this machine.
"""

from __future__ import annotations

import argparse
import json
import statistics
import struct
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
from bench_ingest import cluster, events_for, libpq_url, messages, start_server
from server_process import free_port, wait_serving

from gpufair.client import GpufairClient
from gpufair.config_file import parse_config
from gpufair.domain.model import Workload
from gpufair.store import ingest_pipeline, migrate, runs_repo, workload_repo
from gpufair.store.database import make_engine
from gpufair.store.event_codec import COPY_EVENTS_SQL, copy_stream, text_array
from gpufair.store.known_workloads import KnownWorkloads
from gpufair.store.scratch import scratch_database, test_server

BATCH = 2000
_PG_EPOCH_S = 946_684_800
_INTERVALS_COPY = (
    "COPY allocation_intervals (workload_uid, start_event_id, gpu_type, pool, gpus, cu, "
    "started_at, ended_at, queue, end_kind, pods) FROM STDIN (FORMAT BINARY)"
)


def _field(data: bytes | None) -> bytes:
    return struct.pack(">i", -1) if data is None else struct.pack(">i", len(data)) + data


def _micros(epoch_s: float) -> bytes:
    return struct.pack(">q", round((epoch_s - _PG_EPOCH_S) * 1e6))


def interval_row(r: runs_repo.IntervalRecord) -> bytes:
    """One allocation interval as a row of binary COPY (an experiment: ingest inserts them from
    one JSON document)."""
    ended = None if r.ended_at_s is None else _micros(r.ended_at_s)
    return b"".join(
        (
            struct.pack(">h", 11),
            _field(r.workload_uid.encode()),
            _field(bytes.fromhex(r.start_event_id.replace("-", ""))),
            _field(r.gpu_type.encode()),
            _field(r.pool.encode()),
            _field(struct.pack(">d", r.gpus)),
            _field(struct.pack(">d", r.cu)),
            _field(_micros(r.started_at_s)),
            _field(ended),
            _field(r.queue.encode()),
            _field(None if r.end_kind is None else r.end_kind.encode()),
            _field(b"\x01" + json.dumps(r.pods).encode()),
        )
    )


def measure(url: str, events: list[Any], batches: int) -> dict[str, list[float]]:
    spent: dict[str, list[float]] = {}
    with psycopg.connect(libpq_url(url)) as pg:
        backend = pg.execute("SELECT pg_backend_pid()").fetchone()
        assert backend is not None
        stat = Path(f"/proc/{backend[0]}/schedstat")

        def cpu_ms() -> float:
            return int(stat.read_text().split()[0]) / 1e6

        def timed(name: str, action: Callable[..., object], *args: object) -> None:
            before = cpu_ms()
            action(*args)
            spent.setdefault(name, []).append(cpu_ms() - before)

        def fetch(sql: str, params: tuple[object, ...]) -> None:
            pg.execute(sql, params).fetchall()

        def copy_in(sql: str, data: bytes) -> None:
            with pg.cursor() as cur, cur.copy(sql) as copy:
                copy.write(data)

        for k in range(batches):
            chunk = events[len(events) - (batches - k) * BATCH :][:BATCH]
            batch = ingest_pipeline.prepare(chunk, time.time())
            uids = (text_array(sorted({e.workload_uid for e in chunk})),)
            pg.execute("SET LOCAL jit = off")
            pg.execute("SET LOCAL plan_cache_mode = force_generic_plan")
            # The internals of the pipeline, taken apart on purpose.
            timed(
                "read: lock the batch's workloads", fetch, ingest_pipeline._RUN_WORKLOADS_SQL, uids
            )
            timed("read: their earlier run events", fetch, runs_repo.RUN_EVENTS_SQL, uids)
            timed("read: their intervals", fetch, runs_repo.INTERVALS_SQL, uids)
            ctx = ingest_pipeline._read_context(
                pg, batch.candidates, ingest_pipeline.Overlap(), KnownWorkloads(0)
            )
            keep = ingest_pipeline._validate(batch, ctx)
            plan = ingest_pipeline._plan(keep, ctx).change
            rows = copy_stream(c.copy_row for c in sorted(keep, key=lambda c: c.event_id))
            timed("COPY of the batch's events", copy_in, COPY_EVENTS_SQL, rows)
            states = sorted(plan.states)
            values = (text_array(states), text_array(plan.states[u].value for u in states))
            timed("write: workload states", pg.execute, ingest_pipeline._STATE_UPDATE_SQL, values)
            pg.execute("SAVEPOINT variants")
            document = (json.dumps([r[1:] for r in plan.insert]),)
            timed(
                "write: intervals (JSON insert, as ingest)",
                pg.execute,
                runs_repo._INSERT_SQL,
                document,
            )
            intervals = copy_stream(interval_row(r) for r in plan.insert)
            pg.execute("ROLLBACK TO SAVEPOINT variants")
            timed("variant: intervals by binary COPY", copy_in, _INTERVALS_COPY, intervals)
            pg.execute("ROLLBACK TO SAVEPOINT variants")
            pg.execute("DROP INDEX ix_allocation_intervals_span")
            timed(
                "variant: the same COPY without the GiST span index",
                copy_in,
                _INTERVALS_COPY,
                intervals,
            )
            pg.execute("ROLLBACK TO SAVEPOINT variants")
            pg.execute("DROP INDEX ix_allocation_intervals_span")
            pg.execute(
                "CREATE INDEX span_spgist ON allocation_intervals "
                "USING spgist (tstzrange(started_at, ended_at, '[)'))"
            )
            timed("variant: the same COPY, span index SP-GiST", copy_in, _INTERVALS_COPY, intervals)
            spent.setdefault("runs in the batch", []).append(len(plan.insert))
            pg.rollback()
    return spent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=50_000)
    parser.add_argument("--batches", type=int, default=5)
    args = parser.parse_args()
    t0 = time.time() - 3 * 86400
    n_workloads = args.events // 5
    events = events_for(n_workloads, t0)
    streamed = events[: len(events) - args.batches * BATCH]
    with test_server() as server, scratch_database(server.url, prefix="gpufair_bench") as url:
        migrate.upgrade(url)
        port = free_port()
        process = start_server(url, port)
        engine = make_engine(url)
        try:
            wait_serving(f"127.0.0.1:{port}", process)
            with GpufairClient(f"127.0.0.1:{port}", timeout_s=600) as client:
                client.apply_config(parse_config(cluster()))
                with engine.connect() as conn:
                    for i in range(0, n_workloads, 5000):
                        workload_repo.submit(
                            conn,
                            [
                                Workload(f"w{w}", f"q{w % 8}", "main", 1, 1, t0)
                                for w in range(i, min(n_workloads, i + 5000))
                            ],
                        )
                    conn.commit()
                client.ledger.StreamEvents(iter(messages(streamed, BATCH)), timeout=900)
        finally:
            process.terminate()
            process.wait(30)
            engine.dispose()
        spent = measure(url, events, args.batches)
    copy = statistics.median(spent["COPY of the batch's events"])
    print(f"PostgreSQL CPU per message of {BATCH} churn events (median of {args.batches}):")
    for name, values in spent.items():
        median = statistics.median(values)
        if name == "runs in the batch":
            print(f"  {name}: {median:.0f}")
        else:
            print(f"  {name:55s} {median:7.2f} ms  {median / copy:5.2f} x COPY")


if __name__ == "__main__":
    main()
