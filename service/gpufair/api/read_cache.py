"""Ready-to-send replies of the read RPCs that change only on a commit (GetFairShare changes when
a recompute commits, GetConfig when a config write does), kept in memory per process.

Each entry holds a reply and the key of the stored state it was built from
(`store/read_versions.py`). A call is answered from memory while nothing committed a new key since
its entry's check: every process counts the commits that move a key, its own when they commit and
those of every other process (replicas, `--processes` siblings) when PostgreSQL's notification of
them arrives (`store/commit_watch.py`, `KeyNotices`), each once: the notification of a commit of
its own, counted already, is not counted again (the rule, and the locking, are written there).
A call that finds the count moved since its entry's check runs the check itself (one caller per
entry, one indexed query; the others wait for it), and the reply is rebuilt only when the key
moved. So a caller reads its own writes on the replica that took them at once, and another
process's commit as soon as its notification is received (median 0.3 ms after the commit returns,
`bench/results/serving.md`); events, submissions and cycles move no key and notify nothing.

The bound for what a notification cannot show: an entry is served only while it was confirmed
current at most `staleness_s` before the call arrived, by its own check or by the listener's
round trip (`KeyNotices.confirmed_at`, every 0.25 s: the count then holds every key committed
before it). If the listener's connection dies, entries are checked again by their own queries,
so any commit shows within `staleness_s` (1 s) whatever happens to the notifications. Without a
listener (`notices` None) only the checks confirm, once an entry is past half its bound. Rows
written other than through gpufair's writers (by hand, a restore, a TRUNCATE) notify as well: a
statement trigger on both key tables sends the same notification (migration 0016).

The bound was 20 ms, kept by checking every entry every 10 ms; under load a check waits for
the interpreter lock (each of its round trips gives it up and takes it back), often longer than
10 ms, and every call arriving past the bound then waited for that check: most of the slow
replies of `bench_serving.py` were such waits. Notifications let the bound be loose and the
freshness tight. Under steady traffic a due check runs ahead of time, once an entry is past half
its bounds, on a thread of the cache's own while the calls are answered from memory. Entries are also rebuilt at least every `max_age_s`, so
what changes without a new key (a value edited in the database by hand, the usage window sliding
over stored history for the warnings) shows within that bound.

A build that raises (an unknown pool: NOT_FOUND) leaves no entry, so the cache holds only what
exists.

A call answered from memory holds no work slot (`api/work_slots.py`) and hands no deadline to
the database layer: only a caller that runs the check itself takes a slot, for the check,
waiting at most until its deadline, and runs the check's queries under that deadline
(`store/deadline.py`). So while every
slot is held by database work (200 clients reporting events), a read waits for none of it; the
cache's own thread checks without a slot (one check at a time per cache).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Generic, TypeVar

from gpufair.api.work_slots import WorkSlots
from gpufair.store.commit_watch import CommitCount, KeyNotices
from gpufair.store.deadline import call_deadline

log = logging.getLogger(__name__)

Key = TypeVar("Key", bound=Hashable)
Reply = TypeVar("Reply")

DEFAULT_STALENESS_S = 1.0
DEFAULT_MAX_AGE_S = 5.0


@dataclass(frozen=True, slots=True)
class _Entry(Generic[Reply]):
    version: Hashable
    reply: Reply
    checked_at: float  # when the last check confirming `version` started
    commits: int  # this process's commit count when that check started
    built_at: float


class ReadCache(Generic[Key, Reply]):
    def __init__(
        self,
        commits: CommitCount | None = None,
        staleness_s: float = DEFAULT_STALENESS_S,
        max_age_s: float = DEFAULT_MAX_AGE_S,
        monotonic: Callable[[], float] = time.monotonic,
        slots: WorkSlots | None = None,
        notices: KeyNotices | None = None,
    ) -> None:
        self.commits = commits if commits is not None else CommitCount()
        self.notices = notices  # bumps `commits` for other processes' commits, and confirms
        self.slots = slots if slots is not None else WorkSlots(None)
        self.staleness_s = staleness_s
        self.max_age_s = max_age_s
        self._monotonic = monotonic
        self._entries: dict[Key, _Entry[Reply]] = {}
        self._locks: dict[Key, threading.Lock] = {}
        self._guard = threading.Lock()
        # Keys whose check the cache's thread is asked to run ahead of time.
        self._pending: dict[Key, Callable[[Hashable], tuple[Hashable, Reply | None]]] = {}
        self._wake = threading.Condition(self._guard)
        self._thread: threading.Thread | None = None
        self._closed = False

    def get(
        self,
        key: Key,
        refresh: Callable[[Hashable], tuple[Hashable, Reply | None]],
        time_left: Callable[[], float | None] | None = None,
    ) -> Reply:
        """The reply for `key`. `refresh(held)` runs the check: given the version of the reply
        held (None to ask for a new one), it returns the current version and, unless that is
        `held`, the reply built for it (a version of None is never held: rebuilt each time).
        `time_left()` is the caller's time left (gRPC's `context.time_remaining`), the longest
        it waits for a work slot when it has to check itself (None: without bound), and the
        deadline of that check's database work."""
        arrived = self._monotonic()
        entry = self._entries.get(key)
        if entry is not None and self._fresh(entry, arrived):
            if self._due(entry, arrived):
                self._check_ahead(key, refresh)
            return entry.reply
        with self._lock(key):
            entry = self._entries.get(key)
            if entry is not None and self._fresh(entry, arrived):
                return entry.reply  # checked by another caller while this one waited
            # A call that gets no slot in time leaves the entry as it was. The check's database
            # work ends by the caller's deadline (`store/deadline.py`).
            remaining_s = None if time_left is None else time_left()
            with self.slots.held(remaining_s), call_deadline(remaining_s):
                try:
                    return self._check(key, refresh).reply
                except BaseException:
                    self._entries.pop(key, None)
                    with self._guard:
                        self._locks.pop(key, None)
                    raise

    def _check_ahead(
        self, key: Key, refresh: Callable[[Hashable], tuple[Hashable, Reply | None]]
    ) -> None:
        """Have the cache's thread check `key` (once, however many calls ask meanwhile)."""
        with self._guard:
            if key in self._pending or self._closed:
                return
            self._pending[key] = refresh
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._check_pending, name="read-cache", daemon=True
                )
                self._thread.start()
            self._wake.notify()

    def _check_pending(self) -> None:
        while True:
            with self._guard:
                while not self._pending and not self._closed:
                    self._wake.wait()
                if self._closed:
                    return
                key, refresh = next(iter(self._pending.items()))
            try:
                with self._lock(key):
                    entry = self._entries.get(key)
                    if entry is not None and self._due(entry, self._monotonic()):
                        self._check(key, refresh)
            except Exception:
                # The entry stays as it was; a call past its bounds checks (and fails) itself.
                log.warning("checking the cached reply of %r failed", key, exc_info=True)
            finally:
                with self._guard:
                    self._pending.pop(key, None)

    def close(self) -> None:
        """Stop the cache's thread (the server's `stop`)."""
        with self._guard:
            self._closed = True
            self._wake.notify()

    def _check(
        self, key: Key, refresh: Callable[[Hashable], tuple[Hashable, Reply | None]]
    ) -> _Entry[Reply]:
        """Run the check (the caller holds the key's lock) and store what it found."""
        entry = self._entries.get(key)
        commits = self.commits.value
        started = self._monotonic()
        rebuild = entry is None or started - entry.built_at > self.max_age_s / 2
        version, reply = refresh(None if rebuild or entry is None else entry.version)
        if reply is None:
            if entry is None or rebuild:
                raise RuntimeError("a refresh without a held reply must build one")
            entry = _Entry(version, entry.reply, started, commits, entry.built_at)
        else:
            entry = _Entry(version, reply, started, commits, started)
        self._entries[key] = entry
        return entry

    def _confirmed_at(self, entry: _Entry[Reply]) -> float:
        """The latest instant up to which `entry` is known current, provided the count has not
        moved since its check: its check's start, or the listener's later confirmation. Read
        before the count, so a notification counted after this reading is seen."""
        if self.notices is None:
            return entry.checked_at
        return max(entry.checked_at, self.notices.confirmed_at)

    def _fresh(self, entry: _Entry[Reply], arrived: float) -> bool:
        return (
            self._confirmed_at(entry) >= arrived - self.staleness_s
            and entry.commits == self.commits.value
            and arrived - entry.built_at <= self.max_age_s
        )

    def _due(self, entry: _Entry[Reply], arrived: float) -> bool:
        return (
            arrived - self._confirmed_at(entry) > self.staleness_s / 2
            or arrived - entry.built_at > self.max_age_s / 2
        )

    def _lock(self, key: Key) -> threading.Lock:
        with self._guard:
            lock = self._locks.get(key)
            if lock is None:
                lock = self._locks[key] = threading.Lock()
            return lock
