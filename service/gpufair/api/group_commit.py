"""Group commit: concurrent callers of one process share a write, each answered after it.

A caller hands its item in and waits. At most `writers` callers at a time write: each takes
every item waiting (its own among them, up to `max_items`), writes them together and wakes their
callers; when more have arrived meanwhile, it hands the writing on to the first of their callers
instead of writing again itself, so that no caller's reply waits on others' writes longer than
one round. A caller whose item is written returns, or raises the error its item got.

The waits are bare locks (a lock held by the waiter, released by the writer): waking one takes
no Python-level condition variable.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

T = TypeVar("T")

# Writes a group: one entry per item, None for an item written, or the error it gets.
WriteGroup = Callable[[Sequence[T]], Sequence[BaseException | None]]


class _Ticket(Generic[T]):
    __slots__ = ("error", "item", "wake", "writes")

    # `writes` is set before `wake` is released: a caller woken with it set writes.

    def __init__(self, item: T) -> None:
        self.item = item
        self.error: BaseException | None = None
        self.writes = False  # woken to write, not because its item is written
        self.wake = threading.Lock()
        self.wake.acquire()


class GroupCommit(Generic[T]):
    """Callers' items written in groups by `write`, at most `writers` groups at once."""

    def __init__(self, write: WriteGroup[T], *, writers: int = 2, max_items: int = 64) -> None:
        if writers < 1 or max_items < 1:
            raise ValueError("a group commit needs at least one writer and one item a group")
        self._write = write
        self._writers = writers
        self._max_items = max_items
        self._lock = threading.Lock()
        self._waiting: list[_Ticket[T]] = []
        self._active = 0  # callers writing now
        self.groups = 0  # groups written, and the items in them: for tests and benchmarks
        self.items = 0

    def submit(self, item: T) -> None:
        """Return once `item` is written; raise the error it got."""
        ticket = _Ticket(item)
        with self._lock:
            if self._active < self._writers:
                self._active += 1
                ticket.writes = True
            else:
                self._waiting.append(ticket)
        if not ticket.writes:
            ticket.wake.acquire()  # released once written, or to write
        if ticket.writes:
            self._write_from(ticket)
        if ticket.error is not None:
            raise ticket.error

    def _write_from(self, own: _Ticket[T]) -> None:
        """Write `own` item and those waiting, then hand the writing on or stop writing."""
        with self._lock:
            take = self._max_items - 1
            group = [own, *self._waiting[:take]]
            del self._waiting[:take]
            self.groups += 1
            self.items += len(group)
        # Until the write says otherwise (an interrupt gets past `except Exception`): the
        # callers are woken in any case, and the writing handed on.
        interrupted = RuntimeError("the group's write was interrupted")
        errors: list[BaseException | None] = [interrupted] * len(group)
        try:
            try:
                written = list(self._write([t.item for t in group]))
                if len(written) != len(group):
                    raise RuntimeError(f"{len(written)} outcomes for a group of {len(group)}")
                errors = written
            except Exception as failure:  # every caller of the group gets it: none was written
                errors = [failure] * len(group)
        finally:
            self._hand_on(group, errors)

    def _hand_on(self, group: list[_Ticket[T]], errors: list[BaseException | None]) -> None:
        with self._lock:
            successor = self._waiting.pop(0) if self._waiting else None
            if successor is None:
                self._active -= 1
            else:
                successor.writes = True
        for ticket, outcome in zip(group, errors, strict=True):
            ticket.error = outcome
        if successor is not None:
            successor.wake.release()
        for ticket in group[1:]:
            ticket.wake.release()
