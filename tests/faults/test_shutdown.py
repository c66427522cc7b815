"""SIGTERM stops `gpufair serve` in a bounded time whatever its clients and jobs are doing, and
its embedded PostgreSQL is stopped cleanly (a fast shutdown), never killed.

Each case starts a real `gpufair serve` on one embedded PostgreSQL data directory (made once),
puts it in a state, sends SIGTERM and measures the time to exit. The bound is the grace period,
plus what gRPC's stop and the jobs may add past it together (`SHUTDOWN_MARGIN_S`), plus the
database's own shutdown (`DB_STOP_S`, a checkpoint of a small database): no tighter threshold, as
the machine is shared. Run with -s to see the times."""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from embedded_support import embedded_data_dir
from serve_support import ServeProcess
from sqlalchemy import Engine, create_engine, text

from gpufair.api.server import SHUTDOWN_MARGIN_S
from gpufair.client import GpufairClient
from gpufair.config_file import parse_config
from gpufair.store import locks
from gpufair.v1 import ledger_pb2, scheduler_pb2

GRACE_S = 2.0
DB_STOP_S = 10.0
BOUND_S = GRACE_S + SHUTDOWN_MARGIN_S + DB_STOP_S
CLUSTER = {
    "gpu_types": [{"name": "a100", "memory_gib": 80, "compute_weight": 1}],
    "pools": [{"name": "main", "policy": {"recompute_interval_s": 1}}],
    "nodes": [
        {
            "name": "n0",
            "pool": "main",
            "gpu_type": "a100",
            "gpu_count": 8,
            "cpu_millicores": 64000,
            "memory_mib": 524288,
        }
    ],
    "queues": [{"name": "q", "quotas": [{"pool": "main", "deserved_cu": 8}]}],
}
STREAM = "/gpufair.v1.Ledger/StreamEvents"


@pytest.fixture(scope="module")
def data_dir() -> Iterator[Path]:
    with embedded_data_dir() as path:  # not under tmp_path: embedded_support.py says why
        yield path


def postgres_engine(data_dir: Path) -> Engine:
    """A connection to the embedded server, found from its postmaster.pid (port and socket
    directory), without taking a handle on it (the server would then wait for this process)."""
    lines = (data_dir / "postmaster.pid").read_text().splitlines()
    port, socket_dir = lines[3], lines[4]
    return create_engine(
        f"postgresql+psycopg://postgres@/postgres?host={socket_dir}&port={port}",
        pool_size=2,
    )


def waiting_on_advisory_lock(engine: Engine, count: int) -> None:
    for _ in range(500):
        with engine.connect() as conn:
            waiting = conn.execute(
                text(
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                    "AND wait_event = 'advisory' AND application_name = 'gpufair'"
                )
            ).scalar_one()
        if waiting >= count:
            return
        time.sleep(0.02)
    raise AssertionError("the server never waited for the lock")


class Blocked:
    """Requests of a client stream: `first`, then nothing until released (never, here)."""

    def __init__(self, first: Any) -> None:
        self.first = first
        self.release = threading.Event()

    def __iter__(self) -> Iterator[Any]:
        yield self.first
        self.release.wait()


def started(uid: str) -> ledger_pb2.LedgerEvent:
    event = ledger_pb2.LedgerEvent(
        event_id=str(uuid.uuid4()),
        kind=ledger_pb2.EVENT_KIND_STARTED,
        workload_uid=uid,
        pods=[ledger_pb2.EventPod(node="n0", gpu_indices=[0])],
    )
    event.occurred_at.FromNanoseconds(time.time_ns())
    return event


def half_read_stream(server: ServeProcess, channel: grpc.Channel, data_dir: Path, uid: str) -> Any:
    """A StreamEvents call that sent one valid message and never ends its stream."""
    requests = Blocked(ledger_pb2.ReportEventsRequest(events=[started(uid)]))
    call = channel.stream_unary(
        STREAM,
        request_serializer=ledger_pb2.ReportEventsRequest.SerializeToString,
        response_deserializer=ledger_pb2.ReportEventsResponse.FromString,
    ).future(iter(requests))
    time.sleep(1.0)  # the message is read and committed; the stream stays open
    return call, requests


def malformed_frame(server: ServeProcess, channel: grpc.Channel, data_dir: Path, uid: str) -> Any:
    """A StreamEvents call whose first message is not protobuf, left open (the case where
    grpc was seen never to finish its shutdown)."""
    requests = Blocked(b"\xff\xfe not a protobuf message \x00\x01")
    call = channel.stream_unary(STREAM).future(iter(requests))
    time.sleep(1.0)
    return call, requests


def stalled_client(server: ServeProcess, channel: grpc.Channel, data_dir: Path, uid: str) -> Any:
    """A TCP client that sent the HTTP/2 preface and half a frame, then nothing."""
    sock = socket.create_connection(("127.0.0.1", server.port))
    sock.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x12\x04")
    time.sleep(0.5)
    return sock


def job_waiting_for_a_lock(
    server: ServeProcess, channel: grpc.Channel, data_dir: Path, uid: str
) -> Any:
    """The periodic recompute of `main` mid-run: waiting for the pool's rollup lock, held here
    (for up to the 10 s lock timeout, longer than the grace period)."""
    engine = postgres_engine(data_dir)
    conn = engine.connect()
    locks.xact_lock(conn, locks.rollup_key("main"))
    waiting_on_advisory_lock(engine, 1)
    return engine, conn


def schedule_waiting_for_the_pool(
    server: ServeProcess, channel: grpc.Channel, data_dir: Path, uid: str
) -> Any:
    """A Schedule call mid-transaction: it waits for the pool's lock, held here."""
    engine = postgres_engine(data_dir)
    conn = engine.connect()
    locks.xact_lock(conn, locks.pool_key("main"))
    call = channel.unary_unary(
        "/gpufair.v1.Scheduler/Schedule",
        request_serializer=scheduler_pb2.ScheduleRequest.SerializeToString,
        response_deserializer=scheduler_pb2.ScheduleResponse.FromString,
    ).future(scheduler_pb2.ScheduleRequest(pool="main", request_id="in-flight"), timeout=60)
    waiting_on_advisory_lock(engine, 1)
    return engine, conn, call


STATES: dict[str, Callable[[ServeProcess, grpc.Channel, Path, str], Any]] = {
    "idle": lambda server, channel, data_dir, uid: None,
    "half-read stream": half_read_stream,
    "malformed frame": malformed_frame,
    "stalled client": stalled_client,
    "job waiting for a lock": job_waiting_for_a_lock,
    "schedule waiting for the pool": schedule_waiting_for_the_pool,
}


@pytest.mark.parametrize("state", list(STATES))
def test_sigterm_stops_the_server_and_its_database_in_bounded_time(
    state: str, data_dir: Path, tmp_path: Path
) -> None:
    env = {k: v for k, v in os.environ.items() if k != "GPUFAIR_DATABASE_URL"}
    log = tmp_path / "serve.log"
    args = ["--data-dir", str(data_dir), "--grace-s", str(GRACE_S), "--job-tick-s", "0.2"]
    server = ServeProcess(args, env, log)
    held: Any = None
    try:
        server.wait_serving()
        uid = state.replace(" ", "-")  # its own workload: the data directory is shared
        with GpufairClient(server.address, attempts=1, timeout_s=30) as c:
            c.apply_config(parse_config(CLUSTER))
            c.submit_workloads(
                [scheduler_pb2.Workload(uid=uid, queue="q", pool="main", pods=1, gpus_per_pod=1)]
            )
        postmaster = int((data_dir / "postmaster.pid").read_text().splitlines()[0])
        with grpc.insecure_channel(server.address) as channel:
            held = STATES[state](server, channel, data_dir, uid)
            sent = time.monotonic()
            server.proc.send_signal(signal.SIGTERM)
            code = server.proc.wait(timeout=60)
            took_s = time.monotonic() - sent
    finally:
        if server.proc.poll() is None:
            server.proc.kill()
    print(f"\n{state}: exited {code} {took_s:.2f} s after SIGTERM (bound {BOUND_S:.0f} s)")
    out = log.read_text()
    assert code == 0, out
    assert took_s < BOUND_S, out
    assert "embedded PostgreSQL stopped (fast shutdown)" in out, out
    assert "killing it instead" not in out and "immediate shutdown" not in out
    assert "internal error" not in out
    assert "did not finish within the grace period" not in out  # gRPC's stop completed
    if state == "job waiting for a lock":  # past the grace period, cancelled and rolled back
        assert "periodic job recompute:main cancelled: the server is stopping" in out
    # The postmaster is gone and removed its pid file: a clean stop.
    with pytest.raises(ProcessLookupError):
        os.kill(postmaster, 0)
    assert not (data_dir / "postmaster.pid").exists()
    if state == "schedule waiting for the pool":
        _, _, call = held
        with pytest.raises(grpc.RpcError) as err:
            call.result(timeout=10)
        assert err.value.code() in (grpc.StatusCode.CANCELLED, grpc.StatusCode.UNAVAILABLE)
        assert_no_cycle_was_stored(data_dir, env, tmp_path, uid)


def assert_no_cycle_was_stored(
    data_dir: Path, env: dict[str, str], tmp_path: Path, uid: str
) -> None:
    """The interrupted Schedule's transaction was rolled back: no cycle stored by it (nor any
    other: no case before schedules), its workload still pending."""
    server = ServeProcess(["--data-dir", str(data_dir), "--no-jobs"], env, tmp_path / "2.log")
    try:
        server.wait_serving()
        engine = postgres_engine(data_dir)
        with engine.connect() as conn:
            assert conn.execute(text("SELECT count(*) FROM schedule_cycles")).scalar_one() == 0
            state = conn.execute(text("SELECT state FROM workloads WHERE uid = :u"), {"u": uid})
            assert state.scalar_one() == "pending"
        engine.dispose()
    finally:
        assert server.terminate() == 0
