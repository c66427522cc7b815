"""Per-engine counts of the commits this process has finished, for two readers:

- `commit_count`: every commit. `Schedule`'s gate (`api/cycle_gate.py`) lets a caller join a
  running cycle only when no commit of this process came between that cycle's first read and
  the caller's arrival, so a write the caller made (events, submissions) is never missed.
- `key_commit_count`: only commits that moved a read cache's key, for the read caches
  (`api/read_cache.py`): a reply checked before one of this process's own writes committed is
  not served after it, so a caller reads its own writes on the replica that took them at once.
  A key moves with a fair-share run or a config version (`store/read_versions.py`); their
  writers call `wrote_read_key` in the transaction. Other commits (events reported, workloads
  submitted, cycles recorded: hundreds a second under load) leave the cached replies current,
  and counting them made nearly every read after them check the database, one caller at a time
  per entry.

A commit is counted when its connection goes back to the pool, which is after the database
confirmed it and before the writing RPC replies. Commits made on the raw driver connection are
not seen; the caches' staleness bound covers them as it covers other replicas.

Commits of other processes (replicas, the siblings of `gpufair serve --processes`) reach the same
count through PostgreSQL: a statement that writes a key table (`fair_share_runs`,
`config_versions`) sends `NOTIFY gpufair_read_keys` from a trigger (migration 0016), whoever
writes it, gpufair or a person by hand or a restore; PostgreSQL delivers it only if the
transaction commits, once however many statements sent it. `KeyNotices` listens on a
connection of its own and bumps the count for each notification it receives. So a read cache
checks again as soon as any process committed a new key, instead of checking every few
milliseconds in case one did. A notification cannot show that nothing was committed, though:
a listener whose connection died silently hears nothing. `KeyNotices` therefore sends one
round trip every `heartbeat_s`; PostgreSQL delivers the notifications of every commit before
that statement ahead of its reply, so when the reply comes, the count includes every key
committed before the round trip started (`confirmed_at`). A cache serves a reply only while
its own check or that confirmation is at most its staleness bound old (`api/read_cache.py`).

Each key commit of this process is counted once. The trigger notifies of this process's own key
commits too, and the count moved for them as their connection came back to the pool; counting
the notification again made every reply checked between the two check the database a second
time for nothing. A notification carries the process id of the database backend that
committed; the key count keeps, per backend of this engine's connections, the key commits not
heard of yet, recorded as each is sent (`CommitCount.expect`, before the commit, so its
notification cannot come first) and counted as its connection comes back (`settle`). A
notification (`heard`) takes its backend's oldest such commit: one counted already makes it
count nothing; one still on its way to the pool is left for the pool's return to count, and
until that return the listener confirms nothing (`confirmed` says so), so the count still holds
every key committed before a confirmation; a notification from any other backend is counted,
whoever sent it. That cannot hide another process's commit: a backend's process id is no other
connection's while the connection lives, and its record is dropped when it closes (a
notification still on its way is then counted a second time, which costs one check and no
freshness). A notification of another commit of the same connection (one not marked, say) that
takes the place of a marked commit still on its way is covered by that commit's count, which
comes after both. A commit counted but never heard (written while no listener was connected, or
a marked transaction that wrote no key table) is dropped at the first round trip started after
it was counted, since every notification of a commit before that round trip has arrived by its
reply, or when a new listening connection starts listening after it; until then it could take
the notification of an unmarked key write on its connection, so `wrote_read_key` is for
transactions that write a key table, as its two callers do. Behind a connection pooler that
does not keep one server process per connection the process ids do not match, and each own key
commit is counted twice, as before.

Locking: each `CommitCount` has one lock, held only to read and change its count and its
record of unheard commits (no database work under it); the writers' threads take it as a key
commit is sent, as their connection comes back to the pool and as one closes, the listener's
thread for each
notification and confirmation, and readers of `value` take none (an int read is atomic). One
`KeyNotices` at most listens for a count (`listened`; a second one's `start` is refused, since
each would count the other processes' notifications once more); without one no commit is
recorded. Servers of one process that share an engine share its listener (`key_notices`: the
first starts it, the last to `close` it stops it), under `_GUARD`.
"""

from __future__ import annotations

import logging
import math
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, Engine, event

log = logging.getLogger(__name__)

CHANNEL = "gpufair_read_keys"
DEFAULT_HEARTBEAT_S = 0.25


@dataclass(slots=True, eq=False)
class OwnCommit:
    """A key commit of this process, on the connection of database backend `pid`."""

    pid: int | None
    counted_at: float | None = None  # on `CommitCount`'s clock; None until it is counted


class CommitCount:
    """A count of commits; for the read caches, also the record of this process's key commits
    not heard of yet (module docstring: each counted once, and the locking rules)."""

    def __init__(self, monotonic: Callable[[], float] = time.monotonic) -> None:
        self._lock = threading.Lock()
        self._count = 0
        self._monotonic = monotonic  # the scale of `KeyNotices.confirmed_at`
        self.listened = False  # a `KeyNotices` counts notifications into it
        self._unheard: dict[int, deque[OwnCommit]] = {}  # by backend, in commit order
        self._heard_early: set[OwnCommit] = set()  # heard before their connection came back

    @property
    def value(self) -> int:
        return self._count

    def bump(self) -> None:
        with self._lock:
            self._count += 1

    def expect(self, pid: int | None) -> OwnCommit:
        """A key commit about to be sent on backend `pid`'s connection; recorded only while a
        listener hears notifications (else nothing would ever take it out)."""
        commit = OwnCommit(pid)
        if pid is not None and self.listened:
            with self._lock:
                self._unheard.setdefault(pid, deque()).append(commit)
        return commit

    def settle(self, commits: list[OwnCommit]) -> None:
        """Count a connection's key commits as it comes back to the pool, after the database
        confirmed them and before the writing call replies."""
        with self._lock:
            self._count += 1
            now = self._monotonic()
            for commit in commits:
                commit.counted_at = now
                self._heard_early.discard(commit)

    def heard(self, pid: int) -> bool:
        """A notification from backend `pid`: counted (True) unless that backend has a key
        commit not heard of yet, which it takes: counted already, or to be counted when its
        connection comes back to the pool."""
        with self._lock:
            queue = self._unheard.get(pid)
            if not queue:
                self._count += 1
                return True
            own = queue.popleft()
            if not queue:
                del self._unheard[pid]
            if own.counted_at is None:
                self._heard_early.add(own)
            return False

    def confirmed(self, started: float) -> bool:
        """A round trip that started at `started` came back (or LISTEN began then): key commits
        counted before it and still unheard will not be heard; forget them. False while a
        commit heard of is still to be counted: the count does not hold it yet."""
        with self._lock:
            for pid, queue in list(self._unheard.items()):
                while queue and queue[0].counted_at is not None and queue[0].counted_at < started:
                    queue.popleft()
                if not queue:
                    del self._unheard[pid]
            return not self._heard_early

    def closed(self, pid: int) -> None:
        """Backend `pid`'s connection closed: another connection may get its process id."""
        with self._lock:
            self._unheard.pop(pid, None)

    def stop_listening(self) -> None:
        with self._lock:
            self.listened = False
            self._unheard.clear()
            self._heard_early.clear()

    @property
    def unheard(self) -> int:
        """Key commits of this process counted or under way and not heard of yet."""
        with self._lock:
            return sum(len(queue) for queue in self._unheard.values())


_COUNTS: weakref.WeakKeyDictionary[Engine, tuple[CommitCount, CommitCount]] = (
    weakref.WeakKeyDictionary()
)
_GUARD = threading.Lock()
_COMMITTED = "gpufair_committed"
_KEY_COMMITTED = "gpufair_read_key_committed"
_KEY_WRITTEN = "gpufair_read_key_written"


def wrote_read_key(conn: Connection) -> None:
    """Mark `conn`'s transaction as one that moves a read cache's key: its commit is counted
    here at once. Other processes (`KeyNotices`) are told by the key tables' trigger. Only for a
    transaction that writes a key table (module docstring)."""
    conn.info[_KEY_WRITTEN] = True


def commit_count(engine: Engine) -> CommitCount:
    """The engine's count of all commits, watched from the first call on."""
    return _counts(engine)[0]


def key_commit_count(engine: Engine) -> CommitCount:
    """The engine's count of commits that moved a read cache's key (`wrote_read_key`)."""
    return _counts(engine)[1]


def _counts(engine: Engine) -> tuple[CommitCount, CommitCount]:
    """Both counts of `engine` (one set of listeners per engine)."""
    with _GUARD:
        counts = _COUNTS.get(engine)
        if counts is not None:
            return counts
        counts = _COUNTS[engine] = (CommitCount(), CommitCount())
    every, keys = counts

    def committed(conn: Connection) -> None:
        # Before the commit is sent: its notification cannot arrive before it is recorded.
        conn.info[_COMMITTED] = True
        if conn.info.pop(_KEY_WRITTEN, False):
            pid = _backend_pid(conn.connection.dbapi_connection)
            conn.info.setdefault(_KEY_COMMITTED, []).append(keys.expect(pid))

    def rolled_back(conn: Connection) -> None:
        conn.info.pop(_KEY_WRITTEN, None)

    def checked_in(_dbapi_conn: Any, record: Any) -> None:
        if record is None:
            return
        if record.info.pop(_COMMITTED, False):
            every.bump()
        own = record.info.pop(_KEY_COMMITTED, None)
        if own is not None:
            keys.settle(own)

    def closed(dbapi_conn: Any, _record: Any) -> None:
        pid = _backend_pid(dbapi_conn)
        if pid is not None:
            keys.closed(pid)

    event.listen(engine, "commit", committed)
    event.listen(engine, "rollback", rolled_back)
    event.listen(engine.pool, "checkin", checked_in)
    event.listen(engine.pool, "close", closed)
    return counts


def _backend_pid(dbapi_conn: Any) -> int | None:
    """The process id of the database backend of a driver connection (no round trip); None
    when it cannot be read."""
    try:
        pid = dbapi_conn.info.backend_pid
    except Exception:
        return None
    return pid if isinstance(pid, int) and pid > 0 else None


class KeyNotices:
    """Bumps `count` for each `NOTIFY gpufair_read_keys` PostgreSQL delivers (module docstring),
    on a thread and a connection of its own (taken from `engine`'s pool and detached from it).

    `confirmed_at` (on `monotonic`'s scale) is when the last round trip that came back started:
    every key committed before it is in `count` (a round trip that finds a commit of this process
    heard of but not yet counted confirms nothing). It stays where it was while the connection is
    down (the thread connects again every `heartbeat_s`), and the count is bumped on every new
    connection, since a commit may have gone unheard between two. A notification of one of this
    process's key commits is not counted: the commit is, as its connection comes back to the pool
    (module docstring). `heard` counts every notification received, `own` those."""

    def __init__(
        self,
        engine: Engine,
        count: CommitCount,
        heartbeat_s: float = DEFAULT_HEARTBEAT_S,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._engine = engine
        self.count = count
        self.heartbeat_s = heartbeat_s
        self._monotonic = monotonic
        self.confirmed_at = -math.inf
        self.heard = 0  # notifications received
        self.own = 0  # of them, of this process's key commits counted already
        self._stop = threading.Event()
        self._users = 0  # servers using it (`key_notices`); stopped when the last closes
        self._conn: Any = None
        self._thread = threading.Thread(target=self._listen, name="key-notices", daemon=True)

    def start(self) -> KeyNotices:
        """Listen; refused (RuntimeError) while another listener counts into `count`."""
        with _GUARD:
            return self._start()

    def _start(self) -> KeyNotices:
        if self.count.listened:
            raise RuntimeError("another KeyNotices listens for this count: share it")
        self.count.listened = True
        self._users = 1
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop the thread once its last user closes it (`key_notices`), waiting at most a
        heartbeat and a second for it: a thread still connecting (the database is down,
        `connect_timeout` is 5 s) is a daemon and ends with the process, so a server's bounded
        shutdown does not wait for it."""
        with _GUARD:
            if self._users == 0:  # never started, or closed already
                return
            self._users -= 1
            if self._users > 0:
                return
            if _LISTENERS.get(self._engine) is self:
                del _LISTENERS[self._engine]
            # At once, so a listener started next can claim the count; until this thread ends,
            # a notification it hears may be counted once more (one check, no freshness lost).
            self.count.stop_listening()
        self._stop.set()
        self._thread.join(timeout=self.heartbeat_s + 1.0)

    def _connect(self) -> Any:
        proxy = self._engine.raw_connection()
        conn: Any = proxy.driver_connection
        proxy.detach()
        conn.rollback()  # the engine's connect hook may have left a transaction open
        conn.autocommit = True
        started = self._monotonic()
        conn.execute(f"LISTEN {CHANNEL}")
        self.count.confirmed(started)  # commits counted before it: never to be heard
        return conn

    def _listen(self) -> None:
        while not self._stop.is_set():
            try:
                if self._conn is None:
                    self._conn = self._connect()
                    self.count.bump()
                self._confirm_and_wait(self._conn)
            except Exception:
                log.warning("listening for read-key commits failed", exc_info=True)
                conn, self._conn = self._conn, None
                if conn is not None:
                    conn.close()
                self._stop.wait(self.heartbeat_s)
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def _confirm_and_wait(self, conn: Any) -> None:
        """One round trip, then the notifications it brought and those that come within
        `heartbeat_s`, each counted as it is received."""
        started = self._monotonic()
        conn.execute("SELECT 1")
        for notify in conn.notifies(timeout=0):  # what arrived with the round trip
            self._heard(notify.pid)
        if self.count.confirmed(started):
            self.confirmed_at = started
        for notify in conn.notifies(timeout=self.heartbeat_s):
            self._heard(notify.pid)
            if self._stop.is_set():
                return

    def _heard(self, pid: int) -> None:
        self.heard += 1
        if not self.count.heard(pid):
            self.own += 1


_LISTENERS: weakref.WeakKeyDictionary[Engine, KeyNotices] = weakref.WeakKeyDictionary()


def key_notices(engine: Engine) -> KeyNotices:
    """The listener of `engine`'s key count (`key_commit_count`), shared by every server of this
    process on that engine: started by the first call, stopped when each caller has closed it."""
    count = key_commit_count(engine)
    with _GUARD:
        notices = _LISTENERS.get(engine)
        if notices is not None:
            notices._users += 1
            return notices
        notices = _LISTENERS[engine] = KeyNotices(engine, count)._start()
        return notices
