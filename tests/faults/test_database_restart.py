"""PostgreSQL restarted under traffic: calls meanwhile are UNAVAILABLE (never UNKNOWN or
INTERNAL), gpufair recovers by itself without a restart, periodic jobs resume, and every event
it acknowledged is stored exactly once after the client resends everything.

The test owns its PostgreSQL: an embedded server in a temporary directory, stopped and started
through its own handle (never a shared server), from a helper process (own_postgres.py says
why)."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path

import grpc
import pytest
from embedded_support import embedded_data_dir
from fault_support import FORBIDDEN, cluster, run_events, serve_env, status_of, workloads
from own_postgres import OwnPostgres
from serve_support import ServeProcess
from sqlalchemy import Engine, create_engine, text

from gpufair.client import GpufairClient
from gpufair.store import migrate
from gpufair.v1 import ledger_pb2

NODES = 4
WORKLOADS = 2000
PER_BATCH = 5  # workloads per ReportEvents call, three events each


@pytest.fixture
def own_postgres() -> Iterator[OwnPostgres]:
    with embedded_data_dir() as data_dir:  # not under tmp_path: embedded_support.py says why
        database = OwnPostgres(data_dir)
        try:
            yield database
        finally:
            database.close()


class Sender:
    """A batch system reporting runs in batches, one call at a time, until told to stop; it
    remembers what was acknowledged and which status each failed call had."""

    def __init__(self, address: str, t0: float) -> None:
        self.address = address
        self.batches = [
            [
                e
                for w in range(b, b + PER_BATCH)
                for e in run_events(f"w{w}", f"main-n{w % NODES:03d}", w // NODES % 8, t0 + w)
            ]
            for b in range(0, WORKLOADS, PER_BATCH)
        ]
        self.sent = 0
        self.acknowledged: list[str] = []
        self.ok_at: list[float] = []
        self.failures: list[tuple[float, grpc.StatusCode]] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run)

    def _run(self) -> None:
        with GpufairClient(self.address, attempts=1) as c:
            for batch in self.batches:
                if self.stop.is_set():
                    return
                self.sent += 1
                try:
                    reply = c.ledger.ReportEvents(
                        ledger_pb2.ReportEventsRequest(events=batch), timeout=5
                    )
                except grpc.RpcError as exc:
                    self.failures.append((time.monotonic(), status_of(exc)))
                    time.sleep(0.05)
                    continue
                assert all(r.status == ledger_pb2.EVENT_STATUS_STORED for r in reply.results)
                self.acknowledged.extend(r.event_id for r in reply.results)
                self.ok_at.append(time.monotonic())
                time.sleep(0.01)


def wait_until(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def test_postgres_restart_under_traffic(own_postgres: OwnPostgres, tmp_path: Path) -> None:
    url = own_postgres.url
    migrate.upgrade(url)
    args = ["--database-url", url, "--grace-s", "1", "--job-tick-s", "0.5"]
    server = ServeProcess([*args, "--sweep-period-s", "1"], serve_env(), tmp_path / "serve.log")
    server.wait_serving()
    try:
        with GpufairClient(server.address, attempts=1, timeout_s=60) as c:
            c.apply_config(cluster(["main"], NODES, recompute_s=1))
            c.submit_workloads(workloads("main", WORKLOADS))
        sender = Sender(server.address, time.time() - 86400)
        sender.thread.start()
        wait_until(lambda: len(sender.ok_at) >= 10, 30, "traffic before the outage")

        stopped_at = time.monotonic()
        own_postgres.stop()
        # Reads during the outage are UNAVAILABLE too, with the message that says to retry.
        with GpufairClient(server.address, attempts=1, timeout_s=5) as c:
            for call in ("GetConfig", "GetFairShare"):
                with pytest.raises(grpc.RpcError) as err:
                    if call == "GetConfig":
                        c.get_config()
                    else:
                        c.get_fair_share("main")
                assert status_of(err.value) == grpc.StatusCode.UNAVAILABLE
                assert "database is unavailable" in (err.value.details() or "")
        # Down for two seconds: the sender keeps calling, one failed call after another.
        wait_until(
            lambda: (
                time.monotonic() - stopped_at >= 2
                and sum(at > stopped_at for at, _ in sender.failures) >= 5
            ),
            30,
            "calls failing during the outage",
        )
        own_postgres.start()
        restarted_at = time.monotonic()
        restarted_wall = datetime.now(UTC)
        # No restart of gpufair: the same process serves again once the database is back.
        wait_until(
            lambda: sum(at > restarted_at for at in sender.ok_at) >= 10, 30, "recovered traffic"
        )
        sender.stop.set()
        sender.thread.join(timeout=30)
        first_ok_s = min(at for at in sender.ok_at if at > restarted_at) - restarted_at
        print(
            f"outage {restarted_at - stopped_at:.2f} s: {len(sender.failures)} calls UNAVAILABLE, "
            f"first success {first_ok_s:.3f} s after the restart; {sender.sent} calls, "
            f"{len(sender.acknowledged)} events acknowledged"
        )
        assert server.proc.poll() is None
        codes = Counter(code for _, code in sender.failures)
        assert set(codes) == {grpc.StatusCode.UNAVAILABLE}, codes
        assert not FORBIDDEN & set(codes)
        # Calls failed only while the database was down (or coming back: the first checkout of
        # each pooled connection finds it dead and reconnects).
        assert all(stopped_at <= at <= restarted_at + 5 for at, _ in sender.failures)

        engine = create_engine(url)
        try:
            with engine.connect() as conn:
                stored = set(
                    conn.execute(text("SELECT event_id::text FROM ledger_events")).scalars()
                )
            assert set(sender.acknowledged) <= stored  # nothing acknowledged was lost

            # The client cannot know what landed from the calls that failed: it resends all.
            with GpufairClient(server.address, attempts=4) as c:
                reply = c.ledger.StreamEvents(
                    iter(
                        ledger_pb2.ReportEventsRequest(events=b)
                        for b in sender.batches[: sender.sent]
                    ),
                    timeout=60,
                )
            statuses = Counter(r.status for r in reply.results)
            print(f"resent: {dict(statuses)}")
            assert statuses[ledger_pb2.EVENT_STATUS_REJECTED] == 0
            assert statuses[ledger_pb2.EVENT_STATUS_DUPLICATE] >= len(sender.acknowledged)
            # The periodic jobs came back by themselves: periods after the restart were claimed
            # and done.
            wait_until(lambda: _jobs_done_since(engine, restarted_wall) >= 2, 30, "periodic jobs")
            with engine.connect() as conn:
                count, distinct = conn.execute(
                    text("SELECT count(*), count(DISTINCT event_id) FROM ledger_events")
                ).one()
        finally:
            engine.dispose()
    finally:
        code = server.terminate()
    assert count == distinct == sum(len(b) for b in sender.batches[: sender.sent])
    assert code == 0
    assert "internal error" not in server.log.read_text()


def _jobs_done_since(engine: Engine, since: datetime) -> int:
    with engine.connect() as conn:
        return int(
            conn.execute(
                text(
                    "SELECT count(DISTINCT job) FROM job_claims WHERE period_start >= :since "
                    "AND outcome LIKE 'ok%'"
                ),
                {"since": since},
            ).scalar_one()
        )
