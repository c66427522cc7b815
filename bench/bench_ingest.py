"""Ledger ingest through gRPC streaming vs a raw psycopg COPY into the same table, in one run.

    python bench/bench_ingest.py [--events 100000] [--batch 2000]

The gRPC path is the whole service path: a real server on a loopback port, StreamEvents, per-event
validation, idempotent insert, runs re-derived, commit before the reply. The COPY path writes the
same rows (same payload and digest) straight into `ledger_events` and does nothing else: the
ceiling a database client could reach for that table. Both run against the same PostgreSQL, one
after the other in this process, so the ratio is fair on a shared, noisy machine.
"""

from __future__ import annotations

import argparse
import json
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime

import psycopg
from sqlalchemy.engine import make_url

from gpufair.api.server import build_server
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


def messages(events: list[LedgerEvent], batch: int) -> Iterator[ledger_pb2.ReportEventsRequest]:
    for i in range(0, len(events), batch):
        yield ledger_pb2.ReportEventsRequest(events=[to_proto(e) for e in events[i : i + batch]])


def copy_rate(url: str, events: list[LedgerEvent]) -> float:
    libpq = make_url(url).set(drivername="postgresql").render_as_string(False)
    with psycopg.connect(libpq) as conn:
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
            import hashlib

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--batch", type=int, default=2000)
    args = parser.parse_args()
    n_workloads = args.events // EVENTS_PER_WORKLOAD
    t0 = time.time() - 3 * 86400

    with test_server() as server, scratch_database(server.url, prefix="gpufair_bench") as url:
        migrate.upgrade(url)
        engine = make_engine(url)
        running = build_server(engine, "127.0.0.1:0", max_workers=4)
        try:
            with GpufairClient(f"127.0.0.1:{running.port}", timeout_s=600) as client:
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
                events = events_for(n_workloads, t0)
                copy_eps = copy_rate(url, events)

                start = time.perf_counter()
                reply = client.ledger.StreamEvents(messages(events, args.batch), timeout=900)
                grpc_s = time.perf_counter() - start
                stored = sum(1 for r in reply.results if r.status == ledger_pb2.EVENT_STATUS_STORED)
                assert stored == len(events), f"only {stored} of {len(events)} stored"
        finally:
            running.stop(1)
            engine.dispose()
    grpc_eps = len(events) / grpc_s
    print(
        json.dumps(
            {
                "events": len(events),
                "batch": args.batch,
                "grpc_stream_events_per_s": round(grpc_eps),
                "raw_copy_events_per_s": round(copy_eps),
                "ratio_grpc_to_copy": round(grpc_eps / copy_eps, 3),
                "targets": {"grpc_stream_events_per_s": 20000, "ratio_grpc_to_copy": 0.5},
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
