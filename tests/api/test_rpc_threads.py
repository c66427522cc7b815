"""The server's call threads (`api/rpc_threads.py`): started as calls arrive and only when none is
idle, at most `max_threads`, calls beyond that run in order as threads come free, and grpc's done
callbacks run once each, whenever they are added."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import pytest

from gpufair.api.rpc_threads import RpcCall, RpcThreads


def wait_until(condition: Callable[[], bool], timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.001)
    assert condition(), "timed out"


def test_one_call_at_a_time_needs_one_thread() -> None:
    threads = RpcThreads(8)
    names: list[str] = []
    try:
        for _ in range(20):
            done = threading.Event()
            call = threads.submit(lambda: names.append(threading.current_thread().name))
            call.add_done_callback(lambda _c, done=done: done.set())
            assert done.wait(5)
            wait_until(lambda: threads.idle == 1)  # the thread counts itself idle again
        assert threads.threads == 1
        assert set(names) == {"rpc_0"}
    finally:
        threads.shutdown()


def test_at_most_max_threads_and_the_rest_wait_their_turn_in_order() -> None:
    threads = RpcThreads(3)
    release = threading.Event()
    started: list[int] = []
    finished: list[int] = []

    def behaviour(i: int) -> None:
        started.append(i)
        release.wait(5)
        finished.append(i)

    try:
        calls = [threads.submit(behaviour, i) for i in range(10)]
        wait_until(lambda: len(started) == 3)
        time.sleep(0.05)
        assert sorted(started) == [0, 1, 2]  # 3 threads, 7 calls waiting
        assert threads.threads == 3
        release.set()
        wait_until(lambda: all(c.done() for c in calls))
        assert started[3:] == [3, 4, 5, 6, 7, 8, 9]  # taken in the order submitted
        assert sorted(finished) == list(range(10))
        assert threads.threads == 3
    finally:
        threads.shutdown()


def test_a_done_callback_runs_once_whether_added_before_or_after_the_call_ends() -> None:
    threads = RpcThreads(2)
    gate = threading.Event()
    seen: list[tuple[str, RpcCall]] = []
    try:
        call = threads.submit(gate.wait, 5)
        call.add_done_callback(lambda c: seen.append(("before", c)))
        assert not call.done()
        gate.set()
        wait_until(call.done)
        wait_until(lambda: len(seen) == 1)
        call.add_done_callback(lambda c: seen.append(("after", c)))  # runs at once, here
        assert seen == [("before", call), ("after", call)]
    finally:
        threads.shutdown()


def test_a_raising_call_is_logged_and_its_callbacks_still_run(
    caplog: pytest.LogCaptureFixture,
) -> None:
    threads = RpcThreads(1)
    done = threading.Event()

    def fail() -> None:
        raise ValueError("boom")

    try:
        with caplog.at_level(logging.ERROR, logger="gpufair.api.rpc_threads"):
            threads.submit(fail).add_done_callback(lambda _c: done.set())
            assert done.wait(5)
        assert any("boom" in (r.exc_text or "") for r in caplog.records)
        ran = threading.Event()
        threads.submit(ran.set)  # the thread is still there
        assert ran.wait(5)
        assert threads.threads == 1
    finally:
        threads.shutdown()


def test_shutdown_ends_the_threads_and_refuses_new_calls() -> None:
    threads = RpcThreads(4)
    gate = threading.Event()
    before = set(threading.enumerate())
    calls = [threads.submit(gate.wait, 5) for _ in range(4)]
    wait_until(lambda: threads.threads == 4)
    started = [t for t in threading.enumerate() if t not in before]
    assert len(started) == 4
    threads.shutdown()
    gate.set()
    for thread in started:
        thread.join(5)
        assert not thread.is_alive()
    assert all(c.done() for c in calls)  # queued before shutdown: run
    with pytest.raises(RuntimeError):
        threads.submit(gate.wait, 0)
