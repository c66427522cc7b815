"""The coalescing gate alone (api/cycle_gate.py): who shares which cycle, deadlines, failures."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import pytest

from gpufair.api.cycle_gate import CycleGate, Member
from gpufair.store.deadline import DeadlineExceeded


class Cycles:
    """A stand-in for the cycle: numbered runs, each held open until released."""

    def __init__(self) -> None:
        self.started: list[list[str]] = []  # the members' keys of each run, in order
        self.release = threading.Semaphore(0)
        self.running = threading.Event()

    def run(self, members: list[Member[str]], _deadline_s: float | None) -> dict[int, object]:
        self.started.append([m.key for m in members])
        number = len(self.started)
        self.running.set()
        self.release.acquire()
        self.running.clear()
        return {id(m): f"cycle {number}" for m in members}


def wait_until(condition: Callable[[], bool], timeout_s: float = 10.0) -> None:
    end = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < end, "condition not reached"
        time.sleep(0.005)


def test_callers_arriving_while_a_cycle_runs_share_the_next_one() -> None:
    gate: CycleGate[str, object] = CycleGate()
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

    def failing(members: list[Member[str]], deadline_s: float | None) -> dict[int, object]:
        cycles.started.append([m.key for m in members])
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
