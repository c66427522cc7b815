"""A pool's holding and pending workloads kept between cycles, brought up to date by reading only
the rows that changed since (issue 16).

The rows are those of `schedule_repo.holding_and_pending`: open allocation intervals (part 0),
bound workloads (part 1) and pending workloads (part 2). Each row version carries `xmin`, the
transaction that wrote it. The rows of one part written by one committed transaction form a
*group* (part, xmin), and a group can only lose rows once its transaction has committed: a row
leaves it when it is updated (its new version has a new xmin, so a new group) or deleted, and no
later transaction can write a version with that xmin. So a group whose row count and key hash
(the sum of a 64-bit hash of each row's key) are what this cache last saw holds exactly the rows
it holds; any other group is read again whole.

One statement does it all, so under READ COMMITTED it reads one snapshot of the database (the
reason `holding_and_pending` is one statement): it aggregates the pool's rows into groups,
compares them with the groups the cache sent, and returns every current group's count and hash
plus the full rows of the groups that differ. Groups the cache holds that are no longer there
(every row updated or deleted) are dropped. What PostgreSQL scans is the same as for a full read;
what travels and what Python parses is only what changed: nothing, between two cycles of an idle
pool.

Rows the cycle's own transaction wrote before the read (expired binds released) are in a group
that may still grow after the read, and vanish if the transaction rolls back (a dry run): such
groups (xmin not older than this transaction's id) are kept with a count of -1, so the next read
takes them again. Nothing else is trusted from memory: another replica's cycle, the ingest, a
cancellation, a retention delete, a TRUNCATE or a direct SQL edit all change groups and are read
back. Every process keeps its own copy; the database stays the truth.

Callers read a pool's rows under the pool's lock (`services/schedule.py`); the per-pool lock
here only protects the cache itself if someone does not.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
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
               k.n IS DISTINCT FROM g.n OR k.h IS DISTINCT FROM g.h AS stale
        FROM groups g CROSS JOIN own LEFT JOIN known k ON k.part = g.part AND k.x = g.x
    ),
    reread AS MATERIALIZED (SELECT part, x FROM marked WHERE stale OR mine)
    SELECT part, xn AS x, n, h, mine, NULL AS k, NULL AS uid, NULL AS spec_digest,
           NULL AS gpu_type, NULL::jsonb AS pods, NULL::float8 AS at
    FROM marked
    UNION ALL
    SELECT 0, i.xmin::text::int8, NULL, NULL, NULL, i.id::text, i.workload_uid, w.spec_digest,
           i.gpu_type, i.pods, extract(epoch FROM i.started_at)::float8
    FROM allocation_intervals i JOIN workloads w ON w.uid = i.workload_uid
    WHERE EXISTS (SELECT 1 FROM reread WHERE part = 0)
      AND i.pool = :pool AND i.ended_at IS NULL
      AND i.xmin IN (SELECT x FROM reread WHERE part = 0)
    UNION ALL
    SELECT CASE state WHEN 'bound' THEN 1 ELSE 2 END, xmin::text::int8, NULL, NULL, NULL, uid,
           uid, spec_digest, binding->>'gpu_type', binding->'pods',
           CASE state WHEN 'bound' THEN extract(epoch FROM bound_at)::float8
                      ELSE extract(epoch FROM submit_time)::float8 END
    FROM workloads
    WHERE EXISTS (SELECT 1 FROM reread WHERE part > 0)
      AND pool = :pool AND state IN ('bound', 'pending')
      AND EXISTS (SELECT 1 FROM reread r
                  WHERE r.part = CASE state WHEN 'bound' THEN 1 ELSE 2 END AND r.x = xmin)
    """
)

RUNNING, BOUND, PENDING = 0, 1, 2


@dataclass(frozen=True, slots=True)
class _Row:
    part: int
    key: str  # the interval's id (part 0) or the workload's uid
    uid: str
    spec_digest: str
    gpu_type: str  # empty for pending rows
    pods: Sequence[dict[str, Any]] | None
    t: float  # started (0), bound (1) or submitted (2), POSIX seconds


@dataclass
class _Group:
    n: int  # -1: read again next time (written by the reading transaction)
    h: int
    rows: list[_Row]


@dataclass
class _PoolRows:
    lock: threading.Lock = field(default_factory=threading.Lock)
    groups: dict[tuple[int, int], _Group] = field(default_factory=dict)
    runs: dict[str, list[_Row]] = field(default_factory=dict)  # part 0 rows by workload uid
    running: dict[str, Allocation] = field(default_factory=dict)
    bound: dict[str, Allocation] = field(default_factory=dict)
    pending: dict[str, tuple[float, Workload]] = field(default_factory=dict)
    result: tuple[tuple[Allocation, ...], tuple[Workload, ...]] = ((), ())
    reads: int = 0  # statements run
    rows_read: int = 0  # full rows received, over all reads


class SnapshotRows:
    """The rows of every pool this process schedules, for one database (one per servicer)."""

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._pools: dict[str, _PoolRows] = {}

    def stats(self, pool: str) -> tuple[int, int]:
        """(statements run, full rows received) for `pool`: what tests and benchmarks check."""
        state = self._pools.get(pool)
        return (0, 0) if state is None else (state.reads, state.rows_read)

    def holding_and_pending(
        self, conn: Connection, pool: str
    ) -> tuple[tuple[Allocation, ...], tuple[Workload, ...]]:
        """What `schedule_repo.holding_and_pending` returns, in the same order, from the rows
        that changed since the last call: allocations of open runs by uid, then bound decisions
        by uid; pending workloads by (submit time, uid)."""
        with self._guard:
            state = self._pools.setdefault(pool, _PoolRows())
        with state.lock:
            try:
                return _refresh(conn, pool, state)
            except BaseException:
                self._pools.pop(pool, None)  # half applied: start over next time
                raise


def _refresh(
    conn: Connection, pool: str, state: _PoolRows
) -> tuple[tuple[Allocation, ...], tuple[Workload, ...]]:
    known = list(state.groups.items())
    rows = conn.execute(
        _CHANGED_ROWS,
        {
            "pool": pool,
            "parts": _array(str(key[0]) for key, _ in known),
            "xs": _array(str(key[1]) for key, _ in known),
            "ns": _array(str(g.n) for _, g in known),
            "hs": _array(str(g.h) for _, g in known),
        },
    ).all()
    state.reads += 1
    current: dict[tuple[int, int], tuple[int, int, bool]] = {}
    fresh: dict[tuple[int, int], list[_Row]] = {}
    for r in rows:
        if r.k is None:
            current[(r.part, r.x)] = (r.n, r.h, r.mine)
        else:
            fresh.setdefault((r.part, r.x), []).append(
                _Row(r.part, r.k, r.uid, r.spec_digest, r.gpu_type or "", r.pods, r.at)
            )
    state.rows_read += sum(len(v) for v in fresh.values())
    dropped = [key for key in state.groups if key not in current or key in fresh]
    changed = bool(dropped or fresh)
    dirty_runs: set[str] = set()
    for key in dropped:
        for row in state.groups.pop(key).rows:
            _remove(state, row, dirty_runs)
    added: list[_Row] = []
    for key, group_rows in fresh.items():
        n, h, open_ = current[key]
        state.groups[key] = _Group(-1 if open_ else n, h, group_rows)
        added += group_rows
    for key, (_, _, open_) in current.items():
        if open_ and key not in fresh:  # cannot happen (open groups are always sent): be safe
            raise RuntimeError(f"group {key} of pool {pool!r} was not sent")
    if not changed:
        return state.result
    _add(conn, state, added, dirty_runs)
    running = [state.running[uid] for uid in sorted(state.running)]
    running += [state.bound[uid] for uid in sorted(state.bound)]
    pending = sorted(state.pending.items(), key=lambda item: (item[1][0], item[0]))
    state.result = (tuple(running), tuple(w for _, (_, w) in pending))
    return state.result


def _remove(state: _PoolRows, row: _Row, dirty_runs: set[str]) -> None:
    if row.part == RUNNING:
        group = state.runs.get(row.uid)
        if group is not None:
            group[:] = [r for r in group if r.key != row.key]
            if not group:
                del state.runs[row.uid]
        dirty_runs.add(row.uid)
    elif row.part == BOUND:
        state.bound.pop(row.uid, None)
    else:
        state.pending.pop(row.uid, None)


def _add(conn: Connection, state: _PoolRows, added: list[_Row], dirty_runs: set[str]) -> None:
    for row in added:
        if row.part == RUNNING:
            state.runs.setdefault(row.uid, []).append(row)
            dirty_runs.add(row.uid)
    bound = [r for r in added if r.part == BOUND]
    waiting = [r for r in added if r.part == PENDING]
    dirty = sorted(dirty_runs)
    keys = [(uid, state.runs[uid][0].spec_digest) for uid in dirty if uid in state.runs]
    keys += [(r.uid, r.spec_digest) for r in (*bound, *waiting)]
    specs = iter(SPECS.workloads(conn, keys))
    for uid in dirty:
        group = state.runs.get(uid)
        if group is None:
            state.running.pop(uid, None)
            continue
        group.sort(key=lambda r: (r.gpu_type, r.t, int(r.key)))
        state.running[uid] = Allocation(
            workload=next(specs),
            bindings=bindings_from_json([p for r in group for p in r.pods or ()]),
            started_at_s=group[0].t,
            gpu_type=group[0].gpu_type,
        )
    for r in bound:
        state.bound[r.uid] = Allocation(
            workload=next(specs),
            bindings=bindings_from_json(r.pods or ()),
            started_at_s=r.t,
            gpu_type=r.gpu_type,
        )
    for r in waiting:
        state.pending[r.uid] = (r.t, next(specs))


def _array(values: Any) -> str:
    """A PostgreSQL array literal of numbers (one parameter, not one per element)."""
    return "{" + ",".join(values) + "}"
