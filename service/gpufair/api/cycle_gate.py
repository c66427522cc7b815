"""Coalescing of concurrent `Schedule` calls for one pool within a process: callers that arrive
while a cycle runs share it or the next one, instead of each queueing for the pool's lock.

Per pool there is at most one cycle running and one waiting (a `Slot`). A caller joins the
running slot while its cycle has not read the pool yet (its leader may still wait for the pool's
lock, held by another process's cycle), else the waiting slot if there is one; otherwise it
opens a new slot and leads it: it waits for the running cycle to end, runs one cycle for all of
its members, closes its slot to newcomers (they open the next) and hands each its reply. Every
caller thus gets the decisions of a cycle that read the pool after it arrived, within about two
cycle times of its arrival however many callers there are, and the pool's lock sees at most one
waiter per process.

Joining the running cycle (issue 21). A caller that arrives while a cycle runs may take that
cycle's decisions, within one cycle time of its arrival, when the cycle cannot have missed
anything the caller wrote. The gate is given a *commit marker*, a number that grows with every
commit of this process (`store/commit_watch.py`: counted after PostgreSQL confirmed the commit,
before the writing call replies). The cycle samples the marker (`Batch.reading`) just before its
first read of the pool, under the pool's lock; from then until it closes its list of members
(`Batch.late`, just before it stores their request ids) a newcomer joins it if, at its arrival,
the marker still has the sampled value. The rule, precisely:

    a caller joins a running cycle only if no commit of this process was counted between the
    moment that cycle sampled the marker (before its first read) and the caller's arrival.

Then every write this process acknowledged before the caller arrived was counted before the
sample, so it committed before the cycle's first read, which sees it (READ COMMITTED takes a
snapshot per statement). A caller that reported an event, submitted, cancelled or changed the
config through this process and then calls `Schedule` never gets a cycle that missed it. A
write acknowledged by another process or replica is not seen by the marker: a caller that wrote
there gets a cycle that began reading at most one cycle time before its call (the staleness the
read caches allow for other replicas, `api/read_cache.py`), and no decision of any cycle can
share a GPU with another's (the pool's lock, and `store/bind_overlaps.py` for starts). Any
commit of the process (another client's, a periodic job's) closes the running cycle to
newcomers: they wait for the next, as before. Each member keeps the marker at its arrival
(`Member.mark`): `SchedulerServicer._run_slot` uses it for the same rule against a cycle another
process stored after this one's last own cycle.

A member's wait is bounded by its own deadline; a member that gives up leaves the slot's cycle
running for the others (its request id, if any, still gets the stored reply, so a retry replays
it). The slot's cycle runs under the latest deadline of its first members (`deadline_s`), not
only its leader's; a member that joined the running cycle waits within its own.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from gpufair.metrics import SCHEDULE_JOINED_RUNNING
from gpufair.store.deadline import DeadlineExceeded

T = TypeVar("T")
K = TypeVar("K")


@dataclass(eq=False)
class Member(Generic[K]):
    """A caller in a slot: what it asked (`key`), until when it waits (monotonic s), and the
    commit marker at its arrival (None without a marker)."""

    key: K
    deadline_s: float | None
    mark: int | None = None


@dataclass(eq=False)
class Slot(Generic[K, T]):
    members: list[Member[K]] = field(default_factory=list)
    started: bool = False
    # Once started, the slot's cycle has not read the pool yet while `read` is False: any
    # newcomer may join it. Then `mark` is the commit marker it sampled before its first read;
    # None once it closed its members (or failed).
    read: bool = False
    mark: int | None = None
    late: list[Member[K]] = field(default_factory=list)  # joined once the cycle had started
    done: threading.Event = field(default_factory=threading.Event)
    results: dict[int, T | BaseException] = field(default_factory=dict)  # by id() of a member

    def deadline_s(self) -> float | None:
        """The latest deadline of the members (None if one of them has none)."""
        deadlines = [m.deadline_s for m in self.members]
        return None if None in deadlines else max(d for d in deadlines if d is not None)


class Batch(Generic[K, T]):
    """What the leader's `run` gets: the slot's members when the cycle began, their deadline,
    and the two moments of the rule above (`reading`, `late`). Newcomers join the slot until
    `reading` whatever the marker says (the cycle has not read the pool yet), and from then on
    by the rule, until `late`; `late` returns them all."""

    def __init__(self, gate: CycleGate[K, T], slot: Slot[K, T]) -> None:
        self._gate = gate
        self._slot = slot
        self.members = list(slot.members)
        self.deadline_s = slot.deadline_s()

    def reading(self) -> None:
        """Call just before the cycle's first read of the pool: from now on, only newcomers
        whose arrival finds the commit marker unchanged join this cycle."""
        self._gate._open(self._slot)

    def late(self) -> list[Member[K]]:
        """Close the cycle to newcomers; the members that joined it since it started (the run
        must answer them too)."""
        return self._gate._close(self._slot)


class CycleGate(Generic[K, T]):
    """One gate per process, shared by the calls of every pool. `marker` is the process's
    commit marker; without one no caller joins a running cycle."""

    def __init__(self, marker: Callable[[], int] | None = None) -> None:
        self._lock = threading.Lock()
        self._marker = marker
        # Per pool: the slot that runs or waits last; its predecessor, if any, runs.
        self._tail: dict[str, Slot[K, T]] = {}
        self._running: dict[str, Slot[K, T]] = {}  # per pool, the slot whose cycle runs
        self.joined_running = 0  # callers that took the running cycle's decisions

    def call(
        self,
        pool: str,
        key: K,
        remaining_s: float | None,
        run: Callable[[Batch[K, T]], dict[int, T | BaseException]],
    ) -> T:
        """Take part in the running cycle of `pool` (when the rule above allows it) or the
        next; `run(batch)` runs it (in the thread of the slot's leader) and returns a result
        per member (by `id`), the late ones included."""
        deadline_s = None if remaining_s is None else time.monotonic() + remaining_s
        me: Member[K] = Member(key, deadline_s)
        joined = False
        with self._lock:
            me.mark = self._mark()
            tail = self._tail.get(pool)
            running = self._running.get(pool)
            if running is not None and not running.read:  # it has not read the pool yet
                slot, before, leader = running, None, False
                slot.members.append(me)
                slot.late.append(me)
            elif running is not None and running.mark is not None and running.mark == me.mark:
                slot, before, leader = running, None, False
                slot.members.append(me)
                slot.late.append(me)
                self.joined_running += 1
                joined = True
            elif tail is not None and not tail.started:
                slot, before, leader = tail, None, False
                slot.members.append(me)
            else:
                slot, before, leader = Slot(), tail, True
                self._tail[pool] = slot
                slot.members.append(me)
        if joined:
            SCHEDULE_JOINED_RUNNING.labels(pool).inc()
        if leader:
            self._lead(pool, slot, before, run)
        elif not slot.done.wait(None if deadline_s is None else deadline_s - time.monotonic()):
            raise DeadlineExceeded("the call's deadline passed while its cycle ran")
        result = slot.results[id(me)]
        if isinstance(result, BaseException):
            raise result
        return result

    def _mark(self) -> int | None:
        return None if self._marker is None else self._marker()

    def _open(self, slot: Slot[K, T]) -> None:
        with self._lock:
            slot.read = True
            slot.mark = self._mark()

    def _close(self, slot: Slot[K, T]) -> list[Member[K]]:
        with self._lock:
            slot.read = True
            slot.mark = None
            late, slot.late = slot.late, []
        return late

    def _lead(
        self,
        pool: str,
        slot: Slot[K, T],
        before: Slot[K, T] | None,
        run: Callable[[Batch[K, T]], dict[int, T | BaseException]],
    ) -> None:
        try:
            if before is not None:
                before.done.wait()  # bounded: that cycle's statements have timeouts
            with self._lock:
                slot.started = True  # from now on, newcomers open the next slot
                self._running[pool] = slot
                batch = Batch(self, slot)
            results = run(batch)
            slot.results.update(results)
        except BaseException as exc:  # every member gets the leader's failure, then it is raised
            with self._lock:
                slot.read = True
                slot.mark = None
                members = list(slot.members)
            for m in members:
                slot.results.setdefault(id(m), exc)
        finally:
            with self._lock:
                slot.started = slot.read = True
                slot.mark = None
                if self._tail.get(pool) is slot:
                    del self._tail[pool]
                if self._running.get(pool) is slot:
                    del self._running[pool]
                unanswered = [m for m in slot.members if id(m) not in slot.results]
            for m in unanswered:  # a run that forgot late members: theirs is a bug, not a hang
                slot.results[id(m)] = RuntimeError("the cycle gave this caller no reply")
            slot.done.set()
