"""Ledger ingest through gRPC streaming vs a raw psycopg COPY into the same table, in one run.

    python bench/bench_ingest.py [--events 100000] [--batch 2000] [--rounds 3] [--mix both]
                                 [--streams 1] [--spread] [--method warm|old]
                                 [--warm PARTS] [--db-stats] [--timeline]

The gRPC path is the whole service path: `gpufair serve` started as its own process (as it is
deployed), on a loopback port, StreamEvents, per-event validation, idempotent insert, runs
re-derived, commit before the reply. The client builds its messages before the clock starts, as
a batch system has its events before it sends them. The COPY path writes the same rows (same
payload and digest) straight into a table made like `ledger_events` (its columns, checks and
indexes) and does nothing else: the ceiling a database client could reach for that table. It
has a table of its own, holding what `ledger_events` holds when the clock starts (the steady
mix's earlier starts, written before the clock), so that the stream meets the ledger as it was
left: the runs its stops end have their starts stored. Each round uses a new database and runs
both, one after the other, so the ratio is fair on a shared, noisy machine; the summary is the
median of the rounds' ratios. The CPU seconds of the server process, the client and the
PostgreSQL backends during the stream, per event, show which side bounds the rate; the CPU of
the COPY's own backend and client (`copy_us_per_event_*`) is what the same rows cost the
database and a client without the service.

Both sides start warm (`--method warm`, the default since round 30). The COPY's connection is
open, and has copied the rows written before the clock, when its clock starts; the server's
connections are as a server that has run for a while has them: the rows written before the
clock (the steady mix's earlier starts, and `WARM_RUNS_PER_STREAM` short runs of workloads of
their own, finished before the mix's first event, in both mixes) go over the timed streams' own
connections, split by workload as the timed events are, so each of the server's workers has
opened its database connection, run a message's statements on it (prepared) and seen the
workloads of its stream going, before the clock starts. The COPY's table holds the same rows.

Why warm is the fair comparison (round 31): the two sides then differ only in what each does
per row. `--method old` measures as rounds up to 29 did: the earlier starts over one stream of
their own, before the timed streams' connections are opened, no warm-up runs, and the lock
sampler's connection opened after the clock starts; the worker that had not taken that stream
opened its database connection (a new backend, its catalog caches, its first plans) and looked
up the 2,500 workloads of its stream inside the timed stream, one-time costs the COPY, its
connection open and its table written before its clock, did not pay, and a server that has run
a while does not pay per stream either. The warm-up gives the stream nothing the COPY lacks:
both sides' tables are in PostgreSQL's shared buffers when their clocks start (the blocks either
side reads in its window are the pages it adds, alike in both methods, `--db-stats`), the
server and the database's other processes do next to nothing beside the COPY, alike in both
methods (`server_cpu_ms_in_copy`, `postgres_other_cpu_ms_in_copy`: a few ms), and the COPY has
no plan to cache.
Each part of the warm method can be switched on alone (`--warm`, `WARM_PARTS`;
`ingest_warm_parts.py` alternates them), and `ingest_cold_worker.py` measures, message by
message, what a worker that has not written pays for its stream against one that has.

Each stream's timings (`stream_timings`) say when gRPC took its first and last message, when its
reply came, whether its worker holds the client's connection (in the old method, the worker
that took the setup stream), and the CPU of that worker and of its backends over the stream.
`--timeline` samples the CPU of the workers, the backends and the machine every 2 ms
(`cpu_timeline.py`).

With `--streams N` the timed events go over N streams at once, each on a connection of its own
(a batch system reporting from several places), split by workload so that each workload's
events stay in order on one stream. `gpufair serve` runs a worker process per core behind one
port; the kernel picks a worker for each connection, so the CPU of every worker is reported
(`server_cpu_share_by_worker`), and how many streams each took (`streams_by_worker`); with
`--spread` the connections are opened again until they are spread evenly.

Two mixes of events:
- `churn`: every run is new and short: started, 3 heartbeats, stopped (40% run events, so each
  message starts and ends hundreds of runs: the most writing per event ingest can be asked for).
- `steady`: a cluster at work, as in the recorded trace: `events / 10` runs are going when the
  clock starts (their starts are sent before it); the stream is 10 rounds of one heartbeat per
  run, 30 s apart, and in each round one run in 200 stops and a new one starts in its place (1%
  run events; in the Alibaba GPU trace, whose runs last 7.6 hours on average, heartbeats every
  30 s would leave 0.2%).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import itertools
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, NamedTuple

import grpc
import psycopg
from server_process import (
    backend_cpu_s,
    backends_used,
    cpu_seconds,
    free_port,
    tree,
    tree_cpu_s,
    wait_serving,
)
from sqlalchemy.engine import Engine, make_url

from gpufair.client import GpufairClient, channel_options
from gpufair.config_file import parse_config
from gpufair.domain.ledger import EventKind, EventPod, LedgerEvent
from gpufair.domain.model import Workload
from gpufair.store import migrate, workload_repo
from gpufair.store.database import make_engine
from gpufair.store.event_codec import payload_json
from gpufair.store.scratch import scratch_database, test_server
from gpufair.v1 import ledger_pb2, ledger_pb2_grpc

NODES = 64
EVENTS_PER_WORKLOAD = 5  # started, 3 heartbeats, stopped


def cluster() -> dict[str, object]:
    return {
        "gpu_types": [{"name": "a100", "memory_gib": 80, "compute_weight": 10}],
        "pools": [{"name": "main"}],
        "nodes": [
            {
                "name": f"n{i}",
                "pool": "main",
                "gpu_type": "a100",
                "gpu_count": 8,
                "cpu_millicores": 64000,
                "memory_mib": 524288,
            }
            for i in range(NODES)
        ],
        "queues": [
            {"name": f"q{i}", "quotas": [{"pool": "main", "deserved_cu": 10}]} for i in range(8)
        ],
    }


def events_for(n_workloads: int, t0: float) -> list[LedgerEvent]:
    events: list[LedgerEvent] = []
    for w in range(n_workloads):
        uid = f"w{w}"
        start = t0 + w * 0.5
        pods = (EventPod(f"n{w % NODES}", (w % 8,)),)
        events.append(LedgerEvent(str(uuid.uuid4()), EventKind.STARTED, start, uid, pods))
        for k in range(1, 4):
            events.append(LedgerEvent(str(uuid.uuid4()), EventKind.HEARTBEAT, start + 60 * k, uid))
        events.append(LedgerEvent(str(uuid.uuid4()), EventKind.STOPPED, start + 300, uid))
    return events


STEADY_ROUNDS = 10
STEADY_REPLACED_EVERY = 200  # one run in this many stops, and a new one starts, each round


def steady_events(n_events: int, t0: float) -> tuple[list[LedgerEvent], list[LedgerEvent], int]:
    """(the starts of the runs going when the clock starts, the timed stream, workloads used)."""
    slots = n_events // STEADY_ROUNDS
    uids = [f"w{j}" for j in range(slots)]
    next_uid = slots

    def start(uid: str, at: float, slot: int) -> LedgerEvent:
        pods = (EventPod(f"n{slot % NODES}", (slot % 8,)),)
        return LedgerEvent(str(uuid.uuid4()), EventKind.STARTED, at, uid, pods)

    # Spread over the 20 s before the first round (at 30 s): a stop never precedes its start.
    before = [start(uid, t0 + j * 20.0 / slots, j) for j, uid in enumerate(uids)]
    timed: list[LedgerEvent] = []
    for k in range(1, STEADY_ROUNDS + 1):
        at = t0 + 30.0 * k
        for j in range(slots):
            if j % STEADY_REPLACED_EVERY == k % STEADY_REPLACED_EVERY:
                timed.append(LedgerEvent(str(uuid.uuid4()), EventKind.STOPPED, at, uids[j]))
                uids[j], next_uid = f"w{next_uid}", next_uid + 1
                timed.append(start(uids[j], at + 0.5, j))
            else:
                timed.append(LedgerEvent(str(uuid.uuid4()), EventKind.HEARTBEAT, at, uids[j]))
    return before, timed, next_uid


WARM_RUNS_PER_STREAM = 20  # `--method warm`: short runs per stream before the clock

# The parts of `--method warm`, each of which can be switched on alone (`--warm`):
# - sampler: the lock sampler's connection opened before the clock, not after it starts;
# - transport: the timed channels opened before the COPY and, before the clock, carrying one
#   ReportEvents message as large as each timed one whose events are all refused before the
#   database (ids not UUIDs): the connections' HTTP/2 windows grown and the worker's conversion
#   run, no database touched;
# - connect: before the clock, each timed stream sends one message of one heartbeat of a
#   workload that does not exist: its worker opens its database connection (a backend) and runs
#   one read; nothing is written;
# - setup: the rows written before the clock (the steady mix's starts) go over the timed
#   streams, split by workload, not over one stream of their own: each worker writes, and
#   learns, the workloads of its stream (its connection opened on the way);
# - runs: WARM_RUNS_PER_STREAM short runs per stream written before the clock (over the timed
#   streams with `setup`, else over the setup stream), and held by the COPY's table too.
WARM_PARTS = ("sampler", "transport", "connect", "setup", "runs")
METHODS = {"old": frozenset[str](), "warm": frozenset({"sampler", "setup", "runs"})}


def warm_runs(first_uid: int, n_runs: int, t0: float) -> list[LedgerEvent]:
    """`n_runs` short runs (started, 3 heartbeats, stopped) of workloads w<first_uid>.., all
    over an hour before `t0`: the warm-up of `--method warm`, in both mixes."""
    events: list[LedgerEvent] = []
    for j in range(n_runs):
        w, start = first_uid + j, t0 - 7200.0 + j * 0.5
        pods = (EventPod(f"n{w % NODES}", (w % 8,)),)
        events.append(LedgerEvent(str(uuid.uuid4()), EventKind.STARTED, start, f"w{w}", pods))
        for k in range(1, 4):
            at = start + 60 * k
            events.append(LedgerEvent(str(uuid.uuid4()), EventKind.HEARTBEAT, at, f"w{w}"))
        events.append(LedgerEvent(str(uuid.uuid4()), EventKind.STOPPED, start + 300, f"w{w}"))
    return events


def to_proto(e: LedgerEvent) -> ledger_pb2.LedgerEvent:
    msg = ledger_pb2.LedgerEvent(event_id=e.event_id, workload_uid=e.workload_uid)
    msg.kind = {
        EventKind.STARTED: ledger_pb2.EVENT_KIND_STARTED,
        EventKind.HEARTBEAT: ledger_pb2.EVENT_KIND_HEARTBEAT,
        EventKind.STOPPED: ledger_pb2.EVENT_KIND_STOPPED,
    }[e.kind]
    msg.occurred_at.FromNanoseconds(round(e.occurred_at_s * 1e9))
    for p in e.pods:
        msg.pods.add(node=p.node, gpu_indices=list(p.gpu_indices), gpu_fraction=p.gpu_fraction)
    return msg


def mix_events(
    mix: str, n_events: int, t0: float
) -> tuple[list[LedgerEvent], list[LedgerEvent], int]:
    """The events of `mix` (see the module's docstring): those sent before the clock starts (the
    steady mix's runs going), the timed ones, and the workloads they name."""
    if mix == "churn":
        n_workloads = n_events // EVENTS_PER_WORKLOAD
        return [], events_for(n_workloads, t0), n_workloads
    return steady_events(n_events, t0)


def messages(events: list[LedgerEvent], batch: int) -> list[ledger_pb2.ReportEventsRequest]:
    return [
        ledger_pb2.ReportEventsRequest(events=[to_proto(e) for e in events[i : i + batch]])
        for i in range(0, len(events), batch)
    ]


def libpq_url(url: str) -> str:
    return make_url(url).set(drivername="postgresql").render_as_string(False)


class CopyRun(NamedTuple):
    events_per_s: float
    postgres_cpu_s: float  # of the COPY's backend (nan when PostgreSQL is not on this machine)
    client_cpu_s: float
    beside_cpu_s: tuple[float, ...] = ()
    pages: int = 0  # of the COPY's table and its indexes, once written (blocks of 8 KiB)


RAW_COPY_SQL = (
    "COPY {table} (event_id, workload_uid, kind, occurred_at, payload, payload_digest) FROM STDIN"
)
RAW_COPY_TABLE = "raw_copy_events"  # `copy_rate`'s, made like ledger_events, dropped after


def raw_row(e: LedgerEvent) -> tuple[str, str, str, datetime, str, str]:
    """`e`'s row of RAW_COPY_SQL, made as a client without gpufair would make it."""
    payload = payload_json(e)
    digest = hashlib.sha256(payload.encode()).hexdigest()
    return (
        e.event_id,
        e.workload_uid,
        e.kind.value,
        datetime.fromtimestamp(e.occurred_at_s, UTC),
        payload,
        digest,
    )


def copy_rate(
    url: str,
    events: list[LedgerEvent],
    before: list[LedgerEvent],
    beside: list[Callable[[int], float]] | None = None,
) -> CopyRun:
    """The raw COPY of `events`, timed, into a table that holds `before` as the stream's
    `ledger_events` does. `beside`: readings of CPU so far (s) of other processes (the server,
    PostgreSQL's other processes; given the COPY's backend's pid, to leave out), taken when the
    clock starts and when it stops, each pair's
    difference put in `CopyRun.beside_cpu_s`: what else ran while the COPY was timed."""
    with psycopg.connect(libpq_url(url)) as conn:
        conn.execute(f"CREATE TABLE {RAW_COPY_TABLE} (LIKE ledger_events INCLUDING ALL)")
        with conn.cursor() as cur, cur.copy(RAW_COPY_SQL.format(table=RAW_COPY_TABLE)) as copy:
            for e in before:
                copy.write_row(raw_row(e))
        conn.commit()
        backend = conn.execute("SELECT pg_backend_pid()").fetchone()
        pid = backend[0] if backend else 0

        def backend_cpu() -> float:
            try:
                return cpu_seconds(pid)
            except OSError:
                return math.nan

        others = beside or []
        others_before = [read(pid) for read in others]
        pg_before, client_before = backend_cpu(), time.process_time()
        start = time.perf_counter()
        with conn.cursor() as cur, cur.copy(RAW_COPY_SQL.format(table=RAW_COPY_TABLE)) as copy:
            for e in events:
                copy.write_row(raw_row(e))
        conn.commit()
        elapsed = time.perf_counter() - start
        run = CopyRun(
            len(events) / elapsed,
            backend_cpu() - pg_before,
            time.process_time() - client_before,
            tuple(read(pid) - b for read, b in zip(others, others_before, strict=True)),
            conn.execute(f"SELECT pg_total_relation_size('{RAW_COPY_TABLE}') / 8192").fetchone()[0],  # type: ignore[index]
        )
        conn.execute(f"DROP TABLE {RAW_COPY_TABLE}")
        conn.commit()
    return run


def start_server(url: str, port: int) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-m", "gpufair.cli", "serve", "--no-jobs"]
    command += ["--address", f"127.0.0.1:{port}", "--database-url", url, "--log-level", "warning"]
    command += ["--metrics-address", ""]  # no fixed port for another server to collide with
    return subprocess.Popen(command)


def split_by_workload(events: list[LedgerEvent], n: int) -> list[list[LedgerEvent]]:
    """`events` over `n` streams, each workload's on one (by the number in its uid), in order."""
    parts: list[list[LedgerEvent]] = [[] for _ in range(n)]
    for e in events:
        parts[int(e.workload_uid[1:]) % n].append(e)
    return parts


def connections_by_worker(server_pid: int, port: int) -> dict[int, int]:
    """How many established connections to `port` each process of the server holds (read from
    /proc: the sockets among each process's open files)."""
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(FileNotFoundError):
            for line in Path(table).read_text().splitlines()[1:]:
                fields = line.split()
                if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] == "01":
                    inodes.add(fields[9])
    found: dict[int, int] = {}
    for pid in tree(server_pid):
        count = 0
        with contextlib.suppress(FileNotFoundError, PermissionError):
            for fd in Path(f"/proc/{pid}/fd").iterdir():
                with contextlib.suppress(FileNotFoundError):
                    target = os.readlink(fd)
                    if target.startswith("socket:[") and target[8:-1] in inodes:
                        count += 1
        found[pid] = count
    return found


# A stream's reply holds a result per event: past about 100,000 events a stream it is larger than
# gRPC's default 4 MiB, so the channels allow the messages gpufair's own client allows.
_MESSAGE_SIZES = [o for o in channel_options() if o[0].endswith("message_length")]


def open_streams(
    address: str, n: int, server_pid: int, *, spread: bool, owners: list[int] | None = None
) -> tuple[list[grpc.Channel], list[int]]:
    """`n` channels, each on a connection of its own (channels with the same target would
    otherwise share one), connected; and how many of them each server process took (the pid
    of the process that took each channel is put in `owners`, when given). With
    `spread`, connections are opened again (up to 50 times) until no process holds more than
    its even share: the kernel places each connection on a worker by a hash of its addresses."""
    port = int(address.rsplit(":", 1)[1])
    before = connections_by_worker(server_pid, port)
    owners = [] if owners is None else owners
    for _ in range(50):
        channels = [
            grpc.insecure_channel(
                address, options=[*_MESSAGE_SIZES, ("grpc.use_local_subchannel_pool", 1)]
            )
            for _ in range(n)
        ]
        owners.clear()
        seen = before
        for c in channels:  # one at a time, to see which process takes each
            ledger_pb2_grpc.LedgerStub(c).StreamEvents(iter(()), timeout=60)
            now = connections_by_worker(server_pid, port)
            owners.extend(p for p in now if now[p] > seen.get(p, 0))
            seen = now
        after = connections_by_worker(server_pid, port)
        taken = sorted((after[p] - before.get(p, 0) for p in after), reverse=True)
        workers = max(1, sum(1 for p in after if p != server_pid))
        if not spread or taken[0] <= math.ceil(n / workers):
            return channels, [t for t in taken if t > 0]
        for c in channels:
            c.close()
        time.sleep(0.2)  # let the server drop them
    raise RuntimeError("connections did not spread over the server's workers")


def stream_all(
    channels: list[grpc.Channel],
    parts: list[list[ledger_pb2.ReportEventsRequest]],
    timings: list[dict[str, float]] | None = None,
) -> list[ledger_pb2.ReportEventsResponse]:
    """Each part on a stream of its own, on its own channel, all at once. With `timings`, one
    dict per stream is appended to it: when (s after the call) gRPC took its first and last
    message to send, and when its reply came."""
    replies: list[ledger_pb2.ReportEventsResponse | None] = [None] * len(parts)
    errors: list[BaseException] = []
    stubs = [ledger_pb2_grpc.LedgerStub(c) for c in channels]
    marks: list[dict[str, float]] = [{} for _ in parts]
    start = time.perf_counter()

    def sent(i: int) -> Iterator[ledger_pb2.ReportEventsRequest]:
        for k, request in enumerate(parts[i]):
            if k == 0:
                marks[i]["first_taken_s"] = time.perf_counter() - start
            yield request
        marks[i]["last_taken_s"] = time.perf_counter() - start

    def run(i: int) -> None:
        try:
            replies[i] = stubs[i].StreamEvents(sent(i), timeout=900)
            marks[i]["reply_s"] = time.perf_counter() - start
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(parts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    if timings is not None:
        timings.extend({k: round(v, 4) for k, v in m.items()} for m in marks)
    return [r for r in replies if r is not None]


class LockWaits:
    """Samples, every 50 ms while it runs, how many of the database's backends wait for a lock
    (two streams must not wait for each other): the count of such sightings."""

    def __init__(self, url: str) -> None:
        self._url, self.seen, self.samples = libpq_url(url), 0, 0
        self._stop, self._connected = threading.Event(), threading.Event()
        self._thread = threading.Thread(target=self._run)

    def __enter__(self) -> LockWaits:
        self._thread.start()
        return self

    def wait_connected(self) -> None:
        """Return once the sampler's connection is open (so that a clock started after this
        does not time its opening)."""
        while not self._connected.wait(0.05):
            if not self._thread.is_alive():
                raise RuntimeError("the lock sampler could not connect")

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        with psycopg.connect(self._url, autocommit=True) as conn:
            self._connected.set()
            while not self._stop.wait(0.05):
                row = conn.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                    "AND wait_event_type = 'Lock'"
                ).fetchone()
                self.seen += row[0] if row else 0
                self.samples += 1


def backend_cpu_ns(pids: Iterable[int]) -> dict[int, int]:
    """Nanoseconds on a CPU so far of each of `pids` (PostgreSQL backends, one thread each) that
    is alive, from /proc/<pid>/schedstat: finer than `backend_cpu_s`'s clock ticks (10 ms, 0.2
    µs per event of a 50,000-event stream)."""
    found: dict[int, int] = {}
    for pid in pids:
        with contextlib.suppress(OSError):
            found[pid] = int(Path(f"/proc/{pid}/schedstat").read_text().split()[0])
    return found


def worker_cpu_s(pid: int) -> dict[int, float]:
    found: dict[int, float] = {}
    for p in tree(pid):
        try:
            found[p] = cpu_seconds(p)
        except FileNotFoundError:
            continue
    return found


def submit_workloads(engine: Engine, n_workloads: int, t0: float) -> None:
    """Workloads w0.. of the events, eight queues, in batches of 5,000 (one transaction)."""
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


def assert_all_stored(replies: Iterable[ledger_pb2.ReportEventsResponse], n: int) -> None:
    results = [r for reply in replies for r in reply.results]
    refused = Counter(r.error for r in results if r.status != ledger_pb2.EVENT_STATUS_STORED)
    assert len(results) == n and not refused, f"{len(results)} of {n} answered, refused: {refused}"


def refused_messages(
    parts: list[list[ledger_pb2.ReportEventsRequest]],
) -> list[ledger_pb2.ReportEventsRequest]:
    """For each stream, a message as large as its first timed one whose events are all refused
    before the database (`--warm transport`): the same events under ids that are not UUIDs."""
    found = []
    for part in parts:
        message = ledger_pb2.ReportEventsRequest()
        message.CopyFrom(part[0])
        for e in message.events:
            e.event_id = e.event_id.replace("-", "z")  # as long, each its own, not a UUID
        found.append(message)
    return found


def warm_transport(
    channels: list[grpc.Channel], refused: list[ledger_pb2.ReportEventsRequest]
) -> None:
    """`--warm transport`: each channel carries its refused message over ReportEvents (which
    touches no database when nothing of a message can be stored)."""
    for channel, message in zip(channels, refused, strict=True):
        reply = ledger_pb2_grpc.LedgerStub(channel).ReportEvents(message, timeout=60)
        stored = [r for r in reply.results if r.status == ledger_pb2.EVENT_STATUS_STORED]
        assert len(reply.results) == len(message.events) and not stored


def warm_connect(channels: list[grpc.Channel]) -> None:
    """`--warm connect`: one heartbeat of a workload that does not exist on each timed stream;
    its worker opens its database connection and reads, and refuses the event."""
    message = ledger_pb2.ReportEventsRequest(
        events=[
            to_proto(
                LedgerEvent(str(uuid.uuid4()), EventKind.HEARTBEAT, time.time() - 60, "no-such")
            )
        ]
    )
    for reply in stream_all(channels, [[message] for _ in channels]):
        assert [r.status for r in reply.results] == [ledger_pb2.EVENT_STATUS_REJECTED]


TIMELINE_BUCKET_S = 0.05


def local_ports(pid: int) -> set[int]:
    """The local ports of the TCP sockets `pid` holds open (any thread of it)."""
    inodes: set[str] = set()
    with contextlib.suppress(OSError):
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            with contextlib.suppress(OSError):
                target = os.readlink(fd)
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
    ports: set[int] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(FileNotFoundError):
            for line in Path(table).read_text().splitlines()[1:]:
                fields = line.split()
                if fields[9] in inodes:
                    ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def backends_by_worker(url: str, workers: list[int]) -> dict[int, list[int]]:
    """The backends of `url`'s database each of `workers` is connected to (by the client port
    pg_stat_activity gives and the local ports of the worker's sockets)."""
    with psycopg.connect(libpq_url(url)) as conn:
        rows = conn.execute(
            "SELECT pid, client_port FROM pg_stat_activity WHERE datname = current_database() "
            "AND pid <> pg_backend_pid()"
        ).fetchall()
    found: dict[int, list[int]] = {}
    for worker in workers:
        ports = local_ports(worker)
        found[worker] = [pid for pid, port in rows if port in ports]
    return found


def ours_in_postgres(url: str) -> list[int]:
    """The pids of the backends of `url`'s database and of PostgreSQL's own writers (WAL writer,
    checkpointer, background writer), which the other databases on the server share."""
    with psycopg.connect(libpq_url(url)) as conn:
        rows = conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE (datname = current_database() AND pid <> "
            "pg_backend_pid()) OR backend_type IN ('walwriter', 'checkpointer', "
            "'background writer')"
        ).fetchall()
    return [r[0] for r in rows]


def postgres_cpu_s(pids: list[int], skip: int) -> float:
    """CPU so far (s, from schedstat) of `pids` but `skip`."""
    return sum(backend_cpu_ns(p for p in pids if p != skip).values()) / 1e9


def start_timeline(worker_pids: list[int], backend_pids: Iterable[int]) -> tuple[Any, str]:
    """`cpu_timeline.py` watching the server's workers and PostgreSQL's backends (the children
    of the postmaster, found from a backend's parent)."""
    parent = 0
    for pid in backend_pids:
        with contextlib.suppress(OSError):
            parent = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
            break
    out = str(Path(tempfile.gettempdir()) / f"cpu_timeline_{uuid.uuid4().hex[:8]}.json")
    command = [sys.executable, str(Path(__file__).with_name("cpu_timeline.py")), out]
    command += ["--pids", ",".join(map(str, worker_pids)), "--parent", str(parent)]
    sampler = subprocess.Popen(command, stdin=subprocess.PIPE)
    time.sleep(0.3)  # its interpreter started and sampling
    return sampler, out


def read_timeline(
    sampler: Any, out: str, start: float, end: float, owners: list[int]
) -> dict[str, Any]:
    """What `cpu_timeline.py` saw from `start` to `end` (perf_counter, the same clock), in
    buckets of TIMELINE_BUCKET_S: the CPU in ms of each timed stream's worker (in the order of
    the streams) and of PostgreSQL's backends together, the machine's idle cores; and when each
    stream's worker was last busy (a sample with it on a CPU half the time or more)."""
    sampler.stdin.close()
    sampler.wait(30)
    samples = json.loads(Path(out).read_text())
    Path(out).unlink()
    samples = [x for x in samples if start - 0.01 <= x["t"] <= end + 0.01]
    n = max(1, math.ceil((end - start) / TIMELINE_BUCKET_S))
    streams = [[0.0] * n for _ in owners]
    backends, idle = [0.0] * n, [0.0] * n
    busy_until = [0.0] * len(owners)
    ticks = os.sysconf("SC_CLK_TCK")
    for a, b in itertools.pairwise(samples):
        k = min(n - 1, max(0, int((b["t"] - start) / TIMELINE_BUCKET_S)))
        span = b["t"] - a["t"]
        for i, pid in enumerate(owners):
            d = (b["cpu"].get(str(pid), 0) - a["cpu"].get(str(pid), 0)) / 1e6
            streams[i][k] += d
            if d >= 0.5 * span * 1e3:
                busy_until[i] = b["t"] - start
        for pid, ns in b["cpu"].items():
            if int(pid) not in owners and pid in a["cpu"] and pid not in map(str, owners):
                backends[k] += (ns - a["cpu"][pid]) / 1e6
        idle[k] += (b["idle"] - a["idle"]) / ticks
    per = TIMELINE_BUCKET_S
    return {
        "bucket_ms": per * 1e3,
        "stream_worker_cpu_ms": [[round(v) for v in row] for row in streams],
        "backends_cpu_ms": [round(v) for v in backends],
        "idle_cores": [round(v / per, 2) for v in idle],
        "stream_worker_busy_until_s": [round(v, 3) for v in busy_until],
    }


# pg_stat_database's, and the pages of the database's files (its size in blocks of 8 KiB).
DB_COUNTERS = (
    "blks_read",
    "blks_hit",
    "xact_commit",
    "tup_inserted",
    "tup_updated",
    "tup_fetched",
    "pages",
)


def database_counters(url: str) -> dict[str, int]:
    """The database's counters in pg_stat_database, as flushed so far (a backend flushes its own
    when it goes idle, at most once a second, else 10 s later, and when it ends; this
    connection's own are forced out first)."""
    with psycopg.connect(libpq_url(url), autocommit=True) as conn:
        conn.execute("SELECT pg_stat_force_next_flush()")
        conn.execute("SELECT 1")
        row = conn.execute(
            f"SELECT {', '.join(DB_COUNTERS[:-1])}, pg_database_size(current_database()) / "
            "8192 FROM pg_stat_database WHERE datname = current_database()"
        ).fetchone()
    assert row is not None
    return dict(zip(DB_COUNTERS, map(int, row), strict=True))


def one_round(
    mix: str,
    n_events: int,
    batch: int,
    streams: int = 1,
    *,
    spread: bool = False,
    method: str = "warm",
    warm: frozenset[str] | None = None,
    db_stats: bool = False,
    timeline: bool = False,
) -> dict[str, Any]:
    """One round: the raw COPY, then the stream, timed from the same start (`--method`, or the
    parts of the warm method named in `warm`). With `db_stats` the database's counters are
    read for each side (the round waits 11 s before each, for the server's backends to flush
    theirs, and ends the server before reading the stream's)."""
    parts_on = METHODS[method] if warm is None else warm
    assert parts_on <= set(WARM_PARTS), parts_on
    t0 = time.time() - 3 * 86400
    before, events, n_workloads = mix_events(mix, n_events, t0)
    if "runs" in parts_on:
        runs = warm_runs(n_workloads, WARM_RUNS_PER_STREAM * streams, t0)
        before, n_workloads = runs + before, n_workloads + WARM_RUNS_PER_STREAM * streams
    early = bool(parts_on & {"transport", "connect", "setup"})  # channels before the COPY
    counters: dict[str, dict[str, int]] = {}
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
                parts = [messages(p, batch) for p in split_by_workload(events, streams)]
                # The process holding the client's connection (which takes the setup stream
                # when the timed streams do not).
                held = connections_by_worker(process.pid, port)
                client_worker = [p for p, k in held.items() if k > 0]
                owners: list[int] = []
                channels: list[grpc.Channel] = []
                if early:
                    channels, placed = open_streams(
                        f"127.0.0.1:{port}", streams, process.pid, spread=spread, owners=owners
                    )
                if "transport" in parts_on:
                    warm_transport(channels, refused_messages(parts))
                if "connect" in parts_on:
                    warm_connect(channels)
                if "setup" in parts_on:
                    # The rows before the clock over the timed streams' own connections (see
                    # the module's docstring): every worker starts the clock warm.
                    setup = [messages(p, batch) for p in split_by_workload(before, streams)]
                    assert_all_stored(stream_all(channels, setup), len(before))
                elif before:
                    reply = client.ledger.StreamEvents(iter(messages(before, batch)), timeout=900)
                    assert_all_stored([reply], len(before))
                if db_stats:
                    time.sleep(11)
                    counters["before_copy"] = database_counters(url)
                ours = ours_in_postgres(url)
                copy = copy_rate(
                    url,
                    events,
                    before,
                    [
                        lambda _: tree_cpu_s(process.pid),
                        lambda skip: postgres_cpu_s(ours, skip),
                    ],
                )
                if db_stats:
                    time.sleep(1)  # the COPY's backend flushes its counters as it ends
                    counters["after_copy"] = database_counters(url)
                if not early:
                    channels, placed = open_streams(
                        f"127.0.0.1:{port}", streams, process.pid, spread=spread, owners=owners
                    )

                waits = LockWaits(url)
                if "sampler" in parts_on:
                    waits.__enter__()
                    waits.wait_connected()
                if db_stats:
                    time.sleep(11)
                    counters["before_stream"] = database_counters(url)
                pg_before = backend_cpu_s(url)
                pg_ns_before = backend_cpu_ns(pg_before or {})
                workers_before = worker_cpu_s(process.pid)
                server_before, client_before = tree_cpu_s(process.pid), time.process_time()
                timings: list[dict[str, float]] = []
                if timeline:
                    sampler, sampled = start_timeline(tree(process.pid), pg_before or {})
                start = time.perf_counter()
                if "sampler" not in parts_on:
                    waits.__enter__()
                try:
                    replies = stream_all(channels, parts, timings)
                finally:
                    waits.__exit__()
                grpc_s = time.perf_counter() - start
                if timeline:
                    seen = read_timeline(sampler, sampled, start, start + grpc_s, owners)
                for timing, owner in zip(timings, owners, strict=False):
                    # Whether the stream's process is the one that holds the client's
                    # connection, and its CPU over the timed stream.
                    timing["client_worker"] = float(owner in client_worker)
                server_cpu = tree_cpu_s(process.pid) - server_before
                client_cpu = time.process_time() - client_before
                workers = {
                    p: cpu - workers_before.get(p, 0.0)
                    for p, cpu in worker_cpu_s(process.pid).items()
                }
                pg_after = backend_cpu_s(url)
                pg_ns = backend_cpu_ns(pg_after or {})
                pg_ms = sum(ns - pg_ns_before.get(p, 0) for p, ns in pg_ns.items()) / 1e6
                by_worker = backends_by_worker(url, owners)
                for timing, owner in zip(timings, owners, strict=False):
                    timing["worker_cpu_ms"] = round(workers.get(owner, math.nan) * 1e3)
                    # The CPU over the timed stream of the backends the stream's worker holds
                    # (a backend that started inside it counted from its start).
                    timing["backend_cpu_ms"] = round(
                        sum(pg_ns.get(b, 0) - pg_ns_before.get(b, 0) for b in by_worker[owner])
                        / 1e6,
                        1,
                    )
                used = backends_used(pg_before, pg_after)
                # Backends that started inside the timed stream (`--method old`: a worker's).
                started = None if pg_after is None or pg_before is None else pg_after.keys()
                opened = math.nan if started is None else len(started - (pg_before or {}).keys())
                pg_cpu = math.nan if used is None else used  # backends not on this machine
                for c in channels:
                    c.close()
                assert_all_stored(replies, len(events))
        finally:
            process.terminate()
            process.wait(30)
            engine.dispose()
        if db_stats:
            time.sleep(1)  # the server's backends flush their counters as they end
            counters["after_stream"] = database_counters(url)
    n = len(events)
    grpc_eps = n / grpc_s
    result: dict[str, Any] = {
        "grpc_stream_events_per_s": round(grpc_eps),
        "raw_copy_events_per_s": round(copy.events_per_s),
        "ratio_grpc_to_copy": round(grpc_eps / copy.events_per_s, 3),
        "method": method if warm is None else "+".join(sorted(warm)) or "none",
        "us_per_event_wall": round(grpc_s / n * 1e6, 2),
        "us_per_event_server_cpu": round(server_cpu / n * 1e6, 2),
        "us_per_event_postgres_cpu": round(pg_cpu / n * 1e6, 2),
        # The same from /proc/<pid>/schedstat (nanoseconds): milliseconds over the whole stream.
        "postgres_cpu_ms_in_stream": round(pg_ms, 2) if pg_ns else math.nan,
        "us_per_event_client_cpu": round(client_cpu / n * 1e6, 2),
        "copy_us_per_event_postgres_cpu": round(copy.postgres_cpu_s / n * 1e6, 2),
        "copy_us_per_event_client_cpu": round(copy.client_cpu_s / n * 1e6, 2),
        "copy_s": round(n / copy.events_per_s, 4),
        # What else ran while the COPY was timed: the server (ticks of 10 ms), and the database's
        # other backends with PostgreSQL's writers (schedstat), ms.
        "server_cpu_ms_in_copy": round(copy.beside_cpu_s[0] * 1e3),
        "postgres_other_cpu_ms_in_copy": round(copy.beside_cpu_s[1] * 1e3, 1),
        "stream_s": round(grpc_s, 4),
        # Per stream: when gRPC took its first and last message, and when its reply came.
        "stream_timings": timings,
        "streams_by_worker": placed,
        "postgres_backends_started_in_stream": opened,
        "lock_waits_seen": f"{waits.seen} in {waits.samples} samples",
        "server_cpu_ms_by_worker": sorted(
            (round(cpu * 1e3) for p, cpu in workers.items() if p != process.pid), reverse=True
        ),
        "server_cpu_share_by_worker": sorted(
            (round(cpu / server_cpu, 2) for cpu in workers.values() if server_cpu > 0),
            reverse=True,
        ),
    }
    if timeline:
        result["timeline"] = seen
    if db_stats:
        # The COPY's table is dropped in its window: the pages it had (its earlier rows' too).
        result["db_copy"] = {
            k: counters["after_copy"][k] - counters["before_copy"][k] for k in DB_COUNTERS
        } | {"pages": copy.pages}
        result["db_stream"] = {
            k: counters["after_stream"][k] - counters["before_stream"][k] for k in DB_COUNTERS
        }
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--batch", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--mix", choices=["churn", "steady", "both"], default="both")
    parser.add_argument("--streams", type=int, default=1, help="streams at once, by workload")
    parser.add_argument(
        "--spread",
        action="store_true",
        help="reconnect until the streams are spread evenly over the server's workers",
    )
    parser.add_argument(
        "--method",
        choices=["warm", "old"],
        default="warm",
        help="warm: both sides start the clock warm (the default); old: as rounds up to 29 "
        "measured, a worker's database connection opened inside the timed stream (see above)",
    )
    parser.add_argument(
        "--warm",
        default=None,
        help="comma-separated parts of the warm method to switch on, in place of --method "
        f"(of {', '.join(WARM_PARTS)}; 'none' for none; see WARM_PARTS)",
    )
    parser.add_argument(
        "--db-stats",
        action="store_true",
        help="read the database's block and row counters for each side (slower: each round "
        "waits 22 s for the server's backends to flush theirs)",
    )
    parser.add_argument(
        "--timeline",
        action="store_true",
        help="sample the CPU of the server's workers, the backends and the machine every 2 ms "
        "over the timed stream (cpu_timeline.py, a process of its own)",
    )
    args = parser.parse_args()
    warm = (
        None
        if args.warm is None
        else frozenset(p for p in args.warm.split(",") if p and p != "none")
    )
    mixes = ["churn", "steady"] if args.mix == "both" else [args.mix]
    # Rounds alternate between the mixes, so both see the same stretch of the machine's noise.
    rounds: dict[str, list[dict[str, Any]]] = {mix: [] for mix in mixes}
    for _ in range(args.rounds):
        for mix in mixes:
            rounds[mix].append(
                one_round(
                    mix,
                    args.events,
                    args.batch,
                    args.streams,
                    spread=args.spread,
                    method=args.method,
                    warm=warm,
                    db_stats=args.db_stats,
                    timeline=args.timeline,
                )
            )
            print(json.dumps({"mix": mix, **rounds[mix][-1]}), file=sys.stderr)
    summary = {
        mix: {
            "rounds": len(results),
            **{
                f"median_{key}": statistics.median(r[key] for r in results)
                for key in results[0]
                if isinstance(results[0][key], int | float)  # not the lists and notes
            },
        }
        for mix, results in rounds.items()
    }
    print(
        json.dumps(
            {
                "events": args.events,
                "batch": args.batch,
                "streams": args.streams,
                "method": args.method if warm is None else "+".join(sorted(warm)) or "none",
                **summary,
                "targets": {"grpc_stream_events_per_s": 20000, "ratio_grpc_to_copy": 0.5},
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
