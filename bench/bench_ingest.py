"""Ledger ingest through gRPC streaming vs a raw psycopg COPY into the same table, in one run.

    python bench/bench_ingest.py [--events 100000] [--batch 2000] [--rounds 3] [--mix both]

The gRPC path is the whole service path: `gpufair serve` started as its own process (as it is
deployed), on a loopback port, StreamEvents, per-event validation, idempotent insert, runs
re-derived, commit before the reply. The client builds its messages before the clock starts, as
a batch system has its events before it sends them. The COPY path writes the same rows (same
payload and digest) straight into `ledger_events` and does nothing else: the ceiling a database
client could reach for that table. Each round uses a new database and runs both, one after the
other, so the ratio is fair on a shared, noisy machine; the summary is the median of the rounds'
ratios. The CPU seconds of the server process, the client and the PostgreSQL backends during the
stream, per event, show which side bounds the rate.

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
import hashlib
import json
import math
import statistics
import subprocess
import sys
import time
import uuid
from datetime import UTC, datetime

import psycopg
from server_process import backend_cpu_s, backends_used, free_port, tree_cpu_s, wait_serving
from sqlalchemy.engine import make_url

from gpufair.client import GpufairClient
from gpufair.config_file import parse_config
from gpufair.domain.ledger import EventKind, EventPod, LedgerEvent
from gpufair.domain.model import Workload
from gpufair.store import migrate, workload_repo
from gpufair.store.database import make_engine
from gpufair.store.event_codec import payload_json
from gpufair.store.scratch import scratch_database, test_server
from gpufair.v1 import ledger_pb2

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

    before = [start(uid, t0 + j * 0.001, j) for j, uid in enumerate(uids)]
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


def messages(events: list[LedgerEvent], batch: int) -> list[ledger_pb2.ReportEventsRequest]:
    return [
        ledger_pb2.ReportEventsRequest(events=[to_proto(e) for e in events[i : i + batch]])
        for i in range(0, len(events), batch)
    ]


def libpq_url(url: str) -> str:
    return make_url(url).set(drivername="postgresql").render_as_string(False)


def copy_rate(url: str, events: list[LedgerEvent]) -> float:
    with psycopg.connect(libpq_url(url)) as conn:
        conn.execute("TRUNCATE ledger_events")
        conn.commit()
        start = time.perf_counter()
        with (
            conn.cursor() as cur,
            cur.copy(
                "COPY ledger_events (event_id, workload_uid, kind, occurred_at, payload, payload_digest)"
                " FROM STDIN"
            ) as copy,
        ):
            for e in events:
                payload = payload_json(e)
                copy.write_row(
                    (
                        e.event_id,
                        e.workload_uid,
                        e.kind.value,
                        datetime.fromtimestamp(e.occurred_at_s, UTC),
                        payload,
                        hashlib.sha256(payload.encode()).hexdigest(),
                    )
                )
        conn.commit()
        elapsed = time.perf_counter() - start
        conn.execute("TRUNCATE ledger_events")
        conn.commit()
    return len(events) / elapsed


def start_server(url: str, port: int) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-m", "gpufair.cli", "serve", "--no-jobs"]
    command += ["--address", f"127.0.0.1:{port}", "--database-url", url, "--log-level", "warning"]
    command += ["--metrics-address", ""]  # no fixed port for another server to collide with
    return subprocess.Popen(command)


def one_round(mix: str, n_events: int, batch: int) -> dict[str, float]:
    t0 = time.time() - 3 * 86400
    if mix == "churn":
        n_workloads = n_events // EVENTS_PER_WORKLOAD
        before, events = [], events_for(n_workloads, t0)
    else:
        before, events, n_workloads = steady_events(n_events, t0)
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
                if before:
                    client.ledger.StreamEvents(iter(messages(before, batch)), timeout=900)
                copy_eps = copy_rate(url, events)
                requests = messages(events, batch)

                pg_before = backend_cpu_s(url)
                server_before, client_before = tree_cpu_s(process.pid), time.process_time()
                start = time.perf_counter()
                reply = client.ledger.StreamEvents(iter(requests), timeout=900)
                grpc_s = time.perf_counter() - start
                server_cpu = tree_cpu_s(process.pid) - server_before
                client_cpu = time.process_time() - client_before
                used = backends_used(pg_before, backend_cpu_s(url))
                pg_cpu = math.nan if used is None else used  # backends not on this machine
                stored = sum(1 for r in reply.results if r.status == ledger_pb2.EVENT_STATUS_STORED)
                assert stored == len(events), f"only {stored} of {len(events)} stored"
        finally:
            process.terminate()
            process.wait(30)
            engine.dispose()
    n = len(events)
    grpc_eps = n / grpc_s
    return {
        "grpc_stream_events_per_s": round(grpc_eps),
        "raw_copy_events_per_s": round(copy_eps),
        "ratio_grpc_to_copy": round(grpc_eps / copy_eps, 3),
        "us_per_event_wall": round(grpc_s / n * 1e6, 2),
        "us_per_event_server_cpu": round(server_cpu / n * 1e6, 2),
        "us_per_event_postgres_cpu": round(pg_cpu / n * 1e6, 2),
        "us_per_event_client_cpu": round(client_cpu / n * 1e6, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--batch", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--mix", choices=["churn", "steady", "both"], default="both")
    args = parser.parse_args()
    mixes = ["churn", "steady"] if args.mix == "both" else [args.mix]
    # Rounds alternate between the mixes, so both see the same stretch of the machine's noise.
    rounds: dict[str, list[dict[str, float]]] = {mix: [] for mix in mixes}
    for _ in range(args.rounds):
        for mix in mixes:
            rounds[mix].append(one_round(mix, args.events, args.batch))
            print(json.dumps({"mix": mix, **rounds[mix][-1]}), file=sys.stderr)
    summary = {
        mix: {
            "rounds": len(results),
            **{f"median_{key}": statistics.median(r[key] for r in results) for key in results[0]},
        }
        for mix, results in rounds.items()
    }
    print(
        json.dumps(
            {
                "events": args.events,
                "batch": args.batch,
                **summary,
                "targets": {"grpc_stream_events_per_s": 20000, "ratio_grpc_to_copy": 0.5},
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
