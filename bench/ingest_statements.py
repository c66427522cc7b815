"""PostgreSQL's CPU per statement of one ingest batch of the churn mix, against the COPY of the
batch's events alone: what a run costs the database beyond its events.

    python bench/ingest_statements.py [--events 50000] [--batches 5]

A database is made as `bench_ingest.py` makes it and the churn mix is streamed through a
`gpufair serve` process until `--batches` messages are left. Each of those is then taken apart
on one connection, statement by statement as `store/ingest_pipeline.py` sends them (not
pipelined), in a transaction that is rolled back, and the CPU the backend spent on each is read
from `/proc/<pid>/schedstat` (nanoseconds on CPU: steady on a shared machine, where wall time
is not). Variants of the interval insert show where its cost lies: the same rows by binary COPY
(encoded here as the events are), and the JSON insert with the GiST index on the run's time
range over every run (as before migration 0015, which leaves runs under an hour out of it) or
built as SP-GiST instead (all inside the transaction, rolled back).
PostgreSQL must run on this machine.

    python bench/ingest_statements.py --from-log LOG [--messages 11] [--events 20100]

reads instead a piece of PostgreSQL's server log written by a stream run with
`PGOPTIONS="-c log_statement_stats=on -c log_statement=all"` (for example `ingest_python.py
--stream --events 20000`, whose timed stream is 20,100 steady events in 11 messages), and sums
the CPU (user + system) of each statement's parse, bind and execute over the last `--messages`
messages of the backend that logged the most: per message and per event, statement by
statement and by phase. Logging's own cost is included.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import statistics
import struct
import time
from collections.abc import Callable, Mapping, Sequence
from json.encoder import encode_basestring_ascii as _quote
from pathlib import Path
from typing import Any

import psycopg
from bench_ingest import (
    assert_all_stored,
    cluster,
    events_for,
    libpq_url,
    messages,
    start_server,
    submit_workloads,
)
from server_process import free_port, wait_serving

from gpufair.client import GpufairClient
from gpufair.config_file import parse_config
from gpufair.store import (
    ingest_context,
    ingest_pipeline,
    ingest_validate,
    ingest_writes,
    migrate,
    runs_repo,
)
from gpufair.store.database import make_engine
from gpufair.store.event_codec import COPY_EVENTS_SQL, copy_stream, text_array
from gpufair.store.known_workloads import KnownWorkloads
from gpufair.store.scratch import scratch_database, test_server

BATCH = 2000


# The experiment: a batch's intervals by binary COPY, encoded as store/event_codec.py encodes
# events (ingest itself sends them as one JSON document, `runs_repo.queue_writes`).
COPY_INTERVALS_SQL = (
    "COPY allocation_intervals (workload_uid, start_event_id, gpu_type, pool, gpus, cu, "
    "started_at, ended_at, queue, end_kind, pods) FROM STDIN (FORMAT BINARY)"
)
_LENGTH_PACK = struct.Struct(">i").pack
_INTERVAL_FIELDS = b"\x00\x0b"  # 11
_UUID_FIELD = struct.Struct(">i16s")
_AMOUNTS = struct.Struct(">idid")  # gpus, cu: float8 each
_INSTANT = struct.Struct(">iq")  # a timestamptz
_NULL = _LENGTH_PACK(-1)


def _micros(epoch_s: float) -> int:
    """As `to_timestamp` stores it (event_codec does the same for events)."""
    return round((epoch_s - 946_684_800) * 1e6)


def _text_field(value: str) -> bytes:
    data = value.encode()
    return _LENGTH_PACK(len(data)) + data


def interval_copy_row(
    workload_uid: str,
    start_event_id: str,
    gpu_type: str,
    pool: str,
    gpus: float,
    cu: float,
    started_at_s: float,
    ended_at_s: float | None,
    queue: str,
    end_kind: str | None,
    pods: Sequence[Mapping[str, Any]],
) -> bytes:
    """One row of COPY_INTERVALS_SQL (the fields of an interval record after its id).
    Instants are stored as `to_timestamp` stores them."""
    pods_json = _interval_pods_json(pods).encode()
    return b"".join(
        (
            _INTERVAL_FIELDS,
            _text_field(workload_uid),
            _UUID_FIELD.pack(16, bytes.fromhex(start_event_id.replace("-", ""))),
            _text_field(gpu_type),
            _text_field(pool),
            _AMOUNTS.pack(8, gpus, 8, cu),
            _INSTANT.pack(8, _micros(started_at_s)),
            _NULL if ended_at_s is None else _INSTANT.pack(8, _micros(ended_at_s)),
            _text_field(queue),
            _NULL if end_kind is None else _text_field(end_kind),
            _LENGTH_PACK(len(pods_json) + 1),
            b"\x01",
            pods_json,
        )
    )


def _interval_pods_json(pods: Sequence[Mapping[str, Any]]) -> str:
    """An interval's pods as JSON: written out for the plain types runs are made of (the
    server keeps jsonb, so only the value counts), through json.dumps for anything else."""
    parts = []
    for p in pods:
        fraction, indices = p["gpu_fraction"], p["gpu_indices"]
        if type(fraction) is not float or not math.isfinite(fraction):
            return json.dumps(pods)
        if any(type(g) is not int for g in indices):
            return json.dumps(pods)
        parts.append(
            f'{{"gpu_fraction":{fraction!r},"gpu_indices":[{",".join(map(str, indices))}],'
            f'"node":{_quote(p["node"])}}}'
        )
    return "[" + ",".join(parts) + "]"


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
                "read: lock the batch's workloads", fetch, ingest_context._RUN_WORKLOADS_SQL, uids
            )
            timed("read: their earlier run events", fetch, runs_repo.RUN_EVENTS_SQL, uids)
            timed("read: their intervals", fetch, runs_repo.INTERVALS_SQL, uids)
            ctx = ingest_context._read_context(
                pg, [batch], ingest_pipeline.Overlap(), KnownWorkloads(0)
            )
            keep = ingest_validate._validate(batch, ctx)
            assert len(keep) == len(chunk), f"{len(keep)} of {len(chunk)} events valid"
            plan = ingest_writes._plan(keep, ctx).change
            rows = copy_stream(c.copy_row for c in sorted(keep, key=lambda c: c.event_id))
            timed("COPY of the batch's events", copy_in, COPY_EVENTS_SQL, rows)
            states = sorted(plan.states)
            values = (text_array(states), text_array(plan.states[u].value for u in states))
            timed("write: workload states", pg.execute, ingest_writes._STATE_UPDATE_SQL, values)
            pg.execute("SAVEPOINT variants")
            document = (json.dumps([r[1:] for r in plan.insert]),)
            timed(
                "write: intervals by one JSON document (as ingest)",
                pg.execute,
                runs_repo._INSERT_SQL,
                document,
            )
            intervals = copy_stream(interval_copy_row(*r[1:]) for r in plan.insert)
            pg.execute("ROLLBACK TO SAVEPOINT variants")
            timed(
                "variant: the same intervals by binary COPY",
                copy_in,
                COPY_INTERVALS_SQL,
                intervals,
            )
            pg.execute("ROLLBACK TO SAVEPOINT variants")
            pg.execute("DROP INDEX ix_allocation_intervals_long_span")
            pg.execute(
                "CREATE INDEX ix_allocation_intervals_span ON allocation_intervals "
                "USING gist (tstzrange(started_at, ended_at, '[)'))"
            )
            timed(
                "variant: the JSON document, GiST span index over all runs (before 0015)",
                pg.execute,
                runs_repo._INSERT_SQL,
                document,
            )
            pg.execute("ROLLBACK TO SAVEPOINT variants")
            pg.execute("DROP INDEX ix_allocation_intervals_long_span")
            pg.execute(
                "CREATE INDEX span_spgist ON allocation_intervals "
                "USING spgist (tstzrange(started_at, ended_at, '[)'))"
            )
            timed(
                "variant: the JSON document, span index SP-GiST over all runs",
                pg.execute,
                runs_repo._INSERT_SQL,
                document,
            )
            spent.setdefault("runs in the batch", []).append(len(plan.insert))
            pg.rollback()
    return spent


_LOG_ENTRY = re.compile(r"\n(?=\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+ \w+ \[)")
_LOG_HEAD = re.compile(r"\S+ \S+ \w+ \[(\d+)\] \S* ?(LOG|DETAIL|STATEMENT):\s+(.*)", re.S)
_USAGE = re.compile(r"([\d.]+) s user, ([\d.]+) s system")
_STATS = ("PARSE MESSAGE", "BIND MESSAGE", "EXECUTE MESSAGE", "QUERY")


def statement_stats(log: str) -> dict[str, list[tuple[str, str, float]]]:
    """(phase, statement's first 60 characters, CPU s) of every `log_statement_stats` entry of
    `log`, in order, by backend pid."""
    by_pid: dict[str, list[tuple[str, str, float]]] = {}
    pending: tuple[str, str, float | None] | None = None
    for entry in _LOG_ENTRY.split(log):
        head = _LOG_HEAD.match(entry)
        if head is None:
            continue
        pid, kind, body = head.groups()
        if kind == "LOG" and body.startswith(tuple(f"{s} STATISTICS" for s in _STATS)):
            pending = (pid, body.split()[0], None)
        elif kind == "DETAIL" and pending and pending[0] == pid:
            usage = _USAGE.search(body)
            if usage:
                pending = (pid, pending[1], float(usage[1]) + float(usage[2]))
        elif kind == "STATEMENT" and pending and pending[0] == pid and pending[2] is not None:
            statement = " ".join(body.split())[:60]
            by_pid.setdefault(pid, []).append((pending[1], statement, pending[2]))
            pending = None
    return by_pid


def report_log(path: str, messages: int, events: int) -> None:
    """Print `statement_stats` of the busiest backend's last `messages` messages (each ends
    with its COMMIT), per message and per event."""
    by_pid = statement_stats(Path(path).read_text(errors="replace"))
    pid, rows = max(by_pid.items(), key=lambda item: len(item[1]))
    commits = [i for i, (phase, s, _) in enumerate(rows) if s == "COMMIT" and phase == "EXECUTE"]
    rows = rows[commits[-messages - 1] + 1 :]
    by_statement: dict[str, float] = {}
    by_phase: dict[str, float] = {}
    for phase, statement, cpu_s in rows:
        by_statement[statement] = by_statement.get(statement, 0.0) + cpu_s
        by_phase[phase] = by_phase.get(phase, 0.0) + cpu_s
    print(f"backend {pid}, last {messages} messages, {events} events:")
    for statement, cpu_s in sorted(by_statement.items(), key=lambda item: -item[1]):
        print(
            f"  {cpu_s / messages * 1e3:7.3f} ms/message {cpu_s / events * 1e6:6.3f} µs/event  "
            f"{statement}"
        )
    total = sum(by_statement.values())
    print(f"  {total / messages * 1e3:7.3f} ms/message {total / events * 1e6:6.3f} µs/event  all")
    for phase, cpu_s in by_phase.items():
        print(f"  {phase.lower()}: {cpu_s / events * 1e6:.3f} µs/event")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=50_000)
    parser.add_argument("--batches", type=int, default=5)
    parser.add_argument("--from-log", help="sum a server log's statement statistics instead")
    parser.add_argument("--messages", type=int, default=11, help="with --from-log")
    args = parser.parse_args()
    if args.from_log:
        report_log(args.from_log, args.messages, args.events)
        return
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
                submit_workloads(engine, n_workloads, t0)
                reply = client.ledger.StreamEvents(iter(messages(streamed, BATCH)), timeout=900)
                assert_all_stored([reply], len(streamed))
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
