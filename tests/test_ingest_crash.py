"""A server killed with SIGKILL during ingest loses nothing it acknowledged, and a client that
retries everything after the restart stores each event exactly once."""

from __future__ import annotations

import os
import signal
import threading
import time
import uuid
from pathlib import Path

import grpc
from serve_support import ServeProcess
from sqlalchemy import create_engine, text

from gpufair.client import GpufairClient
from gpufair.config_file import parse_config
from gpufair.store.database import Database, normalise_url
from gpufair.store.scratch import scratch_database
from gpufair.v1 import ledger_pb2, scheduler_pb2

CLUSTER = {
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
        for i in range(16)
    ],
    "queues": [{"name": "q", "quotas": [{"pool": "main", "deserved_cu": 10}]}],
}
WORKLOADS = 1500


def make_events(t0: float) -> list[ledger_pb2.LedgerEvent]:
    events = []
    for w in range(WORKLOADS):
        for k, kind in enumerate(
            [
                ledger_pb2.EVENT_KIND_STARTED,
                ledger_pb2.EVENT_KIND_HEARTBEAT,
                ledger_pb2.EVENT_KIND_STOPPED,
            ]
        ):
            msg = ledger_pb2.LedgerEvent(
                event_id=str(uuid.uuid4()), workload_uid=f"w{w}", kind=kind
            )
            msg.occurred_at.FromNanoseconds(round((t0 + w + 60 * k) * 1e9))
            if kind == ledger_pb2.EVENT_KIND_STARTED:
                msg.pods.add(node=f"n{w % 16}", gpu_indices=[w % 8], gpu_fraction=1.0)
            events.append(msg)
    return events


def test_sigkill_during_ingest_loses_nothing_acknowledged(
    pg_server: Database, tmp_path: Path
) -> None:
    env = {k: v for k, v in os.environ.items() if k != "GPUFAIR_DATABASE_URL"}
    with scratch_database(pg_server.url) as url:
        args = ["--database-url", url, "--grace-s", "1", "--no-jobs"]
        server = ServeProcess(args, env, tmp_path / "first.log")
        server.wait_serving()
        with GpufairClient(server.address, attempts=1) as client:
            client.apply_config(parse_config(CLUSTER))
            client.scheduler.SubmitWorkloads(
                scheduler_pb2.SubmitWorkloadsRequest(
                    workloads=[
                        scheduler_pb2.Workload(
                            uid=f"w{w}", queue="q", pool="main", pods=1, gpus_per_pod=1
                        )
                        for w in range(WORKLOADS)
                    ]
                ),
                timeout=60,
            )
        events = make_events(time.time() - 86400)
        batches = [events[i : i + 50] for i in range(0, len(events), 50)]
        acknowledged: list[str] = []
        failures: list[BaseException] = []  # what ended the sender other than the kill
        a_third = threading.Event()  # set once a third is acknowledged, or the sender ended

        def send() -> None:
            try:
                with GpufairClient(server.address, attempts=1, timeout_s=10) as c:
                    for batch in batches:
                        try:
                            reply = c.ledger.ReportEvents(
                                ledger_pb2.ReportEventsRequest(events=batch), timeout=10
                            )
                        except grpc.RpcError:
                            if a_third.is_set():
                                return  # the server died under us
                            raise
                        statuses = {r.status for r in reply.results}
                        assert statuses == {ledger_pb2.EVENT_STATUS_STORED}, reply
                        acknowledged.extend(r.event_id for r in reply.results)
                        if len(acknowledged) >= len(events) // 3:
                            a_third.set()
            except BaseException as exc:  # reported by the test's thread
                failures.append(exc)
            finally:
                a_third.set()

        sender = threading.Thread(target=send)
        sender.start()
        reached = a_third.wait(120)
        server.proc.send_signal(signal.SIGKILL)  # also when the sender failed: none left running
        server.proc.wait(timeout=30)
        sender.join(timeout=60)
        assert reached, "no third of the events acknowledged within 120 s"
        assert not sender.is_alive(), "the sender still waits on the killed server"
        if failures:
            raise failures[0]
        assert len(events) // 3 <= len(acknowledged) < len(events)

        engine = create_engine(normalise_url(url))
        try:
            with engine.connect() as conn:
                stored = {
                    r[0] for r in conn.execute(text("SELECT event_id::text FROM ledger_events"))
                }
            assert set(acknowledged) <= stored  # nothing acknowledged was lost

            restarted = ServeProcess(args, env, tmp_path / "second.log")
            restarted.wait_serving()
            try:
                with GpufairClient(restarted.address, attempts=3) as client:
                    # The client does not know what landed after its last reply: it resends all.
                    reply = client.ledger.StreamEvents(
                        iter(ledger_pb2.ReportEventsRequest(events=b) for b in batches), timeout=120
                    )
            finally:
                assert restarted.terminate() == 0
            statuses = [r.status for r in reply.results]
            assert statuses.count(ledger_pb2.EVENT_STATUS_REJECTED) == 0
            assert statuses.count(ledger_pb2.EVENT_STATUS_DUPLICATE) >= len(acknowledged)
            with engine.connect() as conn:
                count, distinct = conn.execute(
                    text("SELECT count(*), count(DISTINCT event_id) FROM ledger_events")
                ).one()
                intervals = conn.execute(
                    text(
                        "SELECT count(*), count(*) FILTER (WHERE ended_at IS NULL) FROM allocation_intervals"
                    )
                ).one()
        finally:
            engine.dispose()
    assert count == distinct == len(events)  # every event once, none twice
    assert tuple(intervals) == (WORKLOADS, 0)  # every run closed, none doubled
