"""The server killed with SIGKILL during Schedule: no half-written decision is ever visible, a
retried request id gets one consistent reply, and no GPU is handed out twice.

Three pools, three moments for the kill, each followed by a restart and the retry:
- pool `a`: half a dry run's duration after the call took the pool lock (mid-cycle);
- pool `b`: certainly mid-write: the test holds row locks on the pool's pending workloads, so the
  server's transaction stops inside the statement that binds them, after it inserted the cycle
  row; the kill lands there, and nothing of the cycle may be visible afterwards;
- pool `c`: as soon as the cycle is visible, i.e. just after the commit; the retry must get the
  stored reply, not a second cycle.
"""

from __future__ import annotations

import signal
import threading
import time
import uuid
from collections import defaultdict
from pathlib import Path

import grpc
from fault_support import cluster, serve_env, status_of, workloads
from serve_support import ServeProcess
from sqlalchemy import Connection, Engine, create_engine, text

from gpufair.client import GpufairClient
from gpufair.store import locks
from gpufair.store.database import Database, normalise_url
from gpufair.store.scratch import scratch_database
from gpufair.v1 import scheduler_pb2

NODES = 200
PENDING = 3000


def backend_of_lock(engine: Engine, key: int) -> int | None:
    """The backend holding the advisory lock `key` in this database, if any."""
    with engine.connect() as conn:
        return conn.execute(
            text(
                "SELECT l.pid FROM pg_locks l JOIN pg_database d ON d.oid = l.database "
                "WHERE l.locktype = 'advisory' AND l.granted AND d.datname = current_database() "
                "AND (l.classid::bigint << 32 | l.objid::bigint) = :key"
            ),
            {"key": key},
        ).scalar_one_or_none()


def wait_backend_gone(engine: Engine, pid: int) -> None:
    deadline = time.monotonic() + 30
    with engine.connect() as conn:
        while conn.execute(
            text("SELECT count(*) FROM pg_stat_activity WHERE pid = :pid"), {"pid": pid}
        ).scalar_one():
            assert time.monotonic() < deadline, f"backend {pid} still there"
            conn.rollback()
            time.sleep(0.05)


def cycles(conn: Connection, pool: str) -> list[int]:
    return list(
        conn.execute(
            text("SELECT id FROM schedule_cycles WHERE pool = :pool ORDER BY id"), {"pool": pool}
        ).scalars()
    )


def bound_by_cycle(conn: Connection, pool: str) -> dict[int, set[str]]:
    out: dict[int, set[str]] = defaultdict(set)
    for uid, cycle in conn.execute(
        text(
            "SELECT uid, (binding->>'cycle_id')::bigint FROM workloads "
            "WHERE pool = :pool AND state = 'bound'"
        ),
        {"pool": pool},
    ):
        out[cycle].add(uid)
    return out


def schedule_in_thread(
    address: str, pool: str, request_id: str
) -> tuple[threading.Thread, list[grpc.RpcError]]:
    errors: list[grpc.RpcError] = []

    def call() -> None:
        with GpufairClient(address, attempts=1) as c:
            try:
                c.scheduler.Schedule(
                    scheduler_pb2.ScheduleRequest(pool=pool, request_id=request_id), timeout=60
                )
            except grpc.RpcError as exc:
                errors.append(exc)

    thread = threading.Thread(target=call)
    thread.start()
    return thread, errors


def kill(server: ServeProcess) -> None:
    server.proc.send_signal(signal.SIGKILL)
    assert server.proc.wait(timeout=30) == -signal.SIGKILL


def retry_is_consistent(address: str, engine: Engine, pool: str, request_id: str) -> str:
    """Retry `request_id` twice; both replies are the one cycle the pool now has, and its binds
    are exactly the workloads bound by it. Returns what the first attempt had left."""
    with engine.connect() as conn:
        before = cycles(conn, pool)
    assert len(before) <= 1
    with GpufairClient(address, attempts=3) as c:
        request = scheduler_pb2.ScheduleRequest(pool=pool, request_id=request_id)
        reply = c.scheduler.Schedule(request, timeout=60)
        again = c.scheduler.Schedule(request, timeout=60)
    assert again.SerializeToString() == reply.SerializeToString()
    with engine.connect() as conn:
        after = cycles(conn, pool)
        bound = bound_by_cycle(conn, pool)
        stored_binds = conn.execute(
            text("SELECT binds FROM schedule_cycles WHERE id = :id"), {"id": reply.cycle_id}
        ).scalar_one()
    assert after == [reply.cycle_id]  # one cycle, whichever attempt made it
    assert before in ([], after)
    assert set(bound) == {reply.cycle_id}
    assert bound[reply.cycle_id] == {b.uid for b in reply.binds}
    assert stored_binds == len(reply.binds) > 0
    return "committed before the kill" if before else "not committed before the kill"


def test_sigkill_during_schedule(pg_server: Database, tmp_path: Path) -> None:
    with scratch_database(pg_server.url) as url:
        args = ["--database-url", url, "--grace-s", "1", "--no-jobs"]
        server = ServeProcess(args, serve_env(), tmp_path / "serve-1.log")
        server.wait_serving()
        engine = create_engine(normalise_url(url))
        try:
            with GpufairClient(server.address, attempts=1, timeout_s=120) as c:
                c.apply_config(cluster(["a", "b", "c"], NODES))
                for pool in ("a", "b", "c"):
                    c.submit_workloads(workloads(pool, PENDING, prefix=f"{pool}-"))
                start = time.monotonic()
                c.schedule("a", dry_run=True)
                dry_run_s = time.monotonic() - start

            # Pool a: killed half a dry run after the pool lock was taken.
            request_a = str(uuid.uuid4())
            thread, errors = schedule_in_thread(server.address, "a", request_a)
            deadline = time.monotonic() + 30
            while (backend := backend_of_lock(engine, locks.pool_key("a"))) is None:
                assert time.monotonic() < deadline and thread.is_alive()
                time.sleep(0.005)
            time.sleep(dry_run_s / 2)
            kill(server)
            thread.join(timeout=30)
            assert [status_of(e) for e in errors] in ([], [grpc.StatusCode.UNAVAILABLE])
            wait_backend_gone(engine, backend)
            server = ServeProcess(args, serve_env(), tmp_path / "serve-2.log")
            server.wait_serving()
            outcomes = {"a": retry_is_consistent(server.address, engine, "a", request_a)}

            # Pool b: the binding statement waits for the test's row locks; killed there.
            request_b = str(uuid.uuid4())
            with engine.connect() as holder:
                holder.execute(text("SELECT uid FROM workloads WHERE pool = 'b' FOR UPDATE")).all()
                thread, errors = schedule_in_thread(server.address, "b", request_b)
                deadline = time.monotonic() + 30
                writer = None
                while writer is None:
                    assert time.monotonic() < deadline and thread.is_alive()
                    time.sleep(0.01)
                    with engine.connect() as conn:
                        writer = conn.execute(
                            text(
                                "SELECT pid FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                                "AND datname = current_database() "
                                "AND query LIKE '%UPDATE workloads w SET state = ''bound''%'"
                            )
                        ).scalar_one_or_none()
                kill(server)
                holder.rollback()
            thread.join(timeout=30)
            assert [status_of(e) for e in errors] == [grpc.StatusCode.UNAVAILABLE]
            wait_backend_gone(engine, writer)
            with engine.connect() as conn:
                # The cycle row was written before the kill, inside the transaction that died:
                # neither it nor any bind of it is visible.
                assert cycles(conn, "b") == []
                assert bound_by_cycle(conn, "b") == {}
            server = ServeProcess(args, serve_env(), tmp_path / "serve-3.log")
            server.wait_serving()
            outcomes["b"] = retry_is_consistent(server.address, engine, "b", request_b)

            # Pool c: killed the moment its cycle is committed.
            request_c = str(uuid.uuid4())
            thread, errors = schedule_in_thread(server.address, "c", request_c)
            deadline = time.monotonic() + 30
            with engine.connect() as conn:
                while not cycles(conn, "c"):
                    assert time.monotonic() < deadline and thread.is_alive()
                    conn.rollback()
            kill(server)
            thread.join(timeout=30)
            assert [status_of(e) for e in errors] in ([], [grpc.StatusCode.UNAVAILABLE])
            server = ServeProcess(args, serve_env(), tmp_path / "serve-4.log")
            server.wait_serving()
            try:
                outcomes["c"] = retry_is_consistent(server.address, engine, "c", request_c)
            finally:
                assert server.terminate() == 0
            print(f"{outcomes}; dry run of a cycle {dry_run_s:.2f} s")
            assert outcomes["b"] == "not committed before the kill"
            assert outcomes["c"] == "committed before the kill"

            with engine.connect() as conn:
                no_cycle = conn.execute(
                    text(
                        "SELECT count(*) FROM workloads w WHERE w.state = 'bound' AND NOT EXISTS "
                        "(SELECT 1 FROM schedule_cycles c "
                        "WHERE c.id = (w.binding->>'cycle_id')::bigint)"
                    )
                ).scalar_one()
                holding = conn.execute(
                    text(
                        "SELECT binding FROM workloads WHERE state = 'bound' UNION ALL "
                        "SELECT jsonb_build_object('pods', pods) FROM allocation_intervals "
                        "WHERE ended_at IS NULL"
                    )
                ).scalars()
                gpu_use: dict[tuple[str, int], float] = defaultdict(float)
                for binding in holding:
                    for pod in binding["pods"]:
                        for index in pod["gpu_indices"]:
                            gpu_use[(pod["node"], index)] += pod["gpu_fraction"]
        finally:
            engine.dispose()
    assert no_cycle == 0  # every bound workload's decision is stored with it
    assert gpu_use and max(gpu_use.values()) <= 1.0 + 1e-9  # no GPU handed out twice
