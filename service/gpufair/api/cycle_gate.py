"""Coalescing of concurrent `Schedule` calls for one pool within a process: callers that arrive
while a cycle runs share the next one, instead of each queueing for the pool's lock.

Per pool there is at most one cycle running and one waiting (a `Slot`). A caller joins the
waiting slot if there is one; otherwise it opens a new slot and leads it: it waits for the
running cycle to end, closes its slot to newcomers (they open the next), runs one cycle for all
of its members and hands each its reply. Every caller thus gets the decisions of a cycle that
began after it arrived, within about two cycle times of its arrival however many callers there
are, and the pool's lock sees at most one waiter per process.

A member's wait is bounded by its own deadline; a member that gives up leaves the slot's cycle
running for the others (its request id, if any, still gets the stored reply, so a retry replays
it). The slot's cycle runs under the latest deadline of its members (`deadline_s`), not only its
leader's.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from gpufair.store.deadline import DeadlineExceeded

T = TypeVar("T")
K = TypeVar("K")


@dataclass(eq=False)
class Member(Generic[K]):
    """A caller in a slot: what it asked (`key`), and until when it waits (monotonic s)."""

    key: K
    deadline_s: float | None


@dataclass(eq=False)
class Slot(Generic[K, T]):
    members: list[Member[K]] = field(default_factory=list)
    started: bool = False
    done: threading.Event = field(default_factory=threading.Event)
    results: dict[int, T | BaseException] = field(default_factory=dict)  # by id() of a member

    def deadline_s(self) -> float | None:
        """The latest deadline of the members (None if one of them has none)."""
        deadlines = [m.deadline_s for m in self.members]
        return None if None in deadlines else max(d for d in deadlines if d is not None)


class CycleGate(Generic[K, T]):
    """One gate per process, shared by the calls of every pool."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # Per pool: the slot that runs or waits last; its predecessor, if any, runs.
        self._tail: dict[str, Slot[K, T]] = {}

    def call(
        self,
        pool: str,
        key: K,
        remaining_s: float | None,
        run: Callable[[list[Member[K]], float | None], dict[int, T | BaseException]],
    ) -> T:
        """Take part in the next cycle of `pool`; `run(members, deadline_s)` runs it (in the
        thread of the slot's leader) and returns a result per member (by `id`)."""
        deadline_s = None if remaining_s is None else time.monotonic() + remaining_s
        me: Member[K] = Member(key, deadline_s)
        with self._lock:
            tail = self._tail.get(pool)
            if tail is not None and not tail.started:
                slot, before, leader = tail, None, False
            else:
                slot, before, leader = Slot(), tail, True
                self._tail[pool] = slot
            slot.members.append(me)
        if leader:
            self._lead(pool, slot, before, run)
        elif not slot.done.wait(None if deadline_s is None else deadline_s - time.monotonic()):
            raise DeadlineExceeded("the call's deadline passed while its cycle ran")
        result = slot.results[id(me)]
        if isinstance(result, BaseException):
            raise result
        return result

    def _lead(
        self,
        pool: str,
        slot: Slot[K, T],
        before: Slot[K, T] | None,
        run: Callable[[list[Member[K]], float | None], dict[int, T | BaseException]],
    ) -> None:
        try:
            if before is not None:
                before.done.wait()  # bounded: that cycle's statements have timeouts
            with self._lock:
                slot.started = True  # from now on, newcomers open the next slot
            results = run(list(slot.members), slot.deadline_s())
            slot.results.update(results)
        except BaseException as exc:  # every member gets the leader's failure, then it is raised
            for m in slot.members:
                slot.results.setdefault(id(m), exc)
        finally:
            with self._lock:
                slot.started = True
                if self._tail.get(pool) is slot:
                    del self._tail[pool]
            slot.done.set()
