"""Messages of a client stream, read ahead on a thread of their own.

A handler that writes message N to the database can prepare message N+1 while it waits, but
only if N+1 is there already: gRPC's request iterator only blocks. This reader takes messages
off the iterator a few ahead, so the handler can ask "is the next one here?" without waiting,
and wait when it has nothing else to do.
"""

from __future__ import annotations

import enum
import queue
import threading
from collections.abc import Iterator
from typing import Generic, TypeVar, cast

T = TypeVar("T")

_END = object()  # the stream ended


class Pending(enum.Enum):
    NOT_YET = "the next message has not arrived"


class Prefetch(Generic[T]):
    def __init__(self, messages: Iterator[T], depth: int = 1) -> None:
        # Bounded, so that a client sending faster than the handler writes is held back by
        # gRPC's flow control, not buffered here.
        self._queue: queue.Queue[object] = queue.Queue(maxsize=depth)
        self._stopped = threading.Event()
        self._thread = threading.Thread(
            target=self._pull, args=(messages,), name="gpufair-stream-reader", daemon=True
        )
        self._thread.start()

    def _pull(self, messages: Iterator[T]) -> None:
        try:
            for message in messages:
                if not self._put(message):
                    return
        except Exception as error:  # the stream broke: the handler raises it in its turn
            self._put(error)
            return
        self._put(_END)

    def _put(self, item: object) -> bool:
        while not self._stopped.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def take(self, *, wait: bool) -> T | Pending | None:
        """The next message; None once the stream ended; Pending.NOT_YET if `wait` is false and
        the next message has not arrived. Raises what broke the stream."""
        try:
            item = self._queue.get(block=wait)
        except queue.Empty:
            return Pending.NOT_YET
        if item is _END:
            self._queue.put(_END)  # and again for any later call
            return None
        if isinstance(item, Exception):
            raise item
        return cast("T", item)

    def close(self) -> None:
        """Stop reading ahead (the reader ends once the stream gives it a message or ends)."""
        self._stopped.set()
