"""report views and the read-only reporter role

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-02 09:00:00.000000

Hand-written: views and functions are not SQLAlchemy tables, so autogenerate neither creates nor
compares them (env.py compares the default schema only).

- `report.usage_daily`, `report.usage_weekly`, `report.usage_monthly`: the hourly rollups summed
  per UTC day, ISO week (Monday) and calendar month, per pool x leaf queue x GPU type, in hours.
- `report.queue_ancestors`: each configured queue with itself and every queue above it, so usage
  of leaf queues can be summed per department.
- `report.budget_status_at(at)`: every budget's current period as of `at`, with consumption, burn
  and projected exhaustion; `report.budget_status` is the same at now().
- Role `gpufair_reporter` (NOLOGIN): may read `report` and nothing else. Grant it to login roles.
"""

from __future__ import annotations

from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

ROLE = "gpufair_reporter"

# The bucketing expressions work on the UTC wall clock: date_trunc on a timestamptz would use the
# session's TimeZone, and the same query would then give different days to different clients.
_USAGE_VIEW = """
CREATE VIEW report.{name} AS
SELECT date_trunc('{unit}', u.bucket_start AT TIME ZONE 'UTC') AT TIME ZONE 'UTC' AS period_start,
       u.pool,
       u.queue,
       u.gpu_type,
       sum(u.gpu_seconds) / 3600 AS gpu_hours,
       sum(u.cu_seconds) / 3600 AS cu_hours,
       sum(u.over_quota_cu_seconds) / 3600 AS over_quota_cu_hours
FROM public.usage_hourly u
GROUP BY 1, u.pool, u.queue, u.gpu_type
"""

_USAGE_VIEWS = {"usage_daily": "day", "usage_weekly": "week", "usage_monthly": "month"}

# UNION (not UNION ALL) stops the recursion even if a cycle ever slipped into the queue tree.
_QUEUE_ANCESTORS = """
CREATE VIEW report.queue_ancestors AS
WITH RECURSIVE up(queue, ancestor) AS (
    SELECT q.name, q.name FROM public.queues q
    UNION
    SELECT up.queue, q.parent
    FROM up JOIN public.queues q ON q.name = up.ancestor
    WHERE q.parent IS NOT NULL
)
SELECT up.queue, up.ancestor FROM up
"""

# How a budget's numbers are defined (README, "Reporting with SQL", says the same to users):
# - The period is the one containing `at`: the UTC day, the ISO week (from Monday 00:00 UTC) or the
#   calendar month.
# - Usage is counted up to `as_of`, the last whole UTC hour at or before `at`: rollups are per
#   hour, so an hour counts once it is over (a row for the running hour would otherwise count in
#   full before it happened), and consumption and elapsed time end at the same instant.
# - A budget of a parent queue counts the usage of every queue below it; pool '' counts all pools.
# - burn = consumed / elapsed days (0 at the very start of the period).
# - projected_exhaustion: when consumption already reached the budget, the instant it did
#   (interpolated inside the hour that crossed it, as if that hour's use were even); otherwise
#   as_of + remaining / burn if that falls before the period ends; else NULL (no burn yet, or the
#   budget outlasts the period at this rate).
# - remaining is negative when the budget is overspent; percent_used may exceed 100.
# The body says $1, not `at`: AT is also a keyword (AT TIME ZONE), and $1 cannot be misread.
# SECURITY DEFINER: functions run with the caller's rights, and the reporter role may not read the
# tables behind this one; the fixed search_path keeps a caller's objects from being picked up.
_BUDGET_STATUS_AT = """
CREATE FUNCTION report.budget_status_at(at timestamptz)
RETURNS TABLE (
    queue text,
    pool text,
    period text,
    period_start timestamptz,
    period_end timestamptz,
    as_of timestamptz,
    budget_cu_hours double precision,
    consumed_cu_hours double precision,
    remaining_cu_hours double precision,
    burn_cu_hours_per_day double precision,
    projected_exhaustion timestamptz,
    percent_used double precision
)
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
WITH RECURSIVE members(budget_queue, member) AS (
    SELECT DISTINCT b.queue, b.queue FROM public.budgets b
    UNION
    SELECT m.budget_queue, q.name
    FROM members m JOIN public.queues q ON q.parent = m.member
),
bounds AS (
    SELECT b.queue AS b_queue,
           b.pool AS b_pool,
           b.period AS b_period,
           b.cu_hours AS b_budget,
           date_trunc(b.period, $1 AT TIME ZONE 'UTC') AT TIME ZONE 'UTC' AS b_start,
           (date_trunc(b.period, $1 AT TIME ZONE 'UTC') + ('1 ' || b.period)::interval)
               AT TIME ZONE 'UTC' AS b_end,
           date_trunc('hour', $1 AT TIME ZONE 'UTC') AT TIME ZONE 'UTC' AS b_as_of
    FROM public.budgets b
),
hours AS (
    SELECT bd.b_queue, bd.b_pool, bd.b_period, u.bucket_start, sum(u.cu_seconds) / 3600 AS cu_h
    FROM bounds bd
    JOIN members m ON m.budget_queue = bd.b_queue
    JOIN public.usage_hourly u
      ON u.queue = m.member
     AND (bd.b_pool = '' OR u.pool = bd.b_pool)
     AND u.bucket_start >= bd.b_start
     AND u.bucket_start + interval '1 hour' <= bd.b_as_of
    GROUP BY bd.b_queue, bd.b_pool, bd.b_period, u.bucket_start
),
running AS (
    SELECT h.*,
           sum(h.cu_h) OVER (
               PARTITION BY h.b_queue, h.b_pool, h.b_period ORDER BY h.bucket_start
           ) AS cum
    FROM hours h
),
totals AS (
    SELECT r.b_queue, r.b_pool, r.b_period, sum(r.cu_h) AS consumed
    FROM running r
    GROUP BY r.b_queue, r.b_pool, r.b_period
),
reached AS (
    SELECT DISTINCT ON (r.b_queue, r.b_pool, r.b_period)
           r.b_queue, r.b_pool, r.b_period,
           r.bucket_start
               + make_interval(secs => 3600 * (bd.b_budget - (r.cum - r.cu_h)) / r.cu_h)
               AS reached_at
    FROM running r
    JOIN bounds bd USING (b_queue, b_pool, b_period)
    WHERE r.cum >= bd.b_budget
    ORDER BY r.b_queue, r.b_pool, r.b_period, r.bucket_start
),
status AS (
    SELECT bd.*,
           coalesce(t.consumed, 0) AS consumed,
           extract(epoch FROM bd.b_as_of - bd.b_start)::double precision / 86400 AS elapsed_days,
           rc.reached_at
    FROM bounds bd
    LEFT JOIN totals t USING (b_queue, b_pool, b_period)
    LEFT JOIN reached rc USING (b_queue, b_pool, b_period)
),
burning AS (
    SELECT s.*,
           CASE WHEN s.elapsed_days > 0 THEN s.consumed / s.elapsed_days ELSE 0 END AS burn
    FROM status s
)
SELECT g.b_queue,
       g.b_pool,
       g.b_period,
       g.b_start,
       g.b_end,
       g.b_as_of,
       g.b_budget,
       g.consumed,
       g.b_budget - g.consumed,
       g.burn,
       CASE
           WHEN g.reached_at IS NOT NULL THEN g.reached_at
           WHEN g.burn > 0
                AND g.b_as_of + make_interval(secs => 86400 * (g.b_budget - g.consumed) / g.burn)
                    < g.b_end
               THEN g.b_as_of + make_interval(secs => 86400 * (g.b_budget - g.consumed) / g.burn)
       END,
       100 * g.consumed / g.b_budget
FROM burning g
ORDER BY g.b_queue, g.b_pool, g.b_period
$fn$
"""

# A DO block because roles are cluster-wide: another database on the same server (or a test
# migrating its own scratch database at the same moment) may have created it already.
_CREATE_ROLE = f"""
DO $do$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = '{ROLE}') THEN
        BEGIN
            CREATE ROLE {ROLE} NOLOGIN;
        EXCEPTION
            WHEN duplicate_object OR unique_violation THEN
                NULL;  -- created concurrently by another migration: just as good
            WHEN insufficient_privilege THEN
                RAISE EXCEPTION 'cannot create role {ROLE}: the migrating user lacks CREATEROLE'
                    USING HINT = 'As a superuser run: CREATE ROLE {ROLE} NOLOGIN; then migrate '
                                 'again.';
        END;
    END IF;
END
$do$
"""


def upgrade() -> None:
    op.execute("CREATE SCHEMA report")
    op.execute(
        f"COMMENT ON SCHEMA report IS 'gpufair usage and budget reports; readable by {ROLE}'"
    )
    for name, unit in _USAGE_VIEWS.items():
        op.execute(_USAGE_VIEW.format(name=name, unit=unit))
    op.execute(_QUEUE_ANCESTORS)
    op.execute(_BUDGET_STATUS_AT)
    op.execute("CREATE VIEW report.budget_status AS SELECT * FROM report.budget_status_at(now())")

    op.execute(_CREATE_ROLE)
    op.execute(f"GRANT USAGE ON SCHEMA report TO {ROLE}")
    # Covers the views that exist now: a later migration adding or re-creating a report view
    # grants SELECT on it itself.
    op.execute(f"GRANT SELECT ON ALL TABLES IN SCHEMA report TO {ROLE}")
    # Functions are executable by PUBLIC unless revoked; this one reads the ledger with its
    # owner's rights, so only the reporter (and the owner) may call it.
    op.execute("REVOKE EXECUTE ON FUNCTION report.budget_status_at(timestamptz) FROM PUBLIC")
    op.execute(f"GRANT EXECUTE ON FUNCTION report.budget_status_at(timestamptz) TO {ROLE}")
    # Nothing in public: the reporter holds no grants there (this states it, and undoes any grant
    # someone gave it by hand before this migration).
    op.execute(f"REVOKE ALL ON ALL TABLES IN SCHEMA public FROM {ROLE}")
    op.execute(f"REVOKE ALL ON ALL SEQUENCES IN SCHEMA public FROM {ROLE}")


def downgrade() -> None:
    # The role stays: it is shared by every database on the server that ran this migration. Once
    # none uses it any more, a superuser may `DROP ROLE gpufair_reporter`.
    op.execute(f"REVOKE ALL ON ALL TABLES IN SCHEMA report FROM {ROLE}")
    op.execute(f"REVOKE ALL ON SCHEMA report FROM {ROLE}")
    op.execute("DROP VIEW report.budget_status")
    op.execute("DROP FUNCTION report.budget_status_at(timestamptz)")
    op.execute("DROP VIEW report.queue_ancestors")
    for name in reversed(_USAGE_VIEWS):
        op.execute(f"DROP VIEW report.{name}")
    # No CASCADE: objects someone added to the schema by hand make the downgrade stop rather than
    # vanish.
    op.execute("DROP SCHEMA report")
