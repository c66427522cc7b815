"""report.pool_utilisation_daily: days counted on the UTC wall clock in any session time zone

0010's view stepped from day to day with `timestamptz + interval '1 day'` (and generate_series
over timestamptz), which PostgreSQL computes in the session's TimeZone: in a zone that changes
its clocks, a day across the change was 23 or 25 hours long and every later day began an hour
off UTC midnight, so capacity fell into days of its own that matched no usage row (utilisation
NULL, idle hours wrong). This view does the day arithmetic on `timestamp` values of the UTC wall
clock, as the usage views and the budget function do, and turns only the result back into
`timestamptz`. Same columns and types: CREATE OR REPLACE keeps the grants and the comments.

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-06 00:00:00.000000
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from alembic import op

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None

# Capacity is a step function (pool_capacity_changes); each step is cut at UTC midnights and at
# the last whole hour, the same end as the usage the ratio divides. Every bound below is a
# `timestamp` of the UTC wall clock, where a day is always 24 hours.
_UTILISATION = """
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


def _view_0010() -> str:
    """0010's view, from its file beside this one (Alembic loads migrations by path)."""
    spec = importlib.util.spec_from_file_location(
        "gpufair_migration_0010", Path(__file__).with_name("0010_report_views_for_bi_tools.py")
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sql: str = module._UTILISATION
    return sql.replace("CREATE VIEW", "CREATE OR REPLACE VIEW")


def upgrade() -> None:
    op.execute(_UTILISATION)


def downgrade() -> None:
    op.execute(_view_0010())
