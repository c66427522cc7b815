"""The coalescing gate alone (api/cycle_gate.py): who shares which cycle, who may join the running
one (the commit-marker rule), deadlines, failures."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import pytest

from gpufair.api.cycle_gate import Batch, CycleGate
from gpufair.store.deadline import DeadlineExceeded


class Cycles:
    """A stand-in for the cycle: numbered runs, each held open until released. A run marks its
    first read (`Batch.reading`) as it starts, and closes its members as it ends."""

    def __init__(self) -> None:
        self.started: list[list[str]] = []  # the members' keys of each run, in order
        self.late: list[list[str]] = []  # the keys that joined each run while it ran
        self.release = threading.Semaphore(0)
        self.running = threading.Event()

    def run(self, batch: Batch[str, object]) -> dict[int, object]:
        self.started.append([m.key for m in batch.members])
        number = len(self.started)
        batch.reading()
        self.running.set()
        self.release.acquire()
        self.running.clear()
        late = batch.late()
        self.late.append([m.key for m in late])
        return {id(m): f"cycle {number}" for m in [*batch.members, *late]}


def wait_until(condition: Callable[[], bool], timeout_s: float = 10.0) -> None:
    end = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < end, "condition not reached"
        time.sleep(0.005)


def test_callers_arriving_while_a_cycle_runs_share_the_next_one() -> None:
    gate: CycleGate[str, object] = CycleGate()  # no commit marker: nobody joins a running cycle
    cycles = Cycles()
    with ThreadPoolExecutor(6) as pool:
        first = pool.submit(gate.call, "main", "a", None, cycles.run)
        wait_until(cycles.running.is_set)
        later = [pool.submit(gate.call, "main", k, None, cycles.run) for k in "bcde"]
        time.sleep(0.2)  # they all wait: one cycle runs, none other started
        assert cycles.started == [["a"]]
        other_pool = pool.submit(gate.call, "other", "x", None, cycles.run)
        wait_until(lambda: len(cycles.started) == 2)  # another pool is not held up
        cycles.release.release()  # pool other's cycle or main's first: either ends
        cycles.release.release()
        wait_until(lambda: len(cycles.started) == 3)
        cycles.release.release()
        replies = [f.result(10) for f in (first, *later, other_pool)]

    assert sorted(cycles.started[2]) == ["b", "c", "d", "e"]  # one cycle for the four
    assert replies[1:5] == [replies[1]] * 4 and replies[1] == "cycle 3"


def test_a_caller_past_its_deadline_stops_waiting_and_the_cycle_goes_on() -> None:
    gate: CycleGate[str, object] = CycleGate()
    cycles = Cycles()
    with ThreadPoolExecutor(3) as pool:
        first = pool.submit(gate.call, "main", "a", None, cycles.run)
        wait_until(cycles.running.is_set)
        leader = pool.submit(gate.call, "main", "b", None, cycles.run)
        time.sleep(0.05)
        hurried = pool.submit(gate.call, "main", "c", 0.2, cycles.run)
        with pytest.raises(DeadlineExceeded):
            hurried.result(10)
        cycles.release.release()
        wait_until(lambda: len(cycles.started) == 2)
        cycles.release.release()
        assert (first.result(10), leader.result(10)) == ("cycle 1", "cycle 2")
    assert cycles.started == [["a"], ["b", "c"]]  # its place was kept; its reply unread


def test_a_failed_cycle_fails_every_caller_that_shared_it_and_the_next_cycle_runs() -> None:
    gate: CycleGate[str, object] = CycleGate()
    cycles = Cycles()

    def failing(batch: Batch[str, object]) -> dict[int, object]:
        cycles.started.append([m.key for m in batch.members])
        raise RuntimeError("the database went away")

    with ThreadPoolExecutor(3) as pool:
        first = pool.submit(gate.call, "main", "a", None, cycles.run)
        wait_until(cycles.running.is_set)
        shared = [pool.submit(gate.call, "main", k, None, failing) for k in "bc"]
        time.sleep(0.05)
        cycles.release.release()
        for f in shared:
            with pytest.raises(RuntimeError, match="went away"):
                f.result(10)
        assert first.result(10) == "cycle 1"
        again = pool.submit(gate.call, "main", "d", None, cycles.run)
        wait_until(cycles.running.is_set)
        cycles.release.release()
        assert again.result(10) == "cycle 3"
    assert cycles.started == [["a"], ["b", "c"], ["d"]]


class Marker:
    """A stand-in for the process's commit count."""

    def __init__(self) -> None:
        self.value = 0

    def __call__(self) -> int:
        return self.value


def test_a_caller_arriving_with_no_commit_since_the_cycle_read_takes_that_cycle() -> None:
    marker = Marker()
    gate: CycleGate[str, object] = CycleGate(marker)
    cycles = Cycles()
    with ThreadPoolExecutor(4) as pool:
        first = pool.submit(gate.call, "main", "a", None, cycles.run)
        wait_until(cycles.running.is_set)  # read the pool; holds its decisions open
        joined = [pool.submit(gate.call, "main", k, None, cycles.run) for k in "bc"]
        wait_until(lambda: gate.joined_running == 2)
        cycles.release.release()
        replies = [f.result(10) for f in (first, *joined)]
    assert replies == ["cycle 1"] * 3  # one cycle, not two
    assert cycles.started == [["a"]] and cycles.late == [["b", "c"]]


def test_a_commit_after_the_cycle_read_sends_later_callers_to_the_next_cycle() -> None:
    marker = Marker()
    gate: CycleGate[str, object] = CycleGate(marker)
    cycles = Cycles()
    with ThreadPoolExecutor(4) as pool:
        first = pool.submit(gate.call, "main", "a", None, cycles.run)
        wait_until(cycles.running.is_set)
        before = pool.submit(gate.call, "main", "b", None, cycles.run)
        wait_until(lambda: gate.joined_running == 1)
        marker.value += 1  # a write of this process committed after the cycle's first read
        after = pool.submit(gate.call, "main", "c", None, cycles.run)
        time.sleep(0.1)
        assert gate.joined_running == 1  # c waits for the next cycle
        cycles.release.release()
        wait_until(lambda: len(cycles.started) == 2)
        cycles.release.release()
        replies = [f.result(10) for f in (first, before, after)]
    assert replies == ["cycle 1", "cycle 1", "cycle 2"]
    assert cycles.started == [["a"], ["c"]] and cycles.late == [["b"], []]


def test_callers_join_a_started_cycle_until_it_closes_its_members() -> None:
    marker = Marker()
    gate: CycleGate[str, object] = CycleGate(marker)
    reading, closed = threading.Event(), threading.Event()
    go_read, go_close, go_end = threading.Event(), threading.Event(), threading.Event()
    lates: list[list[str]] = []

    def run(batch: Batch[str, object]) -> dict[int, object]:
        go_read.wait()
        batch.reading()
        reading.set()
        go_close.wait()
        late = batch.late()
        lates.append([m.key for m in late])
        closed.set()
        go_end.wait()
        return {id(m): "first" for m in [*batch.members, *late]}

    def second(batch: Batch[str, object]) -> dict[int, object]:
        return {id(m): "second" for m in batch.members}

    with ThreadPoolExecutor(4) as pool:
        first = pool.submit(gate.call, "main", "a", None, run)
        time.sleep(0.05)  # started, not yet reading (waiting for the pool's lock, say)
        marker.value += 1  # a commit before the cycle's first read: it will see it
        early = pool.submit(gate.call, "main", "b", None, second)
        time.sleep(0.05)
        go_read.set()
        reading.wait(10)
        during = pool.submit(gate.call, "main", "c", None, second)
        wait_until(lambda: gate.joined_running == 1)
        go_close.set()
        closed.wait(10)
        late = pool.submit(gate.call, "main", "d", None, second)
        time.sleep(0.05)
        go_end.set()
        replies = [f.result(10) for f in (first, early, during, late)]
    # b joined before the first read (whatever the marker), c after it by the rule, d after
    # the close: d alone waits for the next cycle.
    assert replies == ["first", "first", "first", "second"]
    assert lates == [["b", "c"]] and gate.joined_running == 1
