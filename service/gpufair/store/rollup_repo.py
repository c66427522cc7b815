"""Hourly rollups (replace semantics) and decayed usage read back from them.

A pool's watermark says up to which hour the rollups are complete. Ingestion inserts a dirty mark
(`rollup_dirty_marks`) for each pool whose usage it changed, from the earliest instant changed (a
late event, a run closed by the sweeper, or simply a start now); the next rollup recomputes from
the earlier of the watermark and its marks. A change of the pool's half-life or usage basis
changes what every moment means, so all of the pool's history is redone. A change of nodes alone
reaches the buckets only through the capacity, whose change leaves a dirty mark, and budgets not
at all. The capacity the buckets and the edges divide by is the pool's rows plus what running
work held on its nodes while they were not ready (`capacity_repo.usage_capacity`): a drain
under work leaves U' as it was until that work ends, as it leaves the shares.

A change of the config's queues, GPU types or pools changes what a bucket is made of (the tree
that sums the leaves, the deserved quotas and the GPU types' weights that the over-quota usage
is counted against, in `fairness_hourly` under `usage_basis: over_quota` and in `usage_hourly`'s
`over_quota_cu_seconds` under either basis), not what its moments mean. What a fair share reads
of them is only the pool's usage window (`domain.retention_horizon.window_reads_from`: the
window's start, 53 half-lives for all history with a half-life, everything without one), so such
a change redoes the buckets from the hour the window reads from, and the watermark records that
hour (`current_from`): from it on, the buckets agree with the config stamped. When the window
later reads further back (lengthened, a tumbling anchor moved, a window dropped for all history,
or simply an earlier `now`), the next rollup first redoes the buckets from there. A redo that
reaches the pool's first run, or where retention keeps its rollups from, leaves no older bucket
(NULL). Buckets the window never reads again keep over-quota usage counted against the quota,
weights and tree in force when they were rolled up: the `report.usage_*` views' over-quota
CU-hours of last month are last month's, not last month's usage measured against today's quota.

No rollup writes a bucket before the hour retention keeps the pool's rollups from
(`retention_horizons`), however old its watermark (the pool's rollups skipped while retention
ran, or a pool configured again after it was removed): the runs that ended before that hour are
gone, and a bucket made of what outlived them would hold less than what ran. The decayed usage
and the budgets never read there (the usage window and every budget's period hold the horizon),
but the `report` views read every bucket. The horizon is read under the pool's rollup lock,
before the runs: retention records a new one, then waits for that lock before it deletes
anything (`retention_horizons.record`), so a rollup that read the older horizon has read its
runs before any of them goes.

Rerunning a rollup is harmless: rows of the buckets it covers are replaced, never added to.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, text

from gpufair.domain.model import ClusterConfig, NodePool
from gpufair.domain.policy import deserved_cu_with_types
from gpufair.domain.retention_horizon import window_reads_from
from gpufair.domain.rollup import (
    HOUR_S,
    TypedInterval,
    add_usage,
    bucket_moments,
    ceil_hour,
    floor_hour,
    range_usage,
    type_usage,
)
from gpufair.domain.usage import Segment, UsageInputs, window_bounds
from gpufair.store import capacity_repo, config_repo, locks, queue_history
from gpufair.store.ledger_tables import LONG_OR_OPEN, SHORT_RUN

ROOT = ""  # the queue column of a pool's root row (the group of top-level queues)


@dataclass(frozen=True, slots=True)
class Watermark:
    rolled_up_to_s: float
    half_life_s: float | None
    usage_basis: str
    config_version: int
    current_from_s: float  # the buckets from here on were made with `config_version`; -inf: all


def _watermark(conn: Connection, pool: str) -> Watermark | None:
    row = conn.execute(
        text(
            "SELECT extract(epoch FROM rolled_up_to)::float8 AS upto, half_life_s, usage_basis, "
            "config_version, extract(epoch FROM current_from)::float8 AS current_from "
            "FROM rollup_watermarks WHERE pool = :pool"
        ),
        {"pool": pool},
    ).one_or_none()
    if row is None:
        return None
    current_from_s = -math.inf if row.current_from is None else row.current_from
    return Watermark(row.upto, row.half_life_s, row.usage_basis, row.config_version, current_from_s)


# The marks this statement sees, deleted by it, and the earliest of them (NULL without any).
_TAKE_MARKS_SQL = text(
    """
    WITH taken AS (DELETE FROM rollup_dirty_marks WHERE pool = :pool RETURNING dirty_from)
    SELECT extract(epoch FROM min(dirty_from))::float8 FROM taken
    """
)


def take_dirty_marks(conn: Connection, pool: str) -> float | None:
    """Delete the pool's dirty marks committed before this statement began and return the
    earliest instant they mark (None: none). Marks committed later are not seen and stay: ingest
    only ever inserts marks, so a DELETE finds no row changed under it. In the caller's
    transaction: if it rolls back, the marks are back."""
    at = conn.execute(_TAKE_MARKS_SQL, {"pool": pool}).scalar_one()
    return None if at is None else float(at)


_RANGES_MEET = (
    "tstzrange(started_at, ended_at, '[)') && tstzrange(to_timestamp(:lo), to_timestamp(:hi), '[)')"
)
# One bitmap scan over two indexes: the partial GiST for open and long runs (the arm that repeats
# its predicate), the (pool, started_at) B-tree for the rest. Written as a UNION ALL instead, the
# planner took parallel workers for it.
_BETWEEN_SQL = text(
    f"""
    SELECT queue, gpu_type, gpus, cu, extract(epoch FROM started_at)::float8,
           COALESCE(extract(epoch FROM ended_at)::float8, 'Infinity'::float8)
    FROM allocation_intervals
    WHERE {_RANGES_MEET}
      AND pool = :pool
      AND gpus < 'Infinity'::float8 AND cu < 'Infinity'::float8
      AND (({LONG_OR_OPEN}) AND {_RANGES_MEET}
           OR started_at > to_timestamp(:lo) - {SHORT_RUN} AND started_at < to_timestamp(:hi))
    """
)


def intervals_between(conn: Connection, pool: str, lo_s: float, hi_s: float) -> list[TypedInterval]:
    """Allocation intervals of `pool` overlapping [lo_s, hi_s); open ones end at +inf. Rows whose
    GPUs or CU are not finite (stored under a GPU type's absurd weight before the input limits)
    are left out: they would make every fair share of the pool fail (store/data_checks.py says
    so in the replies).

    Through the indexes there are (`ledger_tables.allocation_intervals`): runs open or at least
    `SHORT_RUN` long by the GiST index on their time range; shorter ones by their start, which
    lies after lo_s - SHORT_RUN."""
    return [
        TypedInterval(*r)
        for r in conn.execute(_BETWEEN_SQL, {"pool": pool, "lo": max(lo_s, 0.0), "hi": hi_s})
    ]


def _leaf_timelines(
    intervals: Sequence[TypedInterval], leaves: set[str]
) -> dict[str, list[Segment]]:
    timelines: dict[str, list[Segment]] = defaultdict(list)
    for iv in intervals:
        if iv.queue in leaves and iv.cu > 0:
            timelines[iv.queue].append(Segment(iv.start_s, iv.end_s, iv.cu))
    return dict(timelines)


def rollup_pool(
    conn: Connection,
    config: ClusterConfig,
    pool: NodePool,
    now_s: float,
    config_version: int | None = None,
) -> int:
    """Bring the pool's rollups up to the last complete hour; returns the buckets written.

    `config_version` is the stored config's version read BEFORE `config` was loaded: the buckets
    are stamped with it, and a later version makes the next rollup redo those the pool's usage
    window reads at `now_s` (module docstring), unless every change between the two versions is
    of nodes or budgets (`_buckets_may_differ`). Read after (or
    here, the default), an ApplyConfig committed in between stamped buckets made with the old
    config as the new version's, and they were never redone (a quota raised while a rollup
    waited for this lock: a queue's over-quota usage counted with the old quota for good). The
    default is right only where no config can be applied meanwhile (tests, tools).

    Serialised per pool (`locks.rollup_key`, for the rest of the caller's transaction): the
    periodic rollup, a recompute and a `Schedule` may all roll one pool up at once, and two
    writers of the same buckets would collide on their keys. The watermark is read after the lock,
    so the second of two finds the work done and writes nothing.

    Nothing acknowledged is lost, and no ingest waits: the rule is that the pool's dirty marks are
    taken (read and deleted, `take_dirty_marks`) by one statement BEFORE any statement that reads
    runs. An ingest writes its runs and its mark in one transaction. Under READ COMMITTED (every
    caller's level: `database.make_engine` sets none) each later statement sees at least what
    that one saw, so a mark taken is one whose runs the rewrite reads; an ingest that commits
    after the take, even one in flight while the runs are read (its change at or after the
    watermark of the moment, or in a pool with no watermark yet), keeps its mark, and the next
    rollup redoes from there. Under REPEATABLE READ every statement shares the take's snapshot,
    with the same result. Deleting by what the statement saw, never by a range of instants, is
    what keeps a later mark. A mark taken at or after the hour the watermark moves to needs no
    redo: those hours are not rolled up yet. The marks are rows of their own, only ever inserted
    (by ingestion, and by a capacity change: `capacity_repo.record_if_changed`): the watermark's
    row, which the rollup rewrites, is never written by them, so no ingest waits for a rollup's
    transaction (a `Schedule` cycle).
    """
    locks.xact_lock(conn, locks.rollup_key(pool.name))
    dirty_s = take_dirty_marks(conn, pool.name)  # first: see the rule above
    version = config_repo.config_version(conn) if config_version is None else config_version
    policy = pool.policy
    target_s = floor_hour(now_s)
    mark = _watermark(conn, pool.name)
    kept_from_s: float | None = None  # read when needed: `_kept_from`
    current_from_s: float | None = None  # what the watermark will say; None: every bucket
    if (
        mark is None
        or mark.half_life_s != policy.half_life_s
        or mark.usage_basis != policy.usage_basis.value
    ):
        start_s = _whole_from(conn, pool.name, target_s)
    else:
        redo_s = mark.rolled_up_to_s if dirty_s is None else min(mark.rolled_up_to_s, dirty_s)
        if redo_s < mark.rolled_up_to_s:
            # Not before what retention keeps either: a late event of a workload whose runs it
            # deleted (its events outlive them) derives them again, and their buckets stay gone.
            kept_from_s = _kept_from(conn, pool.name)
            redo_s = min(mark.rolled_up_to_s, max(redo_s, kept_from_s))
        start_s = floor_hour(redo_s)
        # The buckets from `agree_s` on were made with this config: none after a change that
        # reaches them. The window reads whole buckets from ceil_hour of its start (the part
        # before is integrated from the runs): from the hour its start lies in, they must agree.
        agree_s = (
            math.inf
            if _buckets_may_differ(conn, mark.config_version, version)
            else mark.current_from_s
        )
        reads_s = window_reads_from(policy, now_s)[0]
        reads_s = floor_hour(reads_s) if math.isfinite(reads_s) else reads_s
        if reads_s < agree_s:
            whole_s = _whole_from(conn, pool.name, target_s)
            if reads_s > whole_s:
                start_s = min(start_s, reads_s)
                current_from_s = start_s
            else:
                start_s = min(start_s, whole_s)
        elif math.isfinite(agree_s):
            current_from_s = min(agree_s, start_s)
        if start_s < target_s and kept_from_s is None:
            kept_from_s = _kept_from(conn, pool.name)  # not read when there is nothing to do
        if kept_from_s is not None and start_s < kept_from_s:
            # A watermark older than the horizon (rollups of the pool skipped while retention
            # ran, or a pool configured again after it was removed): retention deleted the runs
            # that ended before the horizon, so the buckets before it would be made of what
            # outlived it, less than what ran, and the reports would show them until the next
            # retention. None is written: those hours stay gone, as retention left them.
            start_s = kept_from_s
            if current_from_s is not None:
                current_from_s = max(current_from_s, start_s)
    # In spans of at most REDO_SPAN_S: a redo of a long history in one piece held all its rows
    # in memory and sent them as one jsonb value, past PostgreSQL's 256 MB for one, after
    # minutes of Python between two statements, past the engine's idle limit
    # (`bench/results/recompute.md`, round 22). A bucket is made of what overlaps its hour, so
    # the spans write the same rows.
    if start_s < target_s:
        # Once, for all spans; with what work held on nodes not ready (`usage_capacity`).
        capacity = capacity_repo.usage_capacity(
            conn,
            pool.name,
            now_s,
            [(start_s, target_s)],
            capacity_repo.not_ready_nodes(config, pool.name),
        )
        for lo_s in range(int(start_s), int(target_s), int(REDO_SPAN_S)):
            _write_buckets(conn, config, pool, lo_s, min(lo_s + REDO_SPAN_S, target_s), capacity)
    conn.execute(
        text(
            """
            INSERT INTO rollup_watermarks
                (pool, rolled_up_to, half_life_s, usage_basis, config_version, current_from)
            VALUES (:pool, to_timestamp(:upto), :h, :basis, :version,
                    to_timestamp(CAST(:current_from AS float8)))
            ON CONFLICT (pool) DO UPDATE SET rolled_up_to = EXCLUDED.rolled_up_to,
                half_life_s = EXCLUDED.half_life_s,
                usage_basis = EXCLUDED.usage_basis, config_version = EXCLUDED.config_version,
                current_from = EXCLUDED.current_from
            """
        ),
        {
            "pool": pool.name,
            "upto": max(target_s, start_s),
            "h": policy.half_life_s,
            "basis": policy.usage_basis.value,
            "version": version,
            "current_from": current_from_s,
        },
    )
    return max(0, round((target_s - start_s) / HOUR_S))


def _whole_from(conn: Connection, pool: str, target_s: float) -> float:
    """Where a redo of the pool's whole history starts: the hour of the first instant anything
    counts, usage or capacity (the denominators), but not before what retention keeps: older
    buckets it deleted, and the runs and capacity rows still stored from before it are only what
    outlived it. `target_s` without either."""
    earliest, kept_from = conn.execute(_REDO_FROM_SQL, {"pool": pool}).one()
    start_s = floor_hour(earliest) if earliest is not None else target_s
    if kept_from is not None:
        start_s = max(start_s, ceil_hour(kept_from))
    return start_s


# Where retention keeps the pool's rollups from (its own horizon, or the one recorded for every
# pool before horizons were per pool): no redo starts earlier.
_KEPT_FROM = """
    SELECT extract(epoch FROM max(kept_from))::float8 FROM retention_horizons
    WHERE kind = 'rollups' AND pool IN (:pool, '')
"""
_REDO_FROM_SQL = text(
    f"""
    SELECT extract(epoch FROM least(
               (SELECT min(started_at) FROM allocation_intervals WHERE pool = :pool),
               (SELECT min(changed_at) FROM pool_capacity_changes WHERE pool = :pool)))::float8,
           ({_KEPT_FROM})
    """
)

_KEPT_FROM_SQL = text(_KEPT_FROM)


def _kept_from(conn: Connection, pool: str) -> float:
    """The hour from which retention keeps the pool's rollups (`_KEPT_FROM`, on the hour; -inf:
    from any instant): no rollup writes a bucket before it."""
    kept_from = conn.execute(_KEPT_FROM_SQL, {"pool": pool}).scalar()
    return -math.inf if kept_from is None else ceil_hour(kept_from)


REDO_SPAN_S = 30 * 24 * HOUR_S  # hours of buckets `rollup_pool` writes per statement

# What a bucket is made of besides the runs: the queues (their tree and quotas), the GPU types'
# weights and the pool's policy. Nodes reach it only through the pool's capacity, whose changes
# leave a dirty mark from their instant (`capacity_repo.record_if_changed`); budgets not at all.
_KINDS_OUTSIDE_BUCKETS = ("node", "budget")


def _buckets_may_differ(conn: Connection, stamped: int, version: int) -> bool:
    """Whether buckets made with config `stamped` may differ from those of `version`: true
    unless every change recorded between the two is of a kind outside the buckets. A node that
    a batch system drains or resumes is a new config version; redoing a pool's whole history
    for it cost the next rollup time in the length of the history (`bench/results/recompute.md`).
    A version missing from `config_versions` counts as a change of anything."""
    if stamped == version:
        return False
    lo, hi = min(stamped, version), max(stamped, version)
    rows = conn.execute(
        text(
            """
            SELECT count(DISTINCT v.version),
                   count(*) FILTER (WHERE NOT (c->>'kind' = ANY(:outside)))
            FROM config_versions v
            LEFT JOIN LATERAL jsonb_array_elements(v.changes) AS c ON true
            WHERE v.version > :lo AND v.version <= :hi
            """
        ),
        {"lo": lo, "hi": hi, "outside": list(_KINDS_OUTSIDE_BUCKETS)},
    ).one()
    versions, inside = int(rows[0]), int(rows[1])
    return versions != hi - lo or inside > 0


def _write_buckets(
    conn: Connection,
    config: ClusterConfig,
    pool: NodePool,
    start_s: float,
    end_s: float,
    capacity: Sequence[Segment],
) -> None:
    leaves = {q.name for q in config.leaf_queues()}
    gpu_types = {t.name: t for t in config.gpu_types}
    weights = {t.name: t.compute_weight for t in config.gpu_types}
    deserved = {q.name: deserved_cu_with_types(q.quota(pool.name), weights) for q in config.queues}
    intervals = intervals_between(conn, pool.name, start_s, end_s)

    # Each interval goes to the buckets it overlaps: O(overlaps), not O(buckets x intervals).
    per_bucket: dict[int, list[TypedInterval]] = defaultdict(list)
    for iv in intervals:
        first = int((max(iv.start_s, start_s) - start_s) // HOUR_S)
        last = int((min(iv.end_s, end_s) - start_s - 1e-9) // HOUR_S)
        for k in range(first, last + 1):
            per_bucket[k].append(iv)

    fairness_rows: list[dict[str, object]] = []
    usage_rows: list[dict[str, object]] = []
    for k in range(round((end_s - start_s) / HOUR_S)):
        b = start_s + k * HOUR_S
        items = per_bucket.get(k, [])
        cap = [s for s in capacity if s.start_s < b + HOUR_S and s.end_s > b]
        if not items and not cap:
            continue
        moments = bucket_moments(
            pool=pool.name,
            policy=pool.policy,
            queues=config.queues,
            gpu_types=gpu_types,
            leaf_allocations=_leaf_timelines(items, leaves),
            capacity=cap,
            bucket_start_s=b,
        )
        for queue in (q.name for q in config.queues):
            usage = moments.usage_cu_s.get(queue, 0.0)
            group = moments.group_capacity_cu_s.get(queue, 0.0)
            if usage or group:
                fairness_rows.append({"q": queue, "b": b, "u": usage, "g": group})
        root = moments.group_capacity_cu_s.get(None, 0.0)
        if root:
            fairness_rows.append({"q": ROOT, "b": b, "u": 0.0, "g": root})
        for row in type_usage(items, deserved, b, b + HOUR_S):
            usage_rows.append(
                {
                    "q": row.queue,
                    "t": row.gpu_type,
                    "b": b,
                    "gs": row.gpu_seconds,
                    "cs": row.cu_seconds,
                    "os": row.over_quota_cu_seconds,
                }
            )

    params = {"pool": pool.name, "lo": start_s, "hi": end_s}
    for table in ("fairness_hourly", "usage_hourly"):
        conn.execute(
            text(
                f"DELETE FROM {table} WHERE pool = :pool "
                "AND bucket_start >= to_timestamp(:lo) AND bucket_start < to_timestamp(:hi)"
            ),
            params,
        )
    if fairness_rows:
        conn.execute(
            text(
                """
                INSERT INTO fairness_hourly
                    (pool, queue, bucket_start, half_life_s, usage_basis, usage_moment,
                     group_capacity_moment)
                SELECT :pool, r.q, to_timestamp(r.b), :h, :basis, r.u, r.g
                FROM jsonb_to_recordset(CAST(:doc AS jsonb))
                     AS r(q text, b float8, u float8, g float8)
                """
            ),
            {
                "pool": pool.name,
                "h": pool.policy.half_life_s,
                "basis": pool.policy.usage_basis.value,
                "doc": json.dumps(fairness_rows),
            },
        )
    if usage_rows:
        conn.execute(
            text(
                """
                INSERT INTO usage_hourly
                    (pool, queue, gpu_type, bucket_start, gpu_seconds, cu_seconds,
                     over_quota_cu_seconds)
                SELECT :pool, r.q, r.t, to_timestamp(r.b), r.gs, r.cs, r.os
                FROM jsonb_to_recordset(CAST(:doc AS jsonb))
                     AS r(q text, t text, b float8, gs float8, cs float8, os float8)
                """
            ),
            {"pool": pool.name, "doc": json.dumps(usage_rows)},
        )


def decayed_usage(
    conn: Connection, config: ClusterConfig, pool: NodePool, now_s: float
) -> UsageInputs:
    """The engine's usage inputs at `now_s`: rolled-up buckets inside the window, weighted in
    SQL, plus the window's edges integrated from raw intervals. Call `rollup_pool` first.

    With the window [lo, now): whole buckets cover [A, B) with A = ceil_hour(lo) and B = the
    watermark; [lo, A) and [B, now) come from the intervals themselves.

    Each bucket's moment is carried to `now` by the weight of `domain.rollup` (2^(-(now - e)/h)
    for a bucket ending at e), applied here in SQL so that one row per queue comes back instead of
    one per queue and bucket. That weight is the only decay written outside `domain/`; the test
    `test_usage_from_rollups_equals_exact_integral` holds this sum to the domain's exact integral.

    A queue deleted inside the window and created again since counts from its deletion on
    (`queue_history`): its usage and its children's group capacity are read again over
    [deleted, now), the same way.
    """
    lo_s, _ = window_bounds(now_s, pool.policy)
    usage = _decayed_from(conn, config, pool, lo_s, now_s)
    recreated = queue_history.recreated_since(conn, config.queues, lo_s)
    if not recreated:
        return usage
    # A queue deleted and created again starts afresh (`queue_history`): its usage, and the
    # capacity its children competed for, count from its deletion on. The queues deleted at one
    # instant are read together.
    usage_cu_s = dict(usage.usage_cu_s)
    capacity_cu_s = dict(usage.group_capacity_cu_s)
    for deleted_s in sorted(set(recreated.values())):
        fresh = _decayed_from(conn, config, pool, deleted_s, now_s)
        for name, at_s in recreated.items():
            if at_s == deleted_s:
                _replace(usage_cu_s, name, fresh.usage_cu_s.get(name))
                _replace(capacity_cu_s, name, fresh.group_capacity_cu_s.get(name))
    return UsageInputs(usage_cu_s=usage_cu_s, group_capacity_cu_s=capacity_cu_s)


def _replace(numbers: dict[Any, float], key: str, value: float | None) -> None:
    if value is None:
        numbers.pop(key, None)
    else:
        numbers[key] = value


def _decayed_from(
    conn: Connection, config: ClusterConfig, pool: NodePool, lo_s: float, now_s: float
) -> UsageInputs:
    """`decayed_usage` over [lo_s, now_s): buckets from ceil_hour(lo_s), edges from intervals.
    The edges' capacity is read once, for both (`capacity_repo.usage_capacity`)."""
    policy = pool.policy
    mark = _watermark(conn, pool.name)
    a_s = ceil_hour(lo_s) if math.isfinite(lo_s) else -math.inf
    b_s = min(mark.rolled_up_to_s, floor_hour(now_s)) if mark is not None else -math.inf
    if b_s <= a_s:
        return _edge(conn, config, pool, lo_s, now_s, now_s)
    spans = [(lo_s, a_s)] if math.isfinite(lo_s) and lo_s < a_s else []
    spans += [(b_s, now_s)] if b_s < now_s else []
    edge_capacity = capacity_repo.usage_capacity(
        conn, pool.name, now_s, spans, capacity_repo.not_ready_nodes(config, pool.name)
    )

    usage: dict[str, float] = {}
    capacity: dict[str | None, float] = {}
    rows = conn.execute(
        text(
            """
            SELECT queue, sum(usage_moment * w) AS usage,
                   sum(group_capacity_moment * w) AS capacity
            FROM (
                SELECT queue, usage_moment, group_capacity_moment,
                       CASE WHEN CAST(:h AS float8) IS NULL THEN 1.0
                            ELSE power(2.0, -(CAST(:now AS float8)
                                 - extract(epoch FROM bucket_start)::float8
                                 - CAST(:bucket_s AS float8))
                                 / CAST(:h AS float8)) END AS w
                FROM fairness_hourly
                WHERE pool = :pool AND bucket_start < to_timestamp(:b)
                  AND (CAST(:a AS float8) IS NULL OR bucket_start >= to_timestamp(:a))
            ) AS weighted
            GROUP BY queue
            """
        ),
        {
            "pool": pool.name,
            "h": policy.half_life_s,
            "bucket_s": HOUR_S,
            "now": now_s,
            "a": a_s if math.isfinite(a_s) else None,
            "b": b_s,
        },
    )
    for r in rows:
        if r.queue == ROOT:
            capacity[None] = float(r.capacity)
        else:
            usage[r.queue] = float(r.usage)
            capacity[r.queue] = float(r.capacity)
    parts = [UsageInputs(usage_cu_s=usage, group_capacity_cu_s=capacity)]
    if math.isfinite(lo_s) and lo_s < a_s:
        parts.append(_edge(conn, config, pool, lo_s, a_s, now_s, edge_capacity))
    if b_s < now_s:
        parts.append(_edge(conn, config, pool, b_s, now_s, now_s, edge_capacity))
    return add_usage(*parts)


def _edge(
    conn: Connection,
    config: ClusterConfig,
    pool: NodePool,
    lo_s: float,
    hi_s: float,
    now_s: float,
    capacity: Sequence[Segment] | None = None,
) -> UsageInputs:
    """Decayed usage of [lo_s, hi_s) from the runs; `capacity` (the usage window's, read for
    at least this span) is read here when not given."""
    leaves = {q.name for q in config.leaf_queues()}
    items = intervals_between(conn, pool.name, lo_s, hi_s)
    if capacity is None:
        capacity = capacity_repo.usage_capacity(
            conn, pool.name, now_s, [(lo_s, hi_s)], capacity_repo.not_ready_nodes(config, pool.name)
        )
    return range_usage(
        pool=pool.name,
        policy=pool.policy,
        queues=config.queues,
        gpu_types={t.name: t for t in config.gpu_types},
        leaf_allocations=_leaf_timelines(items, leaves),
        capacity=capacity,
        lo_s=lo_s,
        hi_s=hi_s,
        now_s=now_s,
    )


def exact_usage(
    conn: Connection, config: ClusterConfig, pool: NodePool, now_s: float
) -> UsageInputs:
    """The same inputs integrated from every raw interval in the window: O(intervals). The
    reference that rollups must agree with, and a fallback for tools."""
    lo_s, _ = window_bounds(now_s, pool.policy)
    return _edge(conn, config, pool, lo_s if math.isfinite(lo_s) else 0.0, now_s, now_s)
