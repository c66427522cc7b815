"""The threads grpc's synchronous server runs calls on: what it needs of an executor, and no more.

grpc's server uses its thread pool for two things only: `submit(behaviour, *args)` for each call,
and `add_done_callback` on what that returns (it counts the calls running). A
`concurrent.futures.ThreadPoolExecutor` does more per call, all of it Python run holding the
interpreter lock: a `Future` with a condition variable, whose `set_running_or_notify_cancel` and
`set_result` each take that condition and notify it (nobody waits on it here), a work item, and
on every `submit` and after every call a `threading.Semaphore` (Python code around another
condition) to count the idle threads. That was 5.9 µs of CPU and 33 Python calls per call in one
process, against 3.1 µs and 10 here (`bench/results/serving.md`).

`RpcThreads(n)` keeps the executor's behaviour: threads are started as calls arrive, a new one
only when none is idle, at most `n`; beyond `n` calls at once, the others wait in order for a
thread. A call's exception is logged (grpc's call behaviours catch their own; one that escapes is
grpc's fault). `shutdown` lets the idle threads end (the server's `stop`); they are daemons, so a
process exiting without it does not wait for them either.
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)


class RpcCall:
    """One submitted call: what grpc's server keeps of it (`add_done_callback`)."""

    __slots__ = ("_args", "_behaviour", "_callbacks", "_done", "_kwargs", "_lock")

    def __init__(
        self, behaviour: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> None:
        self._behaviour = behaviour
        self._args = args
        self._kwargs = kwargs
        self._callbacks: list[Callable[[RpcCall], Any]] = []
        self._done = False
        self._lock = threading.Lock()

    def done(self) -> bool:
        return self._done

    def add_done_callback(self, callback: Callable[[RpcCall], Any]) -> None:
        """`callback(self)` once the call has run: now, if it has already."""
        with self._lock:
            if not self._done:
                self._callbacks.append(callback)
                return
        callback(self)

    def run(self) -> None:
        try:
            self._behaviour(*self._args, **self._kwargs)
        except BaseException:
            log.exception("a call on an RPC thread raised")
        finally:
            self._behaviour = self._args = self._kwargs = None  # type: ignore[assignment]
            with self._lock:
                self._done = True
                callbacks, self._callbacks = self._callbacks, []
            for callback in callbacks:
                try:
                    callback(self)
                except Exception:
                    log.exception("a done callback of an RPC thread's call raised")


class RpcThreads:
    """At most `max_threads` threads named `{name}_0`, `{name}_1`, ... (module docstring)."""

    def __init__(self, max_threads: int, name: str = "rpc") -> None:
        if max_threads < 1:
            raise ValueError("max_threads must be at least 1")
        self.max_threads = max_threads
        self._name = name
        self._numbers = itertools.count()
        self._calls: queue.SimpleQueue[RpcCall | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        # Threads waiting for a call that no submitted call has claimed yet (under `_lock`).
        self._idle = 0
        self._closed = False

    @property
    def threads(self) -> int:
        """Threads started so far (they stay until `shutdown`)."""
        return len(self._threads)

    @property
    def idle(self) -> int:
        """Threads waiting for a call that no submitted call has claimed."""
        return self._idle

    def submit(self, behaviour: Callable[..., Any], /, *args: Any, **kwargs: Any) -> RpcCall:
        call = RpcCall(behaviour, args, kwargs)
        with self._lock:
            if self._closed:
                raise RuntimeError("cannot run a call after shutdown")
            if self._idle:
                self._idle -= 1  # an idle thread takes it
            elif len(self._threads) < self.max_threads:
                thread = threading.Thread(
                    target=self._work, name=f"{self._name}_{next(self._numbers)}", daemon=True
                )
                self._threads.append(thread)
                thread.start()
            self._calls.put(call)
        return call

    def _work(self) -> None:
        calls, lock = self._calls, self._lock
        while True:
            call = calls.get()
            if call is None:
                return
            call.run()
            del call
            with lock:
                self._idle += 1

    def shutdown(self) -> None:
        """Let every thread end once the calls queued before this have run."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            for _ in self._threads:
                self._calls.put(None)
