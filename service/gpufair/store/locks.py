"""PostgreSQL advisory-lock keys and helpers, written down once.

Pitfalls kept in mind here:
- A session-level lock (`pg_advisory_lock`) on a pooled connection stays held after the connection
  goes back to the pool; so every lock here is transaction-scoped (`pg_advisory_xact_lock`) and is
  released by COMMIT or ROLLBACK, whichever ends the transaction that took it.
- Committing inside the locked block ends the lock with it: take the lock in the same transaction
  as the writes it protects.
- Keys are 64-bit integers; all of gpufair's live in one namespace (the high 32 bits) so they cannot
  collide with another application's locks on a shared database.
"""

from __future__ import annotations

import hashlib
import time

from sqlalchemy import Connection, text

from gpufair.store import stall_guard

_NAMESPACE = 0x67707566  # "gpuf"

MIGRATIONS = (_NAMESPACE << 32) | 1  # Alembic upgrade: replicas starting together serialise
CONFIG = (_NAMESPACE << 32) | 2  # ApplyConfig / DeleteObjects: one change set at a time
# The last step before the commit of whatever adds GPU holders: a cycle's binds (exclusive) and
# an ingest that opens runs (shared). Held only for a read and a withdrawal of bound decisions
# that share GPUs with runs (`store/bind_overlaps.py`), taken after every other lock of the
# transaction: whichever commits second sees the other's holders. Nothing waits for a row lock
# while holding it (the withdrawal skips locked rows), so it cannot take part in a deadlock.
BIND_CHECK = (_NAMESPACE << 32) | 3
# Whatever records pools' capacity (`capacity_repo.record_if_changed`: a config apply, an ingest
# of node capacity events), from its first capacity write to its commit. Each recomputes a pool's
# capacity from the nodes it sees: two at once would each miss the other's change, and the later
# row, the one that counts from then on, would lack the other's. Taken before BIND_CHECK, and
# held by short transactions only (no job, no scheduling cycle takes it).
CAPACITY = (_NAMESPACE << 32) | 4
# The stale sweeper (`services/sweep.py`, exclusive) against the ingests of heartbeats (shared):
# the first lock of either transaction, before any row lock or other key. A batch holding a
# heartbeat takes it shared as its first statement and keeps it to its commit, so the sweeper's
# read of the last signs of life, which waits for it, sees every heartbeat acknowledged before
# the sweep; a heartbeat batch that comes while the sweeper works waits for its (short)
# transaction and is acknowledged after the runs it closed. Shared holders never wait for each
# other. Deadlock-free because it is taken first: a transaction waiting for it holds nothing,
# and the sweeper, holding it, waits only for row locks of transactions that never ask for it
# (run events without heartbeats, cycles, cancellations) or hold it already (impossible while it
# is held exclusive). So never take it after another lock in the same transaction (a second
# batch of heartbeats in a transaction that already wrote a batch of starts, say): the database
# would then detect a deadlock with a waiting sweeper and cancel one of the two.
SWEEP = (_NAMESPACE << 32) | 5


def _named_key(name: str) -> int:
    digest = int.from_bytes(hashlib.sha256(name.encode()).digest()[:4], "big")
    key = (_NAMESPACE << 32) | (digest | 0x80000000)  # high bit set: never equal to a fixed key
    return key - (1 << 64) if key >= 1 << 63 else key


def pool_key(pool: str) -> int:
    """The key that serialises scheduling of one node pool across replicas."""
    return _named_key(pool)


def rollup_key(pool: str) -> int:
    """The key that serialises rewriting one pool's hourly rollups. Taken after the pool's
    scheduling key where both are taken (`Schedule` recomputes under it), never before, so the
    two cannot deadlock. The periodic rollup takes every pool's in one transaction, holding
    nothing else. Two take it alone and wait longer than the engine's lock timeout (10 s) for
    a rollup of another process rewriting a long history, up to 10 minutes
    (`xact_lock_waiting`): retention, one pool at a time, releasing it at once, to wait for the
    rollups in flight (`retention_horizons.record`); and a periodic recompute, as the first
    lock of its transaction (`jobs/runner.py`; the rollup takes it again at once), whose wait
    is no failure (past it the run is `deferred`). Waiting, neither holds another key."""
    return _named_key(f"rollup\0{pool}")


# The first half of every period key (`period_key`): PostgreSQL keeps two-int keys apart from
# bigint ones, so a period's lock never meets a scheduling, rollup or other key above.
PERIODS = _NAMESPACE


def period_key(job: str, period_start_s: float) -> tuple[int, int]:
    """The lock (`pg_advisory_lock`, held by a connection: the one exception to the rule above;
    two-int form `(PERIODS, hash)`) a replica holds on the connection that runs a periodic job's
    period, from before its claim to after its outcome: free while the claim is unfinished means
    its holder is gone (`store/claims_repo.py` has the rule; `claims_repo.release_period` closes
    a connection it cannot release it on, so no pooled connection keeps one). Two periods whose
    hashes meet only make one wait a tick for the other's run."""
    name = f"period\0{job}\0{period_start_s!r}".encode()
    digest = int.from_bytes(hashlib.sha256(name).digest()[:4], "big", signed=True)
    return PERIODS, digest


def xact_lock(conn: Connection, key: int) -> None:
    """Block until this transaction holds `key`; released when the transaction ends."""
    conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": key})


def xact_lock_waiting(conn: Connection, key: int, wait_s: float) -> float:
    """`xact_lock`, waiting up to `wait_s` rather than the engine's lock timeout (10 s) and
    statement timeout (30 s, which bounds a lock wait too), both put back once the lock is
    held; the wait is marked long for the engine's stall bound (`stall_guard.allow`). Returns
    the seconds waited. Past `wait_s` the statement fails as a lock timeout would (the
    transaction is then aborted: roll it back)."""
    saved = conn.execute(_TIMEOUTS_SQL).one()
    wait_ms = f"{int(wait_s * 1000)}"
    conn.execute(_SET_TIMEOUTS_SQL, {"lock": wait_ms, "statement": wait_ms})
    started = time.monotonic()
    with stall_guard.allow(wait_s):
        xact_lock(conn, key)
    waited_s = time.monotonic() - started
    conn.execute(_SET_TIMEOUTS_SQL, {"lock": saved.lock, "statement": saved.statement})
    return waited_s


_TIMEOUTS_SQL = text(
    "SELECT current_setting('lock_timeout') AS lock, "
    "current_setting('statement_timeout') AS statement"
)
# For the rest of the transaction (`set_config(..., true)`, as SET LOCAL).
_SET_TIMEOUTS_SQL = text(
    "SELECT set_config('lock_timeout', :lock, true), "
    "set_config('statement_timeout', :statement, true)"
)

XACT_LOCK_SQL = "SELECT pg_advisory_xact_lock(%(key)s)"
XACT_LOCK_SHARED_SQL = "SELECT pg_advisory_xact_lock_shared(%(key)s)"
