"""report.pool_utilisation_daily: a drained node's GPUs that running work holds stay capacity

The view's capacity was the pool's capacity rows (`pool_capacity_changes`), which count ready
nodes only: a node drained (gpufair drain, SetNodesReady, a Slurm node in DRAIN or DOWN) left
the capacity at once, while the work still running there kept counting as used until it ended.
A pool of 4 x 8 GPUs, all 32 busy all day, with one node drained for 6 h under its 8 busy GPUs,
read 720 capacity GPU-hours that day against 768 used: utilisation 1.067, idle -48. It now reads
768, 768, idle 0, utilisation 1.

The capacity now also counts, while a node is not ready (its config history entry has no pool,
`capacity_history.not_ready`), the GPUs the pool's runs hold there, at most the GPUs the node
counts for (its declared GPUs, or fewer if it reported fewer usable), fractions of shared GPUs
as fractions: the rule of the fair share's division and of U''s capacity
(`capacity_history.held_timeline`). Free GPUs of a drained node never count, nor work bound there
and never started (the ledger keeps no binding; it is no usage either). So used GPU-hours
never exceed capacity because of a drain; only a node reported with fewer usable GPUs than its
work holds still can (the report cuts the capacity; the work runs on). The node history counts
from where it is complete (`node_history_start`).

Same columns and types: CREATE OR REPLACE keeps the grants and the view's comment; the comments
of `utilisation`, `idle_gpu_hours` and `capacity_gpu_hours` say what counts now.

Revision ID: 0032
Revises: 0031
Create Date: 2026-12-06 19:00:00.000000
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

from alembic import op

revision = "0032"
down_revision = "0031"
branch_labels = None
depends_on = None

# The GPUs a pod of a run holds (`capacity_repo._POD_GPUS`): a fraction of a shared GPU as that
# fraction, else its whole GPUs.
_POD_GPUS = (
    "CASE WHEN (p.pod->>'gpu_fraction')::float8 < 1.0 THEN (p.pod->>'gpu_fraction')::float8 "
    "ELSE jsonb_array_length(p.pod->'gpu_indices') END"
)

# 0020's view with a second source of capacity, `held`: per pool and GPU type, the GPUs runs
# held on nodes while they were not ready. `drained`: the stretches of each node's config
# history that are not ready, from where the history is complete. `pods`: each run's pods on
# such a node within such a stretch (runs found as `rollup_repo.intervals_between` finds them:
# the long or open ones by their span's GiST index, the short ones by their start).
# `points`: where what a stretch counts may change (a run starts or ends, the node reports);
# `held` counts each piece between two points: what the runs of the pool active there hold, at
# most what the node counts for (the report in force, never more than declared). Everything
# after is 0020's, the held pieces cut into days as the rows' steps are.
_UTILISATION = f"""
CREATE OR REPLACE VIEW report.pool_utilisation_daily AS
WITH closed AS (
    SELECT date_trunc('hour', now() AT TIME ZONE 'UTC') AS until
),
steps AS (
    SELECT c.pool, c.capacity_gpus_by_type, c.changed_at AT TIME ZONE 'UTC' AS s,
           coalesce(lead(c.changed_at) OVER (PARTITION BY c.pool ORDER BY c.changed_at)
                        AT TIME ZONE 'UTC',
                    'infinity'::timestamp) AS e
    FROM public.pool_capacity_changes c
),
history AS (
    SELECT h.node, h.gpu_type, h.gpu_count, h.pool IS NULL AND h.gpu_count >= 0 AS not_ready,
           greatest(h.changed_at,
                    coalesce((SELECT max(since) FROM public.node_history_start),
                             '-infinity'::timestamptz)) AS s,
           coalesce(lead(h.changed_at) OVER (PARTITION BY h.node ORDER BY h.changed_at),
                    'infinity'::timestamptz) AS e
    FROM public.node_config_history h
),
drained AS (
    SELECT node, gpu_type, gpu_count, s, e FROM history WHERE not_ready AND e > s
),
pods AS (
    SELECT d.node, d.gpu_type, d.gpu_count, d.s AS ds, i.pool,
           greatest(i.started_at, d.s) AS s,
           least(coalesce(i.ended_at, 'infinity'::timestamptz), d.e) AS e,
           ({_POD_GPUS})::float8 AS gpus
    FROM drained d
    JOIN public.allocation_intervals i
      ON tstzrange(i.started_at, i.ended_at, '[)') && tstzrange(d.s, d.e, '[)')
     AND ((i.ended_at IS NULL OR i.ended_at - i.started_at >= interval '1 hour')
          AND tstzrange(i.started_at, i.ended_at, '[)') && tstzrange(d.s, d.e, '[)')
          OR i.started_at > d.s - interval '1 hour' AND i.started_at < d.e)
    CROSS JOIN LATERAL jsonb_array_elements(i.pods) AS p(pod)
    WHERE p.pod->>'node' = d.node
),
points AS (
    SELECT node, gpu_type, gpu_count, ds, pool, s AS at FROM pods
    UNION
    SELECT node, gpu_type, gpu_count, ds, pool, e FROM pods
    UNION
    SELECT o.node, o.gpu_type, o.gpu_count, o.ds, o.pool, r.reported_at
    FROM (SELECT DISTINCT node, gpu_type, gpu_count, ds, pool, min(s) OVER w AS lo,
                 max(e) OVER w AS hi
          FROM pods WINDOW w AS (PARTITION BY node, ds, pool)) o
    JOIN public.node_capacity_reports r
      ON r.node = o.node AND r.reported_at > o.lo AND r.reported_at < o.hi
),
pieces AS (
    SELECT node, gpu_type, gpu_count, ds, pool, at AS s,
           lead(at) OVER (PARTITION BY node, ds, pool ORDER BY at) AS e
    FROM points
),
held AS (
    SELECT g.pool, g.gpu_type, g.s AT TIME ZONE 'UTC' AS s, g.e AT TIME ZONE 'UTC' AS e,
           least(g.gpu_count::float8,
                 coalesce(r.gpu_count, g.gpu_count)::float8, a.gpus) AS gpus
    FROM pieces g
    CROSS JOIN LATERAL (
        SELECT sum(q.gpus) AS gpus FROM pods q
        WHERE q.node = g.node AND q.ds = g.ds AND q.pool = g.pool AND q.s <= g.s AND q.e > g.s
    ) a
    LEFT JOIN LATERAL (
        SELECT x.gpu_count FROM public.node_capacity_reports x
        WHERE x.node = g.node AND x.reported_at <= g.s
        ORDER BY x.reported_at DESC LIMIT 1
    ) r ON true
    WHERE g.e > g.s AND a.gpus > 0
),
cut AS (
    SELECT st.pool, t.key AS gpu_type, t.value::float8 AS gpus,
           greatest(st.s, d.day) AS s, least(st.e, d.day + interval '1 day', cl.until) AS e,
           d.day
    FROM steps st
    CROSS JOIN closed cl
    CROSS JOIN LATERAL jsonb_each_text(st.capacity_gpus_by_type) t
    CROSS JOIN LATERAL generate_series(
        date_trunc('day', st.s),
        least(st.e, cl.until),
        interval '1 day'
    ) AS d(day)
    UNION ALL
    SELECT h.pool, h.gpu_type, h.gpus,
           greatest(h.s, d.day), least(h.e, d.day + interval '1 day', cl.until), d.day
    FROM held h
    CROSS JOIN closed cl
    CROSS JOIN LATERAL generate_series(
        date_trunc('day', h.s),
        least(h.e, cl.until),
        interval '1 day'
    ) AS d(day)
),
capacity AS (
    SELECT c.day AT TIME ZONE 'UTC' AS day, c.pool, c.gpu_type,
           sum(c.gpus * extract(epoch FROM c.e - c.s)::float8) / 3600 AS gpu_hours
    FROM cut c
    WHERE c.e > c.s
    GROUP BY c.day, c.pool, c.gpu_type
),
used AS (
    SELECT date_trunc('day', u.bucket_start AT TIME ZONE 'UTC') AT TIME ZONE 'UTC' AS day,
           u.pool, u.gpu_type, sum(u.gpu_seconds) / 3600 AS gpu_hours
    FROM public.usage_hourly u
    GROUP BY 1, u.pool, u.gpu_type
)
SELECT coalesce(c.day, u.day) AS day,
       coalesce(c.pool, u.pool) AS pool,
       coalesce(c.gpu_type, u.gpu_type) AS gpu_type,
       coalesce(c.gpu_hours, 0) AS capacity_gpu_hours,
       coalesce(u.gpu_hours, 0) AS used_gpu_hours,
       coalesce(c.gpu_hours, 0) - coalesce(u.gpu_hours, 0) AS idle_gpu_hours,
       coalesce(u.gpu_hours, 0) / nullif(c.gpu_hours, 0) AS utilisation
FROM capacity c
FULL JOIN used u ON u.day = c.day AND u.pool = c.pool AND u.gpu_type = c.gpu_type
"""

COMMENTS = {
    "capacity_gpu_hours": (
        "GPUs the pool had, integrated over the day's closed hours: its ready nodes, and on a "
        "node not ready (drained, down) the GPUs its running work still held there"
    ),
    "idle_gpu_hours": (
        "capacity_gpu_hours minus used_gpu_hours; below 0 only when work kept running on a "
        "node reported with fewer usable GPUs than it held"
    ),
    "utilisation": (
        "used over capacity; NULL without capacity. Above 1 (idle hours below 0) only when work "
        "kept running on a node reported with fewer usable GPUs than it held; a drain does not "
        "take it there (the GPUs running work holds on a drained node stay capacity until it ends)"
    ),
}


def _load(name: str, file: str) -> ModuleType:
    """A migration's module, from its file beside this one (Alembic loads migrations by path)."""
    spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name(file))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _comment(column: str, text: str) -> None:
    quoted = text.replace("'", "''")
    op.execute(f"COMMENT ON COLUMN report.pool_utilisation_daily.{column} IS '{quoted}'")


def upgrade() -> None:
    op.execute(_UTILISATION)
    for column, text in COMMENTS.items():
        _comment(column, text)


def downgrade() -> None:
    m0020 = _load("gpufair_migration_0020", "0020_utilisation_days_in_utc.py")
    op.execute(m0020._UTILISATION)
    m0010 = _load("gpufair_migration_0010", "0010_report_views_for_bi_tools.py")
    m0030 = _load("gpufair_migration_0030", "0030_accounting_of_compute_unit_requests.py")
    _, columns = m0010.COMMENTS["pool_utilisation_daily"]
    _comment("capacity_gpu_hours", columns["capacity_gpu_hours"])
    for column in ("idle_gpu_hours", "utilisation"):
        _comment(column, m0030.COMMENTS[("pool_utilisation_daily", column)])
