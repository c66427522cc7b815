"""Per-call limits: a call's deadline becomes its transactions' statement timeout, and a message
over the size limit is refused with RESOURCE_EXHAUSTED."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import grpc
import pytest
from prometheus_client import REGISTRY
from sqlalchemy import Engine, text

from gpufair.api.server import MAX_MESSAGE_BYTES, RunningServer
from gpufair.client import GpufairClient
from gpufair.config_file import load_config_file
from gpufair.store import locks
from gpufair.store.deadline import DeadlineExceeded, call_deadline, statement_timeout_ms
from gpufair.v1 import ledger_pb2, ledger_pb2_grpc, scheduler_pb2

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "clusters" / "llm-vs-vision.yaml"


def test_statement_timeout_follows_the_time_left() -> None:
    assert statement_timeout_ms(30_000) is None  # no call: the engine's default stays
    with call_deadline(2.0):
        assert 1700 <= (statement_timeout_ms(30_000) or 0) <= 1800  # 10 % kept for the reply
    with call_deadline(600.0):
        assert statement_timeout_ms(30_000) == 30_000  # never above the engine's default
    with call_deadline(0.0):
        assert statement_timeout_ms(30_000) == 1  # never 0, which would mean no timeout


def test_a_transaction_within_a_call_gets_the_deadline(db: Engine) -> None:
    with call_deadline(5.0), db.connect() as conn:
        inside = conn.execute(text("SHOW statement_timeout")).scalar_one()
        conn.commit()
        assert conn.execute(text("SHOW statement_timeout")).scalar_one() != "30s"
        conn.rollback()
    with db.connect() as conn:
        after = conn.execute(text("SHOW statement_timeout")).scalar_one()
    with call_deadline(40.0), db.connect() as conn:
        # Within 10 % of the 30 s default (after the margin): the default stays, no round trip.
        long_deadline = conn.execute(text("SHOW statement_timeout")).scalar_one()
    assert inside.endswith("ms") and 4000 <= int(inside.removesuffix("ms")) <= 4500
    assert after == long_deadline == "30s"  # SET LOCAL ended with its transaction


def test_no_statement_is_sent_once_the_deadline_passed(db: Engine) -> None:
    with call_deadline(0.0), db.connect() as conn, pytest.raises(DeadlineExceeded):
        conn.execute(text("SELECT 1"))


def _lock_waiters(db: Engine) -> list[int]:
    with db.connect() as conn:
        return list(
            conn.execute(
                text(
                    "SELECT l.pid FROM pg_locks l JOIN pg_database d ON d.oid = l.database "
                    "WHERE l.locktype = 'advisory' AND NOT l.granted "
                    "AND d.datname = current_database()"
                )
            ).scalars()
        )


def test_a_call_past_its_deadline_cancels_its_query(client: GpufairClient, db: Engine) -> None:
    client.apply_config(load_config_file(EXAMPLE))
    labels = {"method": "Schedule", "code": "DEADLINE_EXCEEDED"}
    before = REGISTRY.get_sample_value("gpufair_rpcs_total", labels) or 0.0
    # Another transaction holds the pool: the Schedule call's query waits for the lock, which
    # without a deadline it would do until the 10 s lock timeout.
    with db.connect() as holder:
        locks.xact_lock(holder, locks.pool_key("default"))
        codes: list[grpc.StatusCode] = []

        def call() -> None:
            try:
                client.scheduler.Schedule(scheduler_pb2.ScheduleRequest(pool="default"), timeout=1)
            except grpc.RpcError as exc:
                assert isinstance(exc, grpc.Call)
                codes.append(exc.code())

        start = time.monotonic()
        caller = threading.Thread(target=call)
        caller.start()
        waiters: list[int] = []
        while not waiters and time.monotonic() - start < 5:
            waiters = _lock_waiters(db)
            time.sleep(0.02)
        assert len(waiters) == 1
        with db.connect() as conn:
            waiting = conn.execute(
                text("SELECT state, wait_event_type FROM pg_stat_activity WHERE pid = :pid"),
                {"pid": waiters[0]},
            ).one()
        assert tuple(waiting) == ("active", "Lock")
        caller.join(timeout=10)
        assert codes == [grpc.StatusCode.DEADLINE_EXCEEDED]
        # The backend stopped working for the call at about its deadline, while the pool is
        # still held: its statement was cancelled, not finished.
        state = "active"
        while state == "active" and time.monotonic() - start < 5:
            with db.connect() as conn:
                state = conn.execute(
                    text("SELECT state FROM pg_stat_activity WHERE pid = :pid"),
                    {"pid": waiters[0]},
                ).scalar_one()
            time.sleep(0.05)
        cancelled_after_s = time.monotonic() - start
        print(
            f"1 s deadline: the backend's lock wait ended {cancelled_after_s:.2f} s after the call"
        )
        assert state == "idle" and cancelled_after_s < 3
        assert _lock_waiters(db) == []
        holder.rollback()
    # The server ended the call itself, from the database's cancellation.
    assert REGISTRY.get_sample_value("gpufair_rpcs_total", labels) == before + 1


def test_an_oversized_message_is_resource_exhausted(server: RunningServer) -> None:
    oversized = ledger_pb2.ReportEventsRequest(
        events=[ledger_pb2.LedgerEvent(event_id="x", workload_uid="w" * (MAX_MESSAGE_BYTES + 1))]
    )
    # A channel that may send more than the server takes, to reach the server's own check.
    options = [("grpc.max_send_message_length", 2 * MAX_MESSAGE_BYTES)]
    with grpc.insecure_channel(f"127.0.0.1:{server.port}", options=options) as channel:
        with pytest.raises(grpc.RpcError) as err:
            ledger_pb2_grpc.LedgerStub(channel).ReportEvents(oversized, timeout=30)
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        # The server is unharmed and answers the next call.
        reply = ledger_pb2_grpc.LedgerStub(channel).ReportEvents(
            ledger_pb2.ReportEventsRequest(), timeout=30
        )
        assert list(reply.results) == []
    # The client refuses to send one at all, with the same status.
    with GpufairClient(f"127.0.0.1:{server.port}", attempts=1) as c:
        with pytest.raises(grpc.RpcError) as err:
            c.ledger.ReportEvents(oversized, timeout=30)
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
