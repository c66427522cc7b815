"""Pool capacity over time: what the fair-share engine divides and usage is normalised by.

A pool's capacity is the CU of its ready nodes, each counted with the GPUs the batch system last
reported usable (node_capacity events), else its declared GPU count (`domain.capacity_history`).
A new row is written whenever that changes: by a config apply or by a node capacity event.

Events may come in any order (DESIGN 5), and the rows must end the same. Every report and what
each node counted for after each config apply are kept (`node_history_repo`). A change later
than every row and every report is appended, from the nodes as they are now, the common case.
One that is not (a report older than a row of the pool, or than another report of its node or a
config change) rebuilds the rows of the pools it touches from its instant on, and only those:
the capacity at each later instant is counted again from the nodes' configs and reports of that
instant (`rebuild_from`). So does a report and a config apply at one instant, whichever comes
second: the apply and the report both count from that instant, and the rows there are the
apply's. Either way the rows are those the changes in time order would give.

Capacity is what rollups divide by, so a change is also a rollup dirty mark from its instant (a
node capacity event may come late, or commit while a rollup runs; `rollup_repo.rollup_pool`): a
rebuild marks from the first row it changed, and the next rollup redoes the buckets from there,
as for a late run event.

The rows count ready nodes only. What the fair share divides now (`division_capacity`), and what
the capacity gauges export (`counted_now`), also count the GPUs work placed on a node not ready
still holds there: running, or bound and not started yet. What the usage window divides by (U''s
denominator), and `report.pool_utilisation_daily`'s capacity (migration 0032), also count what
running work held on nodes while they were not ready (`usage_capacity`), read from
the nodes' config history, their reports and the runs, never written as rows: the rows, their
rebuilds and their replays stay as they were. A run's change on such a node marks the rollups
as any run's does; a report of a node not ready marks them from its instant too, though it
changes no row. History counts runs only: the ledger keeps no binding that was never started
(it held its GPUs for at most the bind timeout, and is no usage to divide).
"""

from __future__ import annotations

import json
import math
from collections.abc import Collection, Sequence
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Connection, select, text

from gpufair.domain import capacity_history
from gpufair.domain.capacity_history import Capacity, Step
from gpufair.domain.model import ClusterConfig
from gpufair.domain.usage import Segment
from gpufair.store import locks, node_history_repo
from gpufair.store import tables as t
from gpufair.store.ledger_tables import LONG_OR_OPEN, SHORT_RUN, pool_capacity_changes

# The GPUs a pod `p.pod` of an allocation interval holds (`capacity.binding_gpus`): a fraction of
# a shared GPU as that fraction, else its whole GPUs.
_POD_GPUS = (
    "CASE WHEN (p.pod->>'gpu_fraction')::float8 < 1.0 THEN (p.pod->>'gpu_fraction')::float8 "
    "ELSE jsonb_array_length(p.pod->'gpu_indices') END"
)
_RANGES_MEET = (
    "tstzrange(started_at, ended_at, '[)') && tstzrange(to_timestamp(:lo), to_timestamp(:hi), '[)')"
)


def capacity_now(conn: Connection) -> dict[str, Capacity]:
    """Per pool: (CU, GPUs by type) of its ready nodes as they are now, in one statement."""
    groups: dict[str, dict[tuple[str, float], tuple[int, int]]] = {}
    for r in conn.execute(_NOW_SQL):
        pool = groups.setdefault(r.pool, {})
        if r.nodes:
            pool[(r.gpu_type, r.cu_per_gpu)] = (r.nodes, r.gpus)
    return {pool: capacity_history.totals(g) for pool, g in groups.items()}


def not_ready_nodes(config: ClusterConfig, pool: str) -> list[str]:
    """The nodes of `pool` that are not ready in `config`: those whose running work the
    division (`division_capacity`) and the usage window (`usage_capacity`) still count."""
    return [n.name for n in config.nodes if n.pool == pool and not n.ready]


def division_capacity(conn: Connection, pool: str, not_ready: Collection[str]) -> Capacity:
    """What the fair share divides in `pool` now (`capacity_history.division_capacity`): its
    ready nodes as `capacity_now` counts them, plus the GPUs work placed there still holds on
    those of `not_ready` (the pool's nodes that are not ready, as the caller's config has them)
    that are still not ready: running work (open allocation intervals) and work bound there
    that the batch system has not started yet (it may still start it there, and the cycle
    counts it in its queue's allocation). With none, the one statement and the numbers of
    `capacity_now`; else one more, over the pool's open intervals and bound workloads."""
    groups: dict[tuple[str, float], tuple[int, int]] = {}
    for r in conn.execute(_NOW_SQL):
        if r.pool == pool and r.nodes:
            groups[(r.gpu_type, r.cu_per_gpu)] = (r.nodes, r.gpus)
    held = []
    if not_ready:
        named = set(not_ready)
        held = [n for name, n in held_on_not_ready(conn, [pool]).get(pool, []) if name in named]
    return capacity_history.division_capacity(groups, held)


def held_on_not_ready(
    conn: Connection, pools: Collection[str]
) -> dict[str, list[tuple[str, capacity_history.HeldNode]]]:
    """Per pool of `pools`, its nodes that are not ready with work placed there (`_HELD_SQL`),
    by name, in name order."""
    held: dict[str, list[tuple[str, capacity_history.HeldNode]]] = {}
    for r in conn.execute(_HELD_SQL, {"pools": sorted(pools)}):
        node = capacity_history.HeldNode(r.gpu_type, r.cu_per_gpu, r.counted, r.held)
        held.setdefault(r.pool, []).append((r.name, node))
    return held


def counted_now(conn: Connection) -> dict[str, Capacity]:
    """Per pool, what the fair share divides now (`division_capacity`'s rule, for every pool
    at once from the nodes as stored): its ready nodes, plus the GPUs work placed on its nodes
    that are not ready still holds there, running or bound. What the capacity gauges export,
    so that they add up to the capacity a recompute divides, and allocated over capacity reads
    no more than 1 for a drain. One statement, as `capacity_now`, when no node is not ready
    (it says whether one is); else one more, over the open intervals and bound workloads of
    the pools that have one."""
    groups: dict[str, dict[tuple[str, float], tuple[int, int]]] = {}
    drained: set[str] = set()
    for r in conn.execute(_COUNTED_SQL):
        pool = groups.setdefault(r.pool, {})
        if r.nodes:
            pool[(r.gpu_type, r.cu_per_gpu)] = (r.nodes, r.gpus)
        if r.not_ready:
            drained.add(r.pool)
    held: dict[str, list[capacity_history.HeldNode]] = {}
    if drained:
        for name, nodes in held_on_not_ready(conn, drained).items():
            held[name] = [node for _, node in nodes]
    return {
        pool: capacity_history.division_capacity(g, held.get(pool, ()))
        for pool, g in groups.items()
    }


# `_NOW_SQL`'s rows, read over all the pool's nodes, each with how many of its nodes of the
# group are not ready (a group of only such nodes: no node counted, and no GPU).
_COUNTED_SQL = text(
    """
    SELECT p.name AS pool, n.gpu_type, COALESCE(g.compute_weight, 0.0) AS cu_per_gpu,
           count(n.name) FILTER (WHERE n.ready) AS nodes,
           COALESCE(sum(LEAST(n.gpu_count, COALESCE(c.gpu_count, n.gpu_count)))
                    FILTER (WHERE n.ready), 0) AS gpus,
           count(n.name) FILTER (WHERE NOT n.ready) AS not_ready
    FROM node_pools p
    LEFT JOIN nodes n ON n.pool = p.name
    LEFT JOIN gpu_types g ON g.name = n.gpu_type
    LEFT JOIN node_capacity c ON c.node = n.name
    GROUP BY p.name, n.gpu_type, g.compute_weight
    """
)

# Of the named pools, each node not ready (as stored) with the GPUs work placed there holds on
# it (`capacity.binding_gpus`: a fraction of a shared GPU as that fraction, else whole GPUs):
# open allocation intervals, and bindings the batch system has not started yet (it may still
# start them there; the cycle counts them in their queue's allocation as it counts running
# work). The pools' open intervals are read once (their partial index), their bound workloads
# once (by pool and state), their pods once each.
_HELD_SQL = text(
    f"""
    SELECT n.pool, n.name, n.gpu_type, COALESCE(g.compute_weight, 0.0) AS cu_per_gpu,
           LEAST(n.gpu_count, COALESCE(c.gpu_count, n.gpu_count)) AS counted,
           sum({_POD_GPUS}) AS held
    FROM (
        SELECT i.pool, i.pods FROM allocation_intervals i
        WHERE i.pool = ANY(:pools) AND i.ended_at IS NULL
        UNION ALL
        SELECT w.pool, w.binding->'pods' FROM workloads w
        WHERE w.pool = ANY(:pools) AND w.state = 'bound'
    ) AS h
    CROSS JOIN LATERAL jsonb_array_elements(h.pods) AS p(pod)
    JOIN nodes n ON n.name = p.pod->>'node' AND n.pool = h.pool AND NOT n.ready
    LEFT JOIN gpu_types g ON g.name = n.gpu_type
    LEFT JOIN node_capacity c ON c.node = n.name
    GROUP BY n.pool, n.name, n.gpu_type, g.compute_weight, n.gpu_count, c.gpu_count
    ORDER BY n.pool, n.name
    """
)


# Per pool, its ready nodes and counted GPUs per (GPU type, CU per GPU); a pool without any,
# one row with none.
_NOW_SQL = text(
    """
    SELECT p.name AS pool, n.gpu_type, COALESCE(g.compute_weight, 0.0) AS cu_per_gpu,
           count(n.name) AS nodes,
           COALESCE(sum(LEAST(n.gpu_count, COALESCE(c.gpu_count, n.gpu_count))), 0) AS gpus
    FROM node_pools p
    LEFT JOIN nodes n ON n.pool = p.name AND n.ready
    LEFT JOIN gpu_types g ON g.name = n.gpu_type
    LEFT JOIN node_capacity c ON c.node = n.name
    GROUP BY p.name, n.gpu_type, g.compute_weight
    """
)


def lock_changes(conn: Connection) -> None:
    """Serialise capacity writers until this transaction ends (`locks.CAPACITY`): take it before
    the first write that changes a capacity (a node's usable GPUs, a node's config history), so
    the recount after it sees every change committed by another writer. Taking it again in the
    transaction is free."""
    locks.xact_lock(conn, locks.CAPACITY)


def record_if_changed(
    conn: Connection, at_s: float, source: str, *, node: str | None = None, late: bool | None = None
) -> int:
    """Bring the capacity rows up to date with a change at `at_s` (a config apply, or `node`'s
    report), writing a rollup dirty mark for each pool whose rows changed; returns how many rows
    it wrote or deleted. `late` says whether a report or a config change is recorded later than
    `at_s`, or one of the other kind at it (None: look, for a config apply). Under
    `lock_changes` (taken here if the caller has not): without it, two writers at once each
    recounted without the other's uncommitted change, and the later row lacked the earlier
    change from then on."""
    lock_changes(conn)
    latest = {
        r.pool: (r.at, r.capacity_cu, r.capacity_gpus_by_type)
        for r in conn.execute(
            text(
                # Each pool's latest row by the primary key, not a scan of all its history.
                "SELECT p.name AS pool, extract(epoch FROM l.changed_at)::float8 AS at, "
                "l.capacity_cu, l.capacity_gpus_by_type FROM node_pools p "
                "CROSS JOIN LATERAL (SELECT changed_at, capacity_cu, capacity_gpus_by_type "
                "FROM pool_capacity_changes c WHERE c.pool = p.name "
                "ORDER BY changed_at DESC LIMIT 1) AS l"
            )
        )
    }
    if late is None:
        late = node_history_repo.later_than(conn, at_s)
    if node is not None:
        # A report of a node not ready then changes what its work held counts for in the usage
        # window (`usage_capacity`), which no row says; it may be older than the rolled-up
        # hours (late, or simply sent after the hour ended): the rollups redo from it.
        conn.execute(_HELD_REPORT_MARK_SQL, {"node": node, "at": at_s})
    if late or any(at > at_s for at, _cu, _by_type in latest.values()):
        return rebuild_from(conn, at_s, node)
    written = 0
    for pool, (cu, by_type) in capacity_now(conn).items():
        if pool in latest and latest[pool][1:] == (cu, by_type):
            continue
        conn.execute(_UPSERT_SQL, _row(pool, Step(at_s, cu, by_type, source)))
        _mark(conn, pool, at_s)
        written += 1
    return written


# A dirty mark from :at for the pool of :node when an entry of its config history in force at
# :at or later has it not ready (no pool, and not removed).
_HELD_REPORT_MARK_SQL = text(
    """
    INSERT INTO rollup_dirty_marks (pool, dirty_from)
    SELECT n.pool, to_timestamp(:at) FROM nodes n
    WHERE n.name = :node AND EXISTS (
        SELECT 1 FROM node_config_history h
        WHERE h.node = :node AND h.pool IS NULL AND h.gpu_count >= 0
          AND h.changed_at >= COALESCE(
              (SELECT max(f.changed_at) FROM node_config_history f
               WHERE f.node = :node AND f.changed_at <= to_timestamp(:at)), '-infinity'))
    """
)


# A config row stays one when a report comes at its very instant: a rebuild says config there.
_UPSERT_SQL = text(
    "INSERT INTO pool_capacity_changes "
    "(pool, changed_at, capacity_cu, capacity_gpus_by_type, source) "
    "VALUES (:pool, to_timestamp(:at), :cu, CAST(:by_type AS jsonb), :source) "
    "ON CONFLICT (pool, changed_at) DO UPDATE SET capacity_cu = EXCLUDED.capacity_cu, "
    "capacity_gpus_by_type = EXCLUDED.capacity_gpus_by_type, "
    "source = CASE WHEN pool_capacity_changes.source = 'config' AND EXCLUDED.source <> 'config' "
    "AND NOT :rebuilt THEN 'config' ELSE EXCLUDED.source END"
)


def _row(pool: str, step: Step, *, rebuilt: bool = False) -> dict[str, Any]:
    return {
        "pool": pool,
        "at": step.at_s,
        "cu": step.cu,
        "by_type": json.dumps(step.by_type),
        "source": step.source,
        "rebuilt": rebuilt,
    }


def _mark(conn: Connection, pool: str, at_s: float) -> None:
    conn.execute(
        text("INSERT INTO rollup_dirty_marks (pool, dirty_from) VALUES (:pool, to_timestamp(:at))"),
        {"pool": pool, "at": at_s},
    )


def rebuild_from(conn: Connection, at_s: float, node: str | None = None) -> int:
    """Count the capacity rows from `at_s` on again, of the pools `node` counted in from then on
    (every pool when None), from the nodes' config history and reports; rows that no longer
    mark a change go, and each pool whose rows changed gets a dirty mark from the first of
    them. Returns how many rows were written or deleted. Under `lock_changes`."""
    lock_changes(conn)
    # Never before the nodes' config history is complete (`node_history_start`): the rows before
    # it stay as recorded, and a change older than it counts from it on.
    start_s = float(
        conn.execute(
            text(
                "SELECT GREATEST(extract(epoch FROM to_timestamp(:at))::float8, "
                "(SELECT extract(epoch FROM max(since))::float8 FROM node_history_start))"
            ),
            {"at": at_s},
        ).scalar_one()
    )
    configs = node_history_repo.configs_from(conn, start_s)
    pools = {r.name for r in conn.execute(select(t.node_pools.c.name))}
    members: dict[str, set[str]] = {pool: set() for pool in pools}
    for name, entries in configs.items():
        for _at, config in entries:
            if config.pool in members:
                members[config.pool].add(name)
    if node is not None:
        pools = {c.pool for _at, c in configs.get(node, ()) if c.pool in pools}
    involved = set().union(*(members[pool] for pool in pools)) if pools else set()
    reports = node_history_repo.reports_from(conn, start_s, involved)
    # The instants of config applies, whichever nodes they changed: a pool's row there is the
    # apply's, also when the node it lost counts nowhere from `start_s` on (not a member).
    applies = {at for entries in configs.values() for at, _config in entries if at >= start_s}
    changed = 0
    for pool in sorted(pools):
        changed += _rebuild_pool(conn, pool, start_s, configs, reports, members[pool], applies)
    return changed


def _rebuild_pool(
    conn: Connection,
    pool: str,
    start_s: float,
    configs: node_history_repo.NodeConfigs,
    reports: node_history_repo.NodeReports,
    members: set[str],
    applies: set[float],
) -> int:
    stored = conn.execute(_POOL_ROWS_SQL, {"pool": pool, "at": start_s}).all()
    before: Capacity | None = None
    rows: dict[float, tuple[float, dict[str, float], str]] = {}
    for r in stored:
        if r.at < start_s:
            before = (r.capacity_cu, r.capacity_gpus_by_type)
        else:
            rows[r.at] = (r.capacity_cu, r.capacity_gpus_by_type, r.source)
    # A pool has no capacity before the config apply that made it, its first row: none is
    # written there. (A pool whose first row is a report's was made before rows were kept.)
    begin_s = start_s
    if before is None and rows and rows[min(rows)][2] == capacity_history.CONFIG:
        begin_s = max(start_s, min(rows))
    steps = capacity_history.capacity_steps(
        pool,
        begin_s,
        {n: configs[n] for n in members},
        {n: reports[n] for n in members if n in reports},
        before,
        {
            **{at: source for at, (_cu, _by_type, source) in rows.items() if at >= begin_s},
            **{at: capacity_history.CONFIG for at in applies if at >= begin_s},
        },
    )
    wanted = {s.at_s for s in steps}
    gone = [at for at in rows if at >= begin_s and at not in wanted]
    new = [s for s in steps if rows.get(s.at_s) != (s.cu, s.by_type, s.source)]
    for at in gone:
        conn.execute(_DELETE_SQL, {"pool": pool, "at": at})
    for step in new:
        conn.execute(_UPSERT_SQL, _row(pool, step, rebuilt=True))
    if gone or new:
        _mark(conn, pool, min(gone + [s.at_s for s in new]))
    return len(gone) + len(new)


_DELETE_SQL = text(
    "DELETE FROM pool_capacity_changes WHERE pool = :pool AND changed_at = to_timestamp(:at)"
)


# The pool's rows from `:at` on, and the one in force just before it.
_POOL_ROWS_SQL = text(
    """
    SELECT extract(epoch FROM changed_at)::float8 AS at, capacity_cu, capacity_gpus_by_type,
           source
    FROM pool_capacity_changes
    WHERE pool = :pool AND changed_at >= COALESCE(
        (SELECT max(changed_at) FROM pool_capacity_changes
         WHERE pool = :pool AND changed_at < to_timestamp(:at)),
        to_timestamp(:at))
    ORDER BY changed_at
    """
)


def capacity_timeline(conn: Connection, pool: str, until_s: float) -> list[Segment]:
    """The pool's CU capacity as segments up to `until_s` (the last one open to it). A row whose
    capacity is not finite (from a GPU type's absurd weight stored before the input limits) is
    no capacity at all: it would make every fair share of the pool fail for as long as it stays
    in the window (store/data_checks.py says so in the replies)."""
    rows = conn.execute(
        select(pool_capacity_changes.c.changed_at, pool_capacity_changes.c.capacity_cu)
        .where(pool_capacity_changes.c.pool == pool)
        .order_by(pool_capacity_changes.c.changed_at)
    ).all()
    return _segments(rows, until_s)


def _segments(rows: Sequence[Any], until_s: float) -> list[Segment]:
    """`capacity_timeline`'s segments from the rows (changed_at, capacity_cu) in time order."""
    segments: list[Segment] = []
    for i, row in enumerate(rows):
        start = row.changed_at.timestamp()
        end = rows[i + 1].changed_at.timestamp() if i + 1 < len(rows) else until_s
        if end > start and 0 < row.capacity_cu < math.inf:
            segments.append(Segment(start, end, row.capacity_cu))
    return segments


def usage_capacity(
    conn: Connection,
    pool: str,
    until_s: float,
    spans: Sequence[tuple[float, float]],
    not_ready: Collection[str],
) -> list[Segment]:
    """The capacity the usage window divides by, over `spans` (the stretches of time the caller
    integrates; elsewhere the rows alone): `capacity_timeline`, plus the GPUs running work held
    on nodes of the pool while they were not ready (`capacity_history.with_held`), the rule of
    `division_capacity` over time. `not_ready`: the pool's nodes not ready now (the caller's
    config has them); nodes drained and back within the spans are found in their history.

    Without it, U' was inflated while a node drained under work: the rows count ready nodes
    only, while the work on the drained node kept counting as usage (a queue at 8 of 12 CU over
    quota for a week read U' 0.667 undrained, 0.737 after a 24 h drain, 0.933 after 72 h).

    Reads only the spans. The rows come with whether any node's config changed inside the
    spans (one statement, `_ROWS_SQL`): with none, and no node not ready now, nothing was held,
    and that statement is all (`capacity_timeline` costs one too). Else the config history in
    force in the spans, then, only if a node was not ready there, its runs and reports there
    (`held_timeline`)."""
    inside = [(max(lo_s, 0.0), hi_s) for lo_s, hi_s in spans if hi_s > max(lo_s, 0.0)]
    lo_s = min((lo for lo, _hi in inside), default=until_s)
    hi_s = max((hi for _lo, hi in inside), default=until_s)
    rows = conn.execute(_ROWS_SQL, {"pool": pool, "lo": lo_s, "hi": hi_s}).all()
    ready = _segments(rows, until_s)
    if not inside or not (not_ready or not rows or rows[0].changed):
        return ready
    return capacity_history.with_held(ready, held_timeline(conn, pool, inside, not_ready))


# `capacity_timeline`'s rows, each with whether any node's config history has an entry inside
# (:lo, :hi) (the index on changed_at; evaluated once).
_ROWS_SQL = text(
    """
    SELECT changed_at, capacity_cu,
           EXISTS (SELECT 1 FROM node_config_history
                   WHERE changed_at > to_timestamp(:lo) AND changed_at < to_timestamp(:hi))
               AS changed
    FROM pool_capacity_changes WHERE pool = :pool ORDER BY changed_at
    """
)


def held_timeline(
    conn: Connection,
    pool: str,
    spans: Sequence[tuple[float, float]],
    not_ready: Collection[str],
) -> list[Segment]:
    """What running work of `pool` held on nodes while they were not ready, inside `spans`
    (`capacity_history.held_timeline`). One statement when no node was: the config history
    entries, from the one in force at the spans' start on, of the nodes in `not_ready` and of
    those with an entry inside the spans (`_STRETCHES_SQL`). Else one more per span for the
    runs on those nodes, and their reports."""
    spans = [(max(lo_s, 0.0), hi_s) for lo_s, hi_s in spans if hi_s > max(lo_s, 0.0)]
    if not spans:
        return []
    lo_s = min(lo for lo, _hi in spans)
    hi_s = max(hi for _lo, hi in spans)
    configs: node_history_repo.NodeConfigs = {}
    from_s = lo_s
    for r in conn.execute(_STRETCHES_SQL, {"lo": lo_s, "hi": hi_s, "names": sorted(not_ready)}):
        from_s = r.from_s
        entry = capacity_history.NodeConfig(r.pool, r.gpu_type, r.gpu_count, r.cu_per_gpu)
        configs.setdefault(r.node, []).append((r.at, entry))
    drained = sorted(
        node
        for node, entries in configs.items()
        if any(capacity_history.not_ready(c) for _at, c in entries)
    )
    if not drained:
        return []
    reports = node_history_repo.reports_from(conn, from_s, drained)
    held: list[Segment] = []
    for first_s, span_hi in spans:
        span_lo = max(first_s, from_s)
        if span_lo >= span_hi:
            continue
        runs: dict[str, list[tuple[float, float, float]]] = {}
        params = {"pool": pool, "lo": span_lo, "hi": span_hi, "nodes": drained}
        for r in conn.execute(_HELD_RUNS_SQL, params):
            runs.setdefault(r.node, []).append((r.started, r.ended, r.gpus))
        held += capacity_history.held_timeline(configs, reports, runs, span_lo, span_hi)
    return held


# Each node's config history entries from the one in force at :lo on, up to :hi, of the nodes
# named and of those with an entry in (:lo, :hi) (by the index on changed_at). Not before the
# history is complete (`node_history_start`): `from_s` says where the entries count from.
_STRETCHES_SQL = text(
    """
    WITH span AS (
        SELECT GREATEST(to_timestamp(:lo), COALESCE(
                   (SELECT max(since) FROM node_history_start), '-infinity')) AS lo,
               to_timestamp(:hi) AS hi),
    named AS (
        SELECT h.node FROM node_config_history h, span
        WHERE h.changed_at > span.lo AND h.changed_at < span.hi
        UNION
        SELECT unnest(CAST(:names AS text[])))
    SELECT n.node, extract(epoch FROM h.changed_at)::float8 AS at, h.pool, h.gpu_type,
           h.gpu_count, h.cu_per_gpu, extract(epoch FROM span.lo)::float8 AS from_s
    FROM named n CROSS JOIN span
    JOIN LATERAL (
        SELECT changed_at, pool, gpu_type, gpu_count, cu_per_gpu FROM node_config_history l
        WHERE l.node = n.node AND l.changed_at < span.hi
          AND l.changed_at >= COALESCE(
              (SELECT max(f.changed_at) FROM node_config_history f
               WHERE f.node = n.node AND f.changed_at <= span.lo), '-infinity')
    ) AS h ON true
    ORDER BY n.node, h.changed_at
    """
)

# The GPUs each run of the pool overlapping [:lo, :hi) holds on each of the named nodes, per
# pod (`capacity.binding_gpus`), found as `rollup_repo.intervals_between` finds runs.
_HELD_RUNS_SQL = text(
    f"""
    SELECT p.pod->>'node' AS node, extract(epoch FROM i.started_at)::float8 AS started,
           COALESCE(extract(epoch FROM i.ended_at)::float8, 'Infinity'::float8) AS ended,
           ({_POD_GPUS})::float8 AS gpus
    FROM allocation_intervals i
    CROSS JOIN LATERAL jsonb_array_elements(i.pods) AS p(pod)
    WHERE {_RANGES_MEET}
      AND i.pool = :pool
      AND (({LONG_OR_OPEN}) AND {_RANGES_MEET}
           OR i.started_at > to_timestamp(:lo) - {SHORT_RUN} AND i.started_at < to_timestamp(:hi))
      AND p.pod->>'node' = ANY(CAST(:nodes AS text[]))
    ORDER BY i.id, p.pod->>'node'
    """
)


def utc(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, UTC)
