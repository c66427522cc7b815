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

import contextlib
import threading
from collections.abc import Iterator

from gpufair.store.deadline import DeadlineExceeded

DEFAULT_WAITERS = 256

# Methods that take their slot themselves, or need none (answered from memory).
EXEMPT_PREFIXES = ("/grpc.health.", "/grpc.reflection.")
# The read caches' methods (`api/read_cache.py`) take a slot only when the caller itself checks
# or rebuilds a reply: a reply served from memory waits for no slot held by database work.
SELF_SLOTTED = frozenset(
    {
        "/gpufair.v1.Scheduler/Schedule",
        "/gpufair.v1.Ledger/GetFairShare",
        "/gpufair.v1.ClusterAdmin/GetConfig",
    }
)


class WorkSlots:
    """`count` slots; None: no limit (tests and tools that build a servicer alone)."""

    def __init__(self, count: int | None) -> None:
        self.count = count
        self._free = None if count is None else threading.BoundedSemaphore(count)

    @contextlib.contextmanager
    def held(self, remaining_s: float | None) -> Iterator[None]:
        """Hold a slot for the block, waiting at most `remaining_s` (None: without bound)."""
        if self._free is None:
            yield
            return
        timeout = None if remaining_s is None else max(0.0, remaining_s)
        if not self._free.acquire(timeout=timeout):
            raise DeadlineExceeded("the call's deadline passed while it waited for a work slot")
        try:
            yield
        finally:
            self._free.release()
