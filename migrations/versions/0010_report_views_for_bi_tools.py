"""report views for BI tools: the open hour, accounting per workload, utilisation, fair-share
history; a comment on every report view and column

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-01 15:30:00.000000

Hand-written like 0003 (views are not SQLAlchemy tables):

- `report.usage_open_hour`: the open UTC hour so far, from the raw runs (running ones count up
  to now()), per pool x leaf queue x GPU type: what the rolled-up views do not hold yet. Marked
  `partial`; GPU- and CU-hours only (over-quota CU-hours need the hour's sweep of every queue's
  allocation against its quota, which the rollup does once the hour is over).
- `report.workload_accounting`: one row per workload, as `sacct` gives Slurm users: submit,
  start, end, wait, requested GPUs, GPU-hours, CU-hours, runs, evictions, how its last run ended.
- `report.pool_utilisation_daily`: per UTC day x pool x GPU type, the GPU-hours the pool had, the
  GPU-hours used and idle, and the ratio; closed hours only, like the usage views.
- `report.fair_share_history`: each recompute's weights and shares per queue, over time.
- `report.budget_status_at` (and so `report.budget_status`) says NULL, not '', for a budget of
  all pools: "no pool" is what NULL means in SQL, and `pool IS NULL` reads as intended in a BI
  tool. The body is 0003's with that one change (its last SELECT); downgrading restores 0003's.
- `COMMENT ON` every view of the schema and each of its columns, and the budget function, so a
  BI tool's catalogue explains them.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

ROLES = ("gpufair_reporter", "gpufair_service")


def _migration_0003() -> Any:
    """0003's module, loaded from its file beside this one (Alembic loads migrations by path)."""
    spec = importlib.util.spec_from_file_location(
        "gpufair_migration_0003", Path(__file__).with_name("0003_report_views.py")
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# 0003's function, as it created it.
_BUDGET_0003: str = _migration_0003()._BUDGET_STATUS_AT
_ALL_POOLS_IN = "SELECT g.b_queue,\n       g.b_pool,\n"
_ALL_POOLS_OUT = "SELECT g.b_queue,\n       nullif(g.b_pool, ''),\n"
assert _BUDGET_0003.count(_ALL_POOLS_IN) == 1
# Same signature and result type: CREATE OR REPLACE keeps the grants and the view on top of it.
_BUDGET_NULL_POOL = _BUDGET_0003.replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION").replace(
    _ALL_POOLS_IN, _ALL_POOLS_OUT
)

# The wall clock of the bucket bounds is UTC, as in 0003: the session's TimeZone must not move
# an hour or a day.
_OPEN_HOUR = """
CREATE VIEW report.usage_open_hour AS
WITH h AS (
    SELECT date_trunc('hour', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC' AS hour_start,
           now() AS as_of
),
pieces AS (
    SELECT h.hour_start, h.as_of, a.pool, a.queue, a.gpu_type, a.gpus, a.cu,
           extract(epoch FROM least(coalesce(a.ended_at, h.as_of), h.as_of)
                             - greatest(a.started_at, h.hour_start))::float8 AS seconds
    FROM public.allocation_intervals a CROSS JOIN h
    WHERE a.started_at < h.as_of
      AND (a.ended_at IS NULL OR a.ended_at > h.hour_start)
      AND a.gpus < 'Infinity'::float8 AND a.cu < 'Infinity'::float8
)
SELECT p.hour_start,
       p.as_of,
       p.pool,
       p.queue,
       p.gpu_type,
       sum(p.gpus * p.seconds) / 3600 AS gpu_hours,
       sum(p.cu * p.seconds) / 3600 AS cu_hours,
       true AS partial
FROM pieces p
WHERE p.seconds > 0
GROUP BY p.hour_start, p.as_of, p.pool, p.queue, p.gpu_type
"""

# Runs are told apart by their start event: a run on two GPU types is two intervals.
_ACCOUNTING = """
CREATE VIEW report.workload_accounting AS
SELECT w.uid AS workload,
       w.pool,
       w.queue,
       w.state,
       (w.spec ->> 'pods')::int * (w.spec ->> 'gpus_per_pod')::float8 AS requested_gpus,
       w.submit_time,
       r.first_start AS start_time,
       CASE WHEN w.state IN ('finished', 'cancelled') THEN r.last_end END AS end_time,
       extract(epoch FROM coalesce(
           r.first_start,
           CASE WHEN w.state = 'cancelled' THEN w.state_changed_at ELSE now() END
       ) - w.submit_time)::float8 AS wait_s,
       coalesce(r.gpu_hours, 0) AS gpu_hours,
       coalesce(r.cu_hours, 0) AS cu_hours,
       coalesce(r.runs, 0) AS runs,
       coalesce(r.evictions, 0) AS evictions,
       r.last_end_kind
FROM public.workloads w
LEFT JOIN LATERAL (
    SELECT min(a.started_at) AS first_start,
           max(a.ended_at) AS last_end,
           sum(a.gpus * extract(epoch FROM coalesce(a.ended_at, now()) - a.started_at)) / 3600
               AS gpu_hours,
           sum(a.cu * extract(epoch FROM coalesce(a.ended_at, now()) - a.started_at)) / 3600
               AS cu_hours,
           count(DISTINCT a.start_event_id) AS runs,
           count(DISTINCT a.start_event_id) FILTER (WHERE a.end_kind = 'preempted') AS evictions,
           (array_agg(a.end_kind ORDER BY a.started_at DESC))[1] AS last_end_kind
    FROM public.allocation_intervals a
    WHERE a.workload_uid = w.uid
) r ON true
"""

# Capacity is a step function (pool_capacity_changes); each step is cut at UTC midnights and at
# the last whole hour, the same end as the usage the ratio divides.
_UTILISATION = """
CREATE VIEW report.pool_utilisation_daily AS
WITH closed AS (
    SELECT date_trunc('hour', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC' AS until
),
steps AS (
    SELECT c.pool, c.capacity_gpus_by_type, c.changed_at AS s,
           coalesce(lead(c.changed_at) OVER (PARTITION BY c.pool ORDER BY c.changed_at),
                    'infinity'::timestamptz) AS e
    FROM public.pool_capacity_changes c
),
cut AS (
    SELECT st.pool, t.key AS gpu_type, t.value::float8 AS gpus,
           greatest(st.s, d.day) AS s, least(st.e, d.day + interval '1 day', cl.until) AS e,
           d.day
    FROM steps st
    CROSS JOIN closed cl
    CROSS JOIN LATERAL jsonb_each_text(st.capacity_gpus_by_type) t
    CROSS JOIN LATERAL generate_series(
        date_trunc('day', st.s AT TIME ZONE 'UTC') AT TIME ZONE 'UTC',
        least(st.e, cl.until),
        interval '1 day'
    ) AS d(day)
),
capacity AS (
    SELECT c.day, c.pool, c.gpu_type,
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

_FAIR_SHARE_HISTORY = """
CREATE VIEW report.fair_share_history AS
SELECT h.computed_at,
       h.pool,
       h.queue,
       h.parent,
       h.priority,
       r.capacity_cu AS pool_capacity_cu,
       h.deserved_cu,
       h.limit_cu,
       h.demand_cu,
       h.allocated_cu,
       h.weight_share,
       h.usage_share,
       h.priority_weight,
       h.effective_weight,
       h.fair_share_cu,
       h.decayed_usage_cu_s / 3600 AS decayed_usage_cu_hours
FROM public.fair_share_history h
JOIN public.fair_share_runs r ON r.id = h.run_id
"""

_NEW_VIEWS = {
    "usage_open_hour": _OPEN_HOUR,
    "workload_accounting": _ACCOUNTING,
    "pool_utilisation_daily": _UTILISATION,
    "fair_share_history": _FAIR_SHARE_HISTORY,
}

_USAGE_COLUMNS = {
    "period_start": "start of the period: UTC midnight, Monday 00:00 UTC or the 1st 00:00 UTC",
    "pool": "node pool",
    "queue": "leaf queue",
    "gpu_type": "GPU type",
    "gpu_hours": "GPU-hours used (a GPU for an hour; a shared GPU counts its fraction)",
    "cu_hours": "compute-unit hours used: GPU-hours times the GPU type's compute weight",
    "over_quota_cu_hours": "the part of cu_hours above the queue's deserved CU at the time",
}

# view -> (what it holds, {column: meaning})
COMMENTS: dict[str, tuple[str, dict[str, str]]] = {
    **{
        name: (
            f"usage per {unit}, pool, leaf queue and GPU type, from hourly rollups: closed UTC "
            "hours only (the open hour is in usage_open_hour)",
            _USAGE_COLUMNS,
        )
        for name, unit in (
            ("usage_daily", "UTC day"),
            ("usage_weekly", "ISO week"),
            ("usage_monthly", "calendar month"),
        )
    },
    "queue_ancestors": (
        "each configured queue with itself and every queue above it: join on queue and filter "
        "on ancestor to sum a department's leaf queues",
        {"queue": "a configured queue", "ancestor": "the queue itself or a queue above it"},
    ),
    "budget_status": (
        "every budget in its period containing now(), counted up to the last whole UTC hour",
        {
            "queue": "the budget's queue (its usage counts every queue below it)",
            "pool": "the budget's pool; NULL for a budget of all pools",
            "period": "day, week or month",
            "period_start": "start of the current period (UTC)",
            "period_end": "end of the current period (UTC), exclusive",
            "as_of": "usage is counted up to this instant: the last whole UTC hour",
            "budget_cu_hours": "the budget, in CU-hours per period",
            "consumed_cu_hours": "CU-hours used in the period up to as_of",
            "remaining_cu_hours": "budget minus consumed; negative when overspent",
            "burn_cu_hours_per_day": "consumed over the days elapsed since period_start",
            "projected_exhaustion": "when the budget ran out, or will at this burn before "
            "period_end; NULL otherwise",
            "percent_used": "consumed as a percentage of the budget; above 100 when overspent",
        },
    ),
    "usage_open_hour": (
        "the open UTC hour so far, from the raw runs: partial, not yet in the usage views",
        {
            "hour_start": "start of the open UTC hour",
            "as_of": "counted up to this instant (now())",
            "pool": "node pool",
            "queue": "leaf queue",
            "gpu_type": "GPU type",
            "gpu_hours": "GPU-hours used since hour_start",
            "cu_hours": "compute-unit hours used since hour_start",
            "partial": "always true: the hour is not over",
        },
    ),
    "workload_accounting": (
        "one row per workload: submit, start, end, wait, GPU-hours, CU-hours and evictions",
        {
            "workload": "the workload's uid",
            "pool": "node pool",
            "queue": "leaf queue",
            "state": "pending, bound, running, finished or cancelled",
            "requested_gpus": "pods times GPUs per pod",
            "submit_time": "when it was submitted",
            "start_time": "when its first run started; NULL if it never ran",
            "end_time": "when its last run ended, once finished or cancelled; NULL before",
            "wait_s": "seconds from submit to its first start (to now while it waits)",
            "gpu_hours": "GPU-hours of all its runs (running ones up to now)",
            "cu_hours": "CU-hours of all its runs (running ones up to now)",
            "runs": "how many times it started",
            "evictions": "runs that ended preempted",
            "last_end_kind": "how its last run ended: stopped, preempted, failed, stale; NULL "
            "while it runs",
        },
    ),
    "pool_utilisation_daily": (
        "GPU-hours a pool had, used and left idle per UTC day and GPU type (closed hours)",
        {
            "day": "UTC midnight starting the day",
            "pool": "node pool",
            "gpu_type": "GPU type",
            "capacity_gpu_hours": "GPUs the pool had, integrated over the day's closed hours",
            "used_gpu_hours": "GPU-hours used (report.usage_daily summed over queues)",
            "idle_gpu_hours": "capacity_gpu_hours minus used_gpu_hours",
            "utilisation": "used over capacity, 0 to 1; NULL without capacity",
        },
    ),
    "fair_share_history": (
        "each recompute's weights and shares per pool and queue, over time",
        {
            "computed_at": "when the fair shares were computed",
            "pool": "node pool",
            "queue": "queue (every level of the tree)",
            "parent": "the queue above it; NULL at the top",
            "priority": "the queue's tier in the pool",
            "pool_capacity_cu": "what the pool held, in CU",
            "deserved_cu": "the queue's guaranteed CU",
            "limit_cu": "the queue's cap in CU; NULL without one",
            "demand_cu": "allocated plus pending work, in CU",
            "allocated_cu": "CU its running and bound work held",
            "weight_share": "W': its over-quota weight over its siblings'",
            "usage_share": "U': its decayed usage over its group's",
            "priority_weight": "P = max(0, W' + k (W' - U'))",
            "effective_weight": "the weight the water-fill used",
            "fair_share_cu": "its fair share, in CU",
            "decayed_usage_cu_hours": "its decayed usage in the window, in CU-hours",
        },
    ),
}

_FUNCTION_COMMENT = (
    "report.budget_status as of any instant: every budget in its period containing the "
    "argument, counted up to the last whole UTC hour before it"
)


def _quote(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def upgrade() -> None:
    op.execute(_BUDGET_NULL_POOL)
    for name, sql in _NEW_VIEWS.items():
        op.execute(sql)
        for role in ROLES:
            op.execute(f"GRANT SELECT ON report.{name} TO {role}")
    for view, (what, columns) in COMMENTS.items():
        op.execute(f"COMMENT ON VIEW report.{view} IS {_quote(what)}")
        for column, meaning in columns.items():
            op.execute(f"COMMENT ON COLUMN report.{view}.{column} IS {_quote(meaning)}")
    op.execute(
        "COMMENT ON FUNCTION report.budget_status_at(timestamptz) IS " + _quote(_FUNCTION_COMMENT)
    )


def downgrade() -> None:
    op.execute("COMMENT ON FUNCTION report.budget_status_at(timestamptz) IS NULL")
    for view in COMMENTS:
        if view not in _NEW_VIEWS:
            op.execute(f"COMMENT ON VIEW report.{view} IS NULL")
            for column in COMMENTS[view][1]:
                op.execute(f"COMMENT ON COLUMN report.{view}.{column} IS NULL")
    for name in reversed(_NEW_VIEWS):
        op.execute(f"DROP VIEW report.{name}")
    op.execute(_BUDGET_0003.replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION"))
