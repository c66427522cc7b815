"""Each node's usable-GPU reports and config over time: what a pool's capacity rows are rebuilt
from when something that counts for them arrives late (`capacity_repo.rebuild_from`).

- `node_capacity_reports`: every node_capacity event's report, in whatever order they came.
  `node_capacity` keeps each node's latest one beside it (what counts now).
  Two reports of a node at one instant (two readings the batch system could not order) keep the
  fewer GPUs, whichever came first: no workload is then promised GPUs one of them said were
  gone, and the outcome does not depend on arrival.
- `node_config_history`: what each node counts for (pool while ready, GPU type, declared GPUs,
  CU per GPU), a row from each config apply that changed it on; a node's removal is a row too,
  with no pool and `REMOVED` GPUs (also of a node that counted nowhere already: it is what says
  a report after it is of a node gpufair did not know). A node with no row counts as it is
  configured now, since ever: nodes configured before this history was kept, until their first
  config apply, which first writes their row as they were (`seed_config`). On a database that
  held nodes before it was kept, that holds from the upgrade on only (`node_history_start`,
  migration 0027), and no rebuild starts earlier.

A report is judged against its node as configured just before its instant (`CONFIG_BEFORE_SQL`),
in time or late alike: refused when the node was not configured then (added later, or removed),
or reported more GPUs than it declared then. Just before, not at: a config apply stamped with the
report's very instant may commit after the report was judged, and must not change what it would
have been; the apply still counts from that instant, the report with it (`capacity_history`).

Written under the capacity writers' lock (`locks.CAPACITY`), like the capacity rows: a report
by ingestion after `capacity_repo.lock_changes`, a config apply's rows right after it takes the
lock. Retention keeps each node's latest row of either table before its horizon, the one in
force there, which a rebuild from the horizon on starts from (`RETENTION_WHERE`).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Collection

from sqlalchemy import Connection, text

from gpufair.domain.capacity_history import NodeConfig

NodeConfigs = dict[str, list[tuple[float, NodeConfig]]]
NodeReports = dict[str, list[tuple[float, int]]]

# The declared GPUs of a node's removal row: it is configured nowhere from then on.
REMOVED = -1

# Stores a report, as the node's latest too when it is (of two at one instant, the fewer GPUs);
# answers whether the capacity rows from its instant on must be rebuilt, not just appended to:
# when something that counts for capacity is recorded later than it (a later report of the node,
# a later config change of any node), or a config change at its very instant (the rows there are
# the apply's, as a rebuild says, whichever came first).
_REPORT_SQL = text(
    """
    WITH report AS (
        INSERT INTO node_capacity_reports (node, reported_at, gpu_count)
        VALUES (:node, to_timestamp(:at), :gpus)
        ON CONFLICT (node, reported_at) DO UPDATE
        SET gpu_count = LEAST(node_capacity_reports.gpu_count, EXCLUDED.gpu_count)
        RETURNING 1),
    latest AS (
        INSERT INTO node_capacity (node, gpu_count, changed_at)
        VALUES (:node, :gpus, to_timestamp(:at))
        ON CONFLICT (node) DO UPDATE SET
            gpu_count = CASE WHEN node_capacity.changed_at = EXCLUDED.changed_at
                             THEN LEAST(node_capacity.gpu_count, EXCLUDED.gpu_count)
                             ELSE EXCLUDED.gpu_count END,
            changed_at = EXCLUDED.changed_at
        WHERE node_capacity.changed_at <= EXCLUDED.changed_at
        RETURNING 1)
    SELECT EXISTS (SELECT 1 FROM node_capacity_reports
                   WHERE node = :node AND reported_at > to_timestamp(:at))
        OR EXISTS (SELECT 1 FROM node_config_history WHERE changed_at >= to_timestamp(:at))
    """
)


def record_report(conn: Connection, node: str, gpus: int, at_s: float) -> bool:
    """Store `node`'s report of `gpus` usable GPUs at `at_s`; True when it is late (see above)."""
    return bool(conn.execute(_REPORT_SQL, {"node": node, "gpus": gpus, "at": at_s}).scalar_one())


def later_than(conn: Connection, at_s: float) -> bool:
    """Whether a report or a config change is recorded later than `at_s`, or a report at it
    (a config apply's rows at a report's instant are rebuilt: see `_REPORT_SQL`)."""
    return bool(
        conn.execute(
            text(
                "SELECT EXISTS (SELECT 1 FROM node_capacity "
                "WHERE changed_at >= to_timestamp(:at)) "
                "OR EXISTS (SELECT 1 FROM node_config_history "
                "WHERE changed_at > to_timestamp(:at))"
            ),
            {"at": at_s},
        ).scalar_one()
    )


# Per (node, instant) of the arrays whose node has a config row: its declared GPUs in its config
# in force just before that instant, NULL when it was not configured then (no row yet, or its
# removal's). A node with no row is as configured now (ingestion's check of a report,
# `ingest_pipeline`).
CONFIG_BEFORE_SQL = f"""
    SELECT e.node, e.at,
           (SELECT NULLIF(h.gpu_count, {REMOVED}) FROM node_config_history h
            WHERE h.node = e.node AND h.changed_at < to_timestamp(e.at)
            ORDER BY h.changed_at DESC LIMIT 1)
    FROM unnest(%s::text[], %s::float8[]) AS e(node, at)
    WHERE EXISTS (SELECT 1 FROM node_config_history h WHERE h.node = e.node)
"""

# A node as it counts now: in its pool while ready, with its type's weight (0 for none).
_CONFIGURED = """
    SELECT n.name AS node, CASE WHEN n.ready THEN n.pool END AS pool, n.gpu_type, n.gpu_count,
           COALESCE(g.compute_weight, 0.0) AS cu_per_gpu
    FROM nodes n LEFT JOIN gpu_types g ON g.name = n.gpu_type
"""

_SEED_SQL = text(
    f"""
    INSERT INTO node_config_history (node, changed_at, pool, gpu_type, gpu_count, cu_per_gpu)
    SELECT c.node, to_timestamp(0), c.pool, c.gpu_type, c.gpu_count, c.cu_per_gpu
    FROM ({_CONFIGURED}) AS c
    WHERE NOT EXISTS (SELECT 1 FROM node_config_history h WHERE h.node = c.node)
    ON CONFLICT (node, changed_at) DO NOTHING
    """
)


def seed_config(conn: Connection) -> None:
    """Before a config apply: give each configured node without a config row one, as it is
    configured now, since ever (what it counted as until now). Its change then starts from it."""
    conn.execute(_SEED_SQL)


# After a config apply at :at: a row for every node whose counting changed, or that is new, or
# that went (`REMOVED`: it counts nowhere from then on, and is not configured).
_RECORD_SQL = text(
    f"""
    INSERT INTO node_config_history (node, changed_at, pool, gpu_type, gpu_count, cu_per_gpu)
    SELECT COALESCE(c.node, h.node), to_timestamp(:at), c.pool,
           COALESCE(c.gpu_type, h.gpu_type), COALESCE(c.gpu_count, {REMOVED}),
           COALESCE(c.cu_per_gpu, h.cu_per_gpu)
    FROM ({_CONFIGURED}) AS c
    FULL JOIN (
        SELECT DISTINCT ON (node) node, pool, gpu_type, gpu_count, cu_per_gpu
        FROM node_config_history WHERE changed_at <= to_timestamp(:at)
        ORDER BY node, changed_at DESC) AS h ON h.node = c.node
    WHERE h.node IS NULL
       OR (c.node IS NULL AND h.gpu_count <> {REMOVED})
       OR (c.node IS NOT NULL
           AND (c.pool, c.gpu_type, c.gpu_count, c.cu_per_gpu)
               IS DISTINCT FROM (h.pool, h.gpu_type, h.gpu_count, h.cu_per_gpu))
    ON CONFLICT (node, changed_at) DO UPDATE SET pool = EXCLUDED.pool,
        gpu_type = EXCLUDED.gpu_type, gpu_count = EXCLUDED.gpu_count,
        cu_per_gpu = EXCLUDED.cu_per_gpu
    """
)


def record_config(conn: Connection, at_s: float) -> int:
    """After a config apply at `at_s`: record each node whose counting it changed; how many."""
    return conn.execute(_RECORD_SQL, {"at": at_s}).rowcount or 0


def configs_from(conn: Connection, start_s: float) -> NodeConfigs:
    """Per node, its config entries from the one in force at `start_s` on, in time order; a
    node with no config row has one entry, as it is configured now, since ever."""
    configs: NodeConfigs = defaultdict(list)
    rows = conn.execute(
        text(
            """
            SELECT node, extract(epoch FROM changed_at)::float8 AS at, pool, gpu_type,
                   gpu_count, cu_per_gpu
            FROM node_config_history h
            WHERE changed_at > to_timestamp(:at)
               OR changed_at = (SELECT max(changed_at) FROM node_config_history l
                                WHERE l.node = h.node AND l.changed_at <= to_timestamp(:at))
            ORDER BY node, changed_at
            """
        ),
        {"at": start_s},
    )
    for r in rows:
        configs[r.node].append((r.at, NodeConfig(r.pool, r.gpu_type, r.gpu_count, r.cu_per_gpu)))
    unrecorded = conn.execute(
        text(
            f"SELECT * FROM ({_CONFIGURED}) AS c WHERE NOT EXISTS "
            "(SELECT 1 FROM node_config_history h WHERE h.node = c.node)"
        )
    )
    for r in unrecorded:
        configs[r.node] = [(-math.inf, NodeConfig(r.pool, r.gpu_type, r.gpu_count, r.cu_per_gpu))]
    return dict(configs)


def reports_from(conn: Connection, start_s: float, nodes: Collection[str]) -> NodeReports:
    """Per node of `nodes`, its reports from the one in force at `start_s` on, in time order."""
    reports: NodeReports = defaultdict(list)
    rows = conn.execute(
        text(
            """
            SELECT n.node, extract(epoch FROM r.reported_at)::float8 AS at, r.gpu_count
            FROM unnest(CAST(:nodes AS text[])) AS n(node)
            CROSS JOIN LATERAL (
                SELECT reported_at, gpu_count FROM node_capacity_reports l
                WHERE l.node = n.node AND l.reported_at <= to_timestamp(:at)
                ORDER BY reported_at DESC LIMIT 1) AS r
            UNION ALL
            SELECT node, extract(epoch FROM reported_at)::float8, gpu_count
            FROM node_capacity_reports
            WHERE node = ANY(CAST(:nodes AS text[])) AND reported_at > to_timestamp(:at)
            ORDER BY 1, 2
            """
        ),
        {"at": start_s, "nodes": sorted(nodes)},
    )
    for node, at_s, gpus in rows:
        reports[node].append((at_s, gpus))
    return dict(reports)


# Retention (`retention_repo`): a row before the cutoff goes when a later row of the same node
# is at or before it; the latest one before it stays, in force at the horizon.
RETENTION_WHERE = {
    "node_capacity_reports": """
        x.reported_at < to_timestamp(:cutoff)
          AND EXISTS (
              SELECT 1 FROM node_capacity_reports later
              WHERE later.node = x.node AND later.reported_at > x.reported_at
                AND later.reported_at <= to_timestamp(:cutoff))
    """,
    "node_config_history": """
        x.changed_at < to_timestamp(:cutoff)
          AND EXISTS (
              SELECT 1 FROM node_config_history later
              WHERE later.node = x.node AND later.changed_at > x.changed_at
                AND later.changed_at <= to_timestamp(:cutoff))
    """,
}
