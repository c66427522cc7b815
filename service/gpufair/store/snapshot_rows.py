"""A pool's holding and pending workloads kept between cycles, brought up to date by reading only
what changed since (issue 16).

The rows are those of `schedule_repo.holding_and_pending`: open allocation intervals (part 0),
bound workloads (part 1) and pending workloads (part 2). Each row version carries `xmin`, the
transaction that wrote it. The rows of one part written by one committed transaction form a
*group* (part, xmin), and a group can only lose rows once its transaction has committed: a row
leaves it when it is updated (its new version has a new xmin, so a new group) or deleted, and no
later transaction can write a version with that xmin. So a group whose row count and key hash
(the XOR of a 64-bit hash of each row's key) are what this cache last saw holds exactly the rows
it holds. A group it knows that lost rows is sent again as its keys alone (its rows that remain
are the versions already held: same key, same xmin); a group it does not know is sent whole.

One statement does it all, so under READ COMMITTED it reads one snapshot of the database (the
reason `holding_and_pending` is one statement): it aggregates the pool's rows into groups,
compares them with the groups the cache sent, and returns every current group's count and hash,
the keys of the known groups that changed and the full rows of the new ones. Groups the cache
holds that are no longer there (every row updated or deleted) are dropped. What PostgreSQL scans
is the same as for a full read; what travels and what Python parses is what changed: nothing
between two dry runs of an idle pool, and after a cycle that bound 1,677 of 20,000 workloads
submitted together, the 1,677 bound rows whole and the other 18,323 uids as keys.

Rows the cycle's own transaction wrote before the read (expired binds released) are in a group
that may still grow after the read, and vanish if the transaction rolls back (a dry run): such
groups (xmin not older than this transaction's id) are kept with a count of -1, so the next read
takes them again whole. Nothing else is trusted from memory: another replica's cycle, the
ingest, a cancellation, a retention delete, a TRUNCATE or a direct SQL edit all change groups and
are read back. Should a known group ever name a key the cache does not hold (it cannot, short of
transaction ids wrapping around onto a group it still holds), the cache starts over with a full
read. Every process keeps its own copy; the database stays the truth.

Callers read a pool's rows under the pool's lock (`services/schedule.py`); the per-pool lock
here only protects the cache itself if someone does not.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Connection, text

from gpufair.domain.model import Allocation, Workload
from gpufair.store.schedule_repo import bindings_from_json
from gpufair.store.workload_repo import SPECS

_CHANGED_ROWS = text(
    """
    WITH cur AS (
        SELECT 0 AS part, xmin AS x, hashint8extended(id, 0) AS k
        FROM allocation_intervals WHERE pool = :pool AND ended_at IS NULL
        UNION ALL
        SELECT CASE state WHEN 'bound' THEN 1 ELSE 2 END, xmin, hashtextextended(uid, 0)
        FROM workloads WHERE pool = :pool AND state IN ('bound', 'pending')
    ),
    groups AS (
        SELECT part, x, x::text::int8 AS xn, count(*) AS n, bit_xor(k) AS h
        FROM cur GROUP BY part, x
    ),
    own AS (SELECT (pg_current_xact_id_if_assigned()::text::int8 % 4294967296) AS own_x),
    known AS (
        SELECT * FROM unnest(CAST(:parts AS int[]), CAST(:xs AS xid[]), CAST(:ns AS int8[]),
                             CAST(:hs AS int8[])) AS k(part, x, n, h)
    ),
    marked AS MATERIALIZED (
        SELECT g.part, g.x, g.xn, g.n, g.h,
               COALESCE((g.xn - own.own_x + 4294967296) % 4294967296 < 2147483648, false) AS mine,
               k.n IS DISTINCT FROM g.n OR k.h IS DISTINCT FROM g.h AS stale,
               k.n IS NULL OR k.n < 0 AS unknown
        FROM groups g CROSS JOIN own LEFT JOIN known k ON k.part = g.part AND k.x = g.x
    ),
    reread AS MATERIALIZED (
        SELECT part, x, xn, unknown OR mine AS whole FROM marked WHERE stale OR mine
    )
    SELECT part, xn AS x, n, h, mine, NULL AS k, NULL AS uid, NULL AS spec_digest,
           NULL AS gpu_type, NULL::jsonb AS pods, NULL::float8 AS at
    FROM marked
    UNION ALL
    SELECT 0, r.xn, NULL, NULL, r.whole, i.id::text, i.workload_uid, w.spec_digest,
           i.gpu_type, CASE WHEN r.whole THEN i.pods END,
           extract(epoch FROM i.started_at)::float8
    FROM allocation_intervals i JOIN reread r ON r.part = 0 AND r.x = i.xmin
         LEFT JOIN workloads w ON r.whole AND w.uid = i.workload_uid
    WHERE EXISTS (SELECT 1 FROM reread WHERE part = 0)
      AND i.pool = :pool AND i.ended_at IS NULL
    UNION ALL
    SELECT r.part, r.xn, NULL, NULL, r.whole, uid, uid, spec_digest, binding->>'gpu_type',
           CASE WHEN r.whole THEN binding->'pods' END,
           CASE state WHEN 'bound' THEN extract(epoch FROM bound_at)::float8
                      ELSE extract(epoch FROM submit_time)::float8 END
    FROM workloads JOIN reread r
         ON r.part = CASE state WHEN 'bound' THEN 1 ELSE 2 END AND r.x = xmin
    WHERE EXISTS (SELECT 1 FROM reread WHERE part > 0)
      AND pool = :pool AND state IN ('bound', 'pending')
    """
)

RUNNING, BOUND, PENDING = 0, 1, 2


# A kept row: (part, key, uid, spec digest, GPU type, pods, instant). The key is the interval's
# id (part 0) or the uid; the instant is when it started (0), was bound (1) or was submitted (2).
_Row = tuple[int, str, str, str, str, Any, float]


@dataclass
class _Group:
    n: int  # -1: read again whole next time (written by the reading transaction)
    h: int
    keys: list[str]


@dataclass
class _PoolRows:
    lock: threading.Lock = field(default_factory=threading.Lock)
    groups: dict[tuple[int, int], _Group] = field(default_factory=dict)
    rows: dict[tuple[int, str], _Row] = field(default_factory=dict)  # by (part, key)
    runs: dict[str, set[str]] = field(default_factory=dict)  # part 0 keys by workload uid
    running: dict[str, Allocation] = field(default_factory=dict)
    bound: dict[str, Allocation] = field(default_factory=dict)
    pending: dict[str, tuple[float, Workload]] = field(default_factory=dict)
    result: tuple[tuple[Allocation, ...], tuple[Workload, ...]] = ((), ())
    reads: int = 0  # statements run
    rows_read: int = 0  # full rows received, over all reads
    keys_read: int = 0  # keys of known groups received, over all reads


class _Restart(Exception):
    """A known group named a key the cache does not hold: read everything afresh."""


class SnapshotRows:
    """The rows of every pool this process schedules, for one database (one per servicer)."""

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._pools: dict[str, _PoolRows] = {}

    def stats(self, pool: str) -> tuple[int, int, int]:
        """(statements run, full rows received, keys of known groups received) for `pool`:
        what tests and benchmarks check."""
        state = self._pools.get(pool)
        return (0, 0, 0) if state is None else (state.reads, state.rows_read, state.keys_read)

    def pools(self) -> set[str]:
        with self._guard:
            return set(self._pools)

    def forget_other_than(self, pools: set[str]) -> None:
        """Drop the rows of every pool not in `pools` (pools deleted from the config); a read
        under way keeps its own reference and is simply not kept."""
        with self._guard:
            for gone in set(self._pools) - pools:
                del self._pools[gone]

    def holding_and_pending(
        self, conn: Connection, pool: str
    ) -> tuple[tuple[Allocation, ...], tuple[Workload, ...]]:
        """What `schedule_repo.holding_and_pending` returns, in the same order, from what
        changed since the last call: allocations of open runs by uid, then bound decisions by
        uid; pending workloads by (submit time, uid)."""
        with self._guard:
            state = self._pools.setdefault(pool, _PoolRows())
        with state.lock:
            try:
                return _refresh(conn, pool, state)
            except _Restart:
                fresh = _PoolRows(
                    reads=state.reads, rows_read=state.rows_read, keys_read=state.keys_read
                )
                with self._guard:
                    self._pools[pool] = fresh
                with fresh.lock:
                    return _refresh(conn, pool, fresh)
            except BaseException:
                with self._guard:
                    self._pools.pop(pool, None)  # half applied: start over next time
                raise


def _refresh(
    conn: Connection, pool: str, state: _PoolRows
) -> tuple[tuple[Allocation, ...], tuple[Workload, ...]]:
    known = list(state.groups.items())
    result = conn.execute(
        _CHANGED_ROWS,
        {
            "pool": pool,
            "parts": _array(str(key[0]) for key, _ in known),
            "xs": _array(str(key[1]) for key, _ in known),
            "ns": _array(str(g.n) for _, g in known),
            "hs": _array(str(g.h) for _, g in known),
        },
    )
    state.reads += 1
    current: dict[tuple[int, int], tuple[int, int, bool]] = {}
    whole: dict[tuple[int, int], list[_Row]] = {}
    keys_only: dict[tuple[int, int], list[str]] = {}
    for part, x, n, h, flag, k, uid, digest, gpu_type, pods, at in result:
        if k is None:
            current[(part, x)] = (n, h, flag)
        elif flag:
            whole.setdefault((part, x), []).append((part, k, uid, digest, gpu_type or "", pods, at))
        else:
            keys_only.setdefault((part, x), []).append(k)
    state.rows_read += sum(len(v) for v in whole.values())
    state.keys_read += sum(len(v) for v in keys_only.values())
    dropped = [key for key in state.groups if key not in current or key in whole]
    if not dropped and not whole and not keys_only:
        return state.result
    dirty_runs: set[str] = set()
    # Known groups that lost rows: what is no longer named goes.
    for key, names in keys_only.items():
        group = state.groups.get(key)
        if group is None:
            raise _Restart
        remaining = set(names)
        if not remaining <= set(group.keys):
            raise _Restart
        for gone in [k for k in group.keys if k not in remaining]:
            _remove(state, state.rows.pop((key[0], gone)), dirty_runs)
        n, h, _ = current[key]
        state.groups[key] = _Group(n, h, names)
    for key in dropped:
        group = state.groups.pop(key)
        for k in group.keys:
            _remove(state, state.rows.pop((key[0], k)), dirty_runs)
    added: list[_Row] = []
    for key, rows in whole.items():
        n, _, mine = current[key]
        state.groups[key] = _Group(-1 if mine else n, current[key][1], [r[1] for r in rows])
        for row in rows:
            state.rows[(row[0], row[1])] = row
        added += rows
    _add(conn, state, added, dirty_runs)
    running = [state.running[uid] for uid in sorted(state.running)]
    running += [state.bound[uid] for uid in sorted(state.bound)]
    pending = sorted(state.pending.items(), key=lambda item: (item[1][0], item[0]))
    state.result = (tuple(running), tuple(w for _, (_, w) in pending))
    return state.result


def _remove(state: _PoolRows, row: _Row, dirty_runs: set[str]) -> None:
    part, key, uid = row[0], row[1], row[2]
    if part == RUNNING:
        keys = state.runs.get(uid)
        if keys is not None:
            keys.discard(key)
            if not keys:
                del state.runs[uid]
        dirty_runs.add(uid)
    elif part == BOUND:
        state.bound.pop(uid, None)
    else:
        state.pending.pop(uid, None)


def _add(conn: Connection, state: _PoolRows, added: list[_Row], dirty_runs: set[str]) -> None:
    for row in added:
        if row[0] == RUNNING:
            state.runs.setdefault(row[2], set()).add(row[1])
            dirty_runs.add(row[2])
    bound = [r for r in added if r[0] == BOUND]
    waiting = [r for r in added if r[0] == PENDING]
    dirty = sorted(dirty_runs)
    groups = {uid: _run_rows(state, uid) for uid in dirty if uid in state.runs}
    keys = [(uid, rows[0][3]) for uid, rows in groups.items()]
    keys += [(r[2], r[3]) for r in (*bound, *waiting)]
    specs = iter(SPECS.workloads(conn, keys))
    for uid in dirty:
        if uid not in groups:
            state.running.pop(uid, None)
    for uid, rows in groups.items():
        state.running[uid] = Allocation(
            workload=next(specs),
            bindings=bindings_from_json([p for r in rows for p in r[5] or ()]),
            started_at_s=rows[0][6],
            gpu_type=rows[0][4],
        )
    for r in bound:
        state.bound[r[2]] = Allocation(
            workload=next(specs),
            bindings=bindings_from_json(r[5] or ()),
            started_at_s=r[6],
            gpu_type=r[4],
        )
    for r in waiting:
        state.pending[r[2]] = (r[6], next(specs))


def _run_rows(state: _PoolRows, uid: str) -> list[_Row]:
    """The open intervals of `uid`, by GPU type (the order of `holding_and_pending`), then start
    and id."""
    rows = [state.rows[(RUNNING, k)] for k in state.runs[uid]]
    rows.sort(key=lambda r: (r[4], r[6], int(r[1])))
    return rows


def _array(values: Any) -> str:
    """A PostgreSQL array literal of numbers (one parameter, not one per element)."""
    return "{" + ",".join(values) + "}"
