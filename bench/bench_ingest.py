"""Ledger ingest through gRPC streaming vs a raw psycopg COPY into the same table, in one run.

    python bench/bench_ingest.py [--events 100000] [--batch 2000] [--rounds 3] [--mix both]
                                 [--streams 1] [--spread]

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
`--method old` measures as rounds up to 29 did: the earlier starts over one stream of their own,
before the timed streams' connections are opened, no warm-up runs, and the lock sampler's
connection opened after the clock starts; a worker that had not taken that stream opened its
database connection (a new backend, its catalog caches, its first plans: about 5 ms of the
database's CPU) and looked up the workloads it had not seen inside the timed stream, which the
COPY, its connection open before its clock, did not pay.

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
import json
import math
import os
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterable
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


def copy_rate(url: str, events: list[LedgerEvent], before: list[LedgerEvent]) -> CopyRun:
    """The raw COPY of `events`, timed, into a table that holds `before` as the stream's
    `ledger_events` does."""
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
    address: str, n: int, server_pid: int, *, spread: bool
) -> tuple[list[grpc.Channel], list[int]]:
    """`n` channels, each on a connection of its own (channels with the same target would
    otherwise share one), connected; and how many of them each server process took. With
    `spread`, connections are opened again (up to 50 times) until no process holds more than
    its even share: the kernel places each connection on a worker by a hash of its addresses."""
    port = int(address.rsplit(":", 1)[1])
    before = connections_by_worker(server_pid, port)
    for _ in range(50):
        channels = [
            grpc.insecure_channel(
                address, options=[*_MESSAGE_SIZES, ("grpc.use_local_subchannel_pool", 1)]
            )
            for _ in range(n)
        ]
        for c in channels:
            ledger_pb2_grpc.LedgerStub(c).StreamEvents(iter(()), timeout=60)
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
    channels: list[grpc.Channel], parts: list[list[ledger_pb2.ReportEventsRequest]]
) -> list[ledger_pb2.ReportEventsResponse]:
    """Each part on a stream of its own, on its own channel, all at once."""
    replies: list[ledger_pb2.ReportEventsResponse | None] = [None] * len(parts)
    errors: list[BaseException] = []
    stubs = [ledger_pb2_grpc.LedgerStub(c) for c in channels]

    def run(i: int) -> None:
        try:
            replies[i] = stubs[i].StreamEvents(iter(parts[i]), timeout=900)
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(parts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
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


def one_round(
    mix: str,
    n_events: int,
    batch: int,
    streams: int = 1,
    *,
    spread: bool = False,
    method: str = "warm",
) -> dict[str, Any]:
    t0 = time.time() - 3 * 86400
    before, events, n_workloads = mix_events(mix, n_events, t0)
    if method == "warm":
        warm = warm_runs(n_workloads, WARM_RUNS_PER_STREAM * streams, t0)
        before, n_workloads = warm + before, n_workloads + WARM_RUNS_PER_STREAM * streams
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
                channels: list[grpc.Channel] = []
                if method == "warm":
                    # The rows before the clock over the timed streams' own connections (see
                    # the module's docstring): every worker starts the clock warm.
                    channels, placed = open_streams(
                        f"127.0.0.1:{port}", streams, process.pid, spread=spread
                    )
                    setup = [messages(p, batch) for p in split_by_workload(before, streams)]
                    assert_all_stored(stream_all(channels, setup), len(before))
                elif before:
                    reply = client.ledger.StreamEvents(iter(messages(before, batch)), timeout=900)
                    assert_all_stored([reply], len(before))
                copy = copy_rate(url, events, before)
                parts = [messages(p, batch) for p in split_by_workload(events, streams)]
                if method == "old":
                    channels, placed = open_streams(
                        f"127.0.0.1:{port}", streams, process.pid, spread=spread
                    )

                waits = LockWaits(url)
                if method == "warm":
                    waits.__enter__()
                    waits.wait_connected()
                pg_before = backend_cpu_s(url)
                pg_ns_before = backend_cpu_ns(pg_before or {})
                workers_before = worker_cpu_s(process.pid)
                server_before, client_before = tree_cpu_s(process.pid), time.process_time()
                start = time.perf_counter()
                if method == "old":
                    waits.__enter__()
                try:
                    replies = stream_all(channels, parts)
                finally:
                    waits.__exit__()
                grpc_s = time.perf_counter() - start
                server_cpu = tree_cpu_s(process.pid) - server_before
                client_cpu = time.process_time() - client_before
                workers = {
                    p: cpu - workers_before.get(p, 0.0)
                    for p, cpu in worker_cpu_s(process.pid).items()
                }
                pg_after = backend_cpu_s(url)
                pg_ns = backend_cpu_ns(pg_after or {})
                pg_ms = sum(ns - pg_ns_before.get(p, 0) for p, ns in pg_ns.items()) / 1e6
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
    n = len(events)
    grpc_eps = n / grpc_s
    return {
        "grpc_stream_events_per_s": round(grpc_eps),
        "raw_copy_events_per_s": round(copy.events_per_s),
        "ratio_grpc_to_copy": round(grpc_eps / copy.events_per_s, 3),
        "method": method,
        "us_per_event_wall": round(grpc_s / n * 1e6, 2),
        "us_per_event_server_cpu": round(server_cpu / n * 1e6, 2),
        "us_per_event_postgres_cpu": round(pg_cpu / n * 1e6, 2),
        # The same from /proc/<pid>/schedstat (nanoseconds): milliseconds over the whole stream.
        "postgres_cpu_ms_in_stream": round(pg_ms, 2) if pg_ns else math.nan,
        "us_per_event_client_cpu": round(client_cpu / n * 1e6, 2),
        "copy_us_per_event_postgres_cpu": round(copy.postgres_cpu_s / n * 1e6, 2),
        "copy_us_per_event_client_cpu": round(copy.client_cpu_s / n * 1e6, 2),
        "streams_by_worker": placed,
        "postgres_backends_started_in_stream": opened,
        "lock_waits_seen": f"{waits.seen} in {waits.samples} samples",
        "server_cpu_share_by_worker": sorted(
            (round(cpu / server_cpu, 2) for cpu in workers.values() if server_cpu > 0),
            reverse=True,
        ),
    }


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
    args = parser.parse_args()
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
                "method": args.method,
                **summary,
                "targets": {"grpc_stream_events_per_s": 20000, "ratio_grpc_to_copy": 0.5},
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
