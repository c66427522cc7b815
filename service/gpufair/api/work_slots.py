"""How many RPCs of a process do work at once, apart from the threads that run them (issue 21).

gRPC's synchronous server runs each call on a thread of its pool until it returns. A `Schedule`
caller that joined a coalesced cycle (`api/cycle_gate.py`) only waits for it: it holds no
database connection, but it does hold its thread, so with as many threads as RPCs should work at
once (`serve --workers`, 32), a cycle could be shared by at most about 16 callers and 200 callers
waited about 12 cycles (p99 20 cycle times, bench/results/schedule_coalescing.md).

So the two are separate: the pool has `workers + waiters` threads, and a work slot (one of
`workers`) is what a call holds while it works. Every RPC takes one for its whole run
(`WorkSlotInterceptor` in `api/interceptors.py`), except health and reflection (answered from
memory) and `Schedule`, which takes one itself for what it does: a dry run, and the cycle a
slot's leader runs for all its members, and GetFairShare and GetConfig, which take one only when
their reply is not served from memory. A caller that waits for a cycle holds a thread and nothing else, so the `waiters`
threads (256 by default) let 200 callers share each cycle while no more calls than before touch
the database at once. An idle thread costs its stack's touched pages only (the threads are
started as calls arrive; measured in docs/RELIABILITY.md).

A call that cannot get a slot before its deadline ends with DEADLINE_EXCEEDED, as it would have
while queued for a thread.
"""

from __future__ import annotations

import queue
import threading
from types import TracebackType

from gpufair.store.deadline import DeadlineExceeded

DEFAULT_WAITERS = 256

# Methods that take their slot themselves, or need none (answered from memory).
EXEMPT_PREFIXES = ("/grpc.health.", "/grpc.reflection.")
# The read caches' methods (`api/read_cache.py`) take a slot only when the caller itself checks
# or rebuilds a reply: a reply served from memory waits for no slot held by database work. Their
# call's deadline is handed to the database layer there too, for that check only (a reply from
# memory does no database work).
FROM_MEMORY = frozenset({"/gpufair.v1.Ledger/GetFairShare", "/gpufair.v1.ClusterAdmin/GetConfig"})
SELF_SLOTTED = frozenset({"/gpufair.v1.Scheduler/Schedule", *FROM_MEMORY})


class WorkSlots:
    """`count` slots; None: no limit (tests and tools that build a servicer alone).

    The free slots are tokens in a `queue.SimpleQueue`, whose `get` and `put` are C and wait
    without the interpreter lock. A `threading.Semaphore` is Python code around a condition
    variable: each release, and each wait (which makes a lock of its own), ran a few dozen lines
    of Python holding the lock, and in the 200-client mixed run, with every slot taken by calls
    waiting for PostgreSQL, the semaphore's release alone was 6 % of the samples that held the
    interpreter lock (`bench/results/serving.md`)."""

    def __init__(self, count: int | None) -> None:
        self.count = count
        self._free: queue.SimpleQueue[None] | None = None
        if count is not None:
            self._free = queue.SimpleQueue()
            for _ in range(count):
                self._free.put(None)

    def held(self, remaining_s: float | None) -> _Held:
        """Hold a slot for the `with` block, waiting at most `remaining_s` (None: without bound);
        DeadlineExceeded when none came free in time."""
        return _Held(self._free, remaining_s)


class _Held:
    """One call's hold on a slot (the context manager `WorkSlots.held` returns)."""

    __slots__ = ("_free", "_remaining_s")

    def __init__(self, free: queue.SimpleQueue[None] | None, remaining_s: float | None) -> None:
        self._free = free
        self._remaining_s = remaining_s

    def __enter__(self) -> None:
        if self._free is None:
            return
        remaining_s = self._remaining_s
        # A call without a deadline has grpc's "time remaining" of centuries: past what a
        # lock's wait can be given (threading.TIMEOUT_MAX), so it waits without a bound.
        if remaining_s is not None and remaining_s >= threading.TIMEOUT_MAX:
            remaining_s = None
        try:
            self._free.get(timeout=None if remaining_s is None else max(0.0, remaining_s))
        except queue.Empty:
            raise DeadlineExceeded(
                "the call's deadline passed while it waited for a work slot"
            ) from None

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if self._free is not None:
            self._free.put(None)
