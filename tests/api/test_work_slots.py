"""Work slots (api/work_slots.py): RPCs that work are limited to `workers`, while `Schedule`
callers that only wait for a shared cycle park on the extra `schedule_waiters` threads. With 2
workers, 40 concurrent callers share two or three cycles; without waiter threads they need many
more, a cycle per thread or so (the issue-21 behaviour at the old default)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc
import pytest
from sqlalchemy import Engine, event, text

from gpufair.api.server import build_server
from gpufair.api.work_slots import DEFAULT_WAITERS, WorkSlots
from gpufair.cli import build_parser
from gpufair.client import GpufairClient
from gpufair.config_file import parse_config
from gpufair.store.database import make_engine
from gpufair.store.deadline import DeadlineExceeded
from gpufair.v1 import scheduler_pb2
from tests.api.test_schedule_coalescing import CLUSTER, one_gpu

CALLERS = 40
CYCLE_S = 0.2  # each cycle's snapshot read is made this slow, so callers overlap


@pytest.fixture
def slow_engine(database_url: str, db: Engine) -> Iterator[Engine]:
    """An engine of its own whose cycles take at least CYCLE_S."""
    engine = make_engine(database_url, pool_size=4)

    def slow(conn: Any, cursor: Any, statement: str, *_: Any) -> None:
        if "hashtextextended" in statement:  # the snapshot's rows (store/snapshot_rows.py)
            time.sleep(CYCLE_S)

    event.listen(engine, "before_cursor_execute", slow)
    yield engine
    engine.dispose()


def cycles_for_concurrent_callers(engine: Engine, db: Engine, waiters: int) -> int:
    running = build_server(engine, "127.0.0.1:0", max_workers=2, schedule_waiters=waiters)
    try:
        address = f"127.0.0.1:{running.port}"
        with GpufairClient(address, timeout_s=60, attempts=1) as c:
            c.apply_config(parse_config(CLUSTER))
            c.submit_workloads([one_gpu(f"w{i:03}") for i in range(100)])
        with db.begin() as conn:
            before = conn.execute(text("SELECT count(*) FROM schedule_cycles")).scalar_one()
        start = threading.Barrier(CALLERS)

        def call(i: int) -> scheduler_pb2.ScheduleResponse:
            with GpufairClient(address, timeout_s=60, attempts=1) as c:
                start.wait()
                return c.schedule("main", request_id=f"caller-{i}")

        with ThreadPoolExecutor(CALLERS) as pool:
            answers = list(pool.map(call, range(CALLERS)))
        assert len(answers) == CALLERS and all(a.cycle_id > 0 for a in answers)
        with db.begin() as conn:
            after = conn.execute(text("SELECT count(*) FROM schedule_cycles")).scalar_one()
        return int(after - before)
    finally:
        running.stop(1.0)


def test_waiting_callers_hold_no_work_slot(slow_engine: Engine, db: Engine) -> None:
    cycles = cycles_for_concurrent_callers(slow_engine, db, waiters=CALLERS)
    assert 1 <= cycles <= 3  # the cycle running when most arrive, and one for all of them


def test_without_waiter_threads_callers_queue_for_threads(slow_engine: Engine, db: Engine) -> None:
    """The behaviour before: 2 threads serve about one caller per cycle each."""
    cycles = cycles_for_concurrent_callers(slow_engine, db, waiters=0)
    assert cycles >= 10


def test_a_call_waits_for_a_slot_until_its_deadline() -> None:
    slots = WorkSlots(1)
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with slots.held(None):
            held.set()
            release.wait()

    holder = threading.Thread(target=hold)
    holder.start()
    held.wait()
    started = time.monotonic()
    with pytest.raises(DeadlineExceeded), slots.held(0.2):
        pass
    assert 0.15 <= time.monotonic() - started < 2.0
    release.set()
    holder.join()
    with slots.held(0.2):  # free again
        pass


def test_slots_are_counted_and_a_call_without_a_deadline_waits_for_one() -> None:
    """Two slots: two holders at once, a third caller gets none within 0.05 s; a caller with
    grpc's "time remaining" of a call without a deadline (about 1e19 s, more than a lock's
    wait can take) waits until a slot is released, and every slot comes back."""
    slots = WorkSlots(2)
    with slots.held(None), slots.held(5.0), pytest.raises(DeadlineExceeded), slots.held(0.05):
        pytest.fail("a third slot was given out of two")
    got = threading.Event()
    first, second = slots.held(None), slots.held(None)
    first.__enter__()
    second.__enter__()

    def wait_without_deadline() -> None:
        with slots.held(1.8e19):
            got.set()

    waiter = threading.Thread(target=wait_without_deadline)
    waiter.start()
    assert not got.wait(0.1)
    first.__exit__(None, None, None)
    assert got.wait(10.0)
    waiter.join()
    second.__exit__(None, None, None)
    # Both free again, none lost or made.
    with slots.held(0.0), slots.held(0.0), pytest.raises(DeadlineExceeded), slots.held(0.0):
        pytest.fail("a slot was made: three given out of two")


def test_a_call_past_its_deadline_while_slots_are_busy_is_told_so(
    slow_engine: Engine, db: Engine
) -> None:
    """One worker, busy with slow dry runs: a ListWorkloads call with a 0.1 s deadline ends
    with DEADLINE_EXCEEDED (not another error), and the dry runs all answer."""
    running = build_server(slow_engine, "127.0.0.1:0", max_workers=1, schedule_waiters=4)
    try:
        address = f"127.0.0.1:{running.port}"
        with GpufairClient(address, timeout_s=60, attempts=1) as c:
            c.apply_config(parse_config(CLUSTER))
            c.submit_workloads([one_gpu("w0")])
            with ThreadPoolExecutor(1) as pool:
                busy = pool.submit(lambda: [c.schedule("main", dry_run=True) for _ in range(3)])
                time.sleep(0.1)
                with pytest.raises(grpc.RpcError) as caught:
                    c.scheduler.ListWorkloads(scheduler_pb2.ListWorkloadsRequest(), timeout=0.1)
                assert caught.value.code() is grpc.StatusCode.DEADLINE_EXCEEDED
                assert len(busy.result()) == 3
    finally:
        running.stop(1.0)


def test_serve_takes_the_servers_default_waiters() -> None:
    args = build_parser().parse_args(["serve"])
    assert (args.workers, args.schedule_waiters) == (32, DEFAULT_WAITERS) == (32, 256)
