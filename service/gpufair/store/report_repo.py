"""Reads of the `report` schema (migration 0003) for GetUsage and the command line.

The SQL views are the one definition of how usage is bucketed and how budgets are computed; this
module only selects from them, so the API, the CLI and a user's own SQL always agree.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Literal

from sqlalchemy import Connection, text

from gpufair.domain.policy import deserved_cu_with_types
from gpufair.domain.rollup import HOUR_S, floor_hour, type_usage
from gpufair.store import config_repo, rollup_repo

Period = Literal["day", "week", "month"]

# The view per period: fixed names, never built from input.
_USAGE_VIEWS: dict[Period, str] = {
    "day": "report.usage_daily",
    "week": "report.usage_weekly",
    "month": "report.usage_monthly",
}


@dataclass(frozen=True, slots=True)
class UsageRecord:
    period_start: datetime
    pool: str
    queue: str
    gpu_type: str
    gpu_hours: float
    cu_hours: float
    over_quota_cu_hours: float


@dataclass(frozen=True, slots=True)
class BudgetRecord:
    queue: str
    pool: str  # '' = all pools (NULL in the report views)
    period: Period
    period_start: datetime
    period_end: datetime
    as_of: datetime
    budget_cu_hours: float
    consumed_cu_hours: float
    remaining_cu_hours: float
    burn_cu_hours_per_day: float
    projected_exhaustion: datetime | None
    percent_used: float


def usage(
    conn: Connection,
    period: Period,
    *,
    pool: str = "",
    queue: str = "",
    since: datetime | None = None,
    until: datetime | None = None,
    limit: int | None = None,
) -> list[UsageRecord]:
    """Usage rows of every period that overlaps [since, until), whole periods only (a week's row
    is always the whole week, as in the views), ordered by period, pool, queue and GPU type.

    `queue` selects that queue and every queue below it, so a department's usage comes back as
    the rows of its leaf queues; `pool` '' and `queue` '' mean all.
    """
    # The period containing `since` starts on or before it; computed on the UTC wall clock like
    # the views themselves.
    sql = f"""
        SELECT u.period_start, u.pool, u.queue, u.gpu_type,
               u.gpu_hours, u.cu_hours, u.over_quota_cu_hours
        FROM {_USAGE_VIEWS[period]} u
        WHERE (:pool = '' OR u.pool = :pool)
          AND (:queue = ''
               OR u.queue = :queue
               OR u.queue IN (SELECT a.queue FROM report.queue_ancestors a
                              WHERE a.ancestor = :queue))
          AND (CAST(:since AS timestamptz) IS NULL
               OR u.period_start >= date_trunc(:unit, CAST(:since AS timestamptz)
                                               AT TIME ZONE 'UTC') AT TIME ZONE 'UTC')
          AND (CAST(:until AS timestamptz) IS NULL OR u.period_start < :until)
        ORDER BY u.period_start, u.pool, u.queue, u.gpu_type
        LIMIT :limit
    """
    rows = conn.execute(
        text(sql),
        {
            "pool": pool,
            "queue": queue,
            "since": since,
            "until": until,
            "unit": period,
            "limit": limit,
        },
    )
    return [
        UsageRecord(
            period_start=r.period_start,
            pool=r.pool,
            queue=r.queue,
            gpu_type=r.gpu_type,
            gpu_hours=r.gpu_hours,
            cu_hours=r.cu_hours,
            over_quota_cu_hours=r.over_quota_cu_hours,
        )
        for r in rows
    ]


def budgets(
    conn: Connection, at: datetime, *, pool: str = "", queue: str = ""
) -> list[BudgetRecord]:
    """The status of every budget in its period containing `at` (report.budget_status_at).

    `queue` selects the budgets of that queue and of every queue below it; `pool` selects the
    budgets of that pool and the all-pools ones, which limit that pool's usage too.
    """
    rows = conn.execute(
        text(
            """
            SELECT b.* FROM report.budget_status_at(:at) b
            WHERE (:pool = '' OR b.pool IS NULL OR b.pool = :pool)
              AND (:queue = ''
                   OR b.queue = :queue
                   OR b.queue IN (SELECT a.queue FROM report.queue_ancestors a
                                  WHERE a.ancestor = :queue))
            ORDER BY b.queue, b.pool, b.period
            """
        ),
        {"at": at, "pool": pool, "queue": queue},
    )
    return [
        BudgetRecord(
            queue=r.queue,
            pool=r.pool or "",  # NULL in SQL: a budget of all pools
            period=r.period,
            period_start=r.period_start,
            period_end=r.period_end,
            as_of=r.as_of,
            budget_cu_hours=r.budget_cu_hours,
            consumed_cu_hours=r.consumed_cu_hours,
            remaining_cu_hours=r.remaining_cu_hours,
            burn_cu_hours_per_day=r.burn_cu_hours_per_day,
            projected_exhaustion=r.projected_exhaustion,
            percent_used=r.percent_used,
        )
        for r in rows
    ]


def queue_known(conn: Connection, name: str) -> bool:
    """Configured now, or present in the usage history (a deleted queue's reports still count)."""
    return bool(
        conn.execute(
            text(
                "SELECT EXISTS (SELECT 1 FROM queues WHERE name = :n) "
                "OR EXISTS (SELECT 1 FROM usage_hourly WHERE queue = :n)"
            ),
            {"n": name},
        ).scalar_one()
    )


def pool_known(conn: Connection, name: str) -> bool:
    """Configured now, or present in the usage history."""
    return bool(
        conn.execute(
            text(
                "SELECT EXISTS (SELECT 1 FROM node_pools WHERE name = :n) "
                "OR EXISTS (SELECT 1 FROM usage_hourly WHERE pool = :n)"
            ),
            {"n": name},
        ).scalar_one()
    )


def open_hour_usage(
    conn: Connection, now_s: float, *, pool: str = "", queue: str = ""
) -> list[UsageRecord]:
    """Usage of the open UTC hour, [start of the hour, now_s), from the raw runs (running ones
    count up to now_s): what the rolled-up views do not hold yet. Rows per pool x leaf queue x GPU
    type like the views', with `period_start` the hour's start; over-quota CU-hours against the
    queues' deserved CU as configured now, the rule the hourly rollup applies.

    `queue` selects that queue and every queue below it; `pool` '' and `queue` '' mean all.
    """
    lo_s = floor_hour(now_s)
    if now_s <= lo_s:
        return []
    config = config_repo.load_config(conn)
    weights = {t.name: t.compute_weight for t in config.gpu_types}
    wanted: set[str] | None = None
    if queue:
        wanted = {queue} | {
            r.queue
            for r in conn.execute(
                text("SELECT a.queue FROM report.queue_ancestors a WHERE a.ancestor = :q"),
                {"q": queue},
            )
        }
    pools = sorted(
        {p.name for p in config.pools}
        | {
            r.pool
            for r in conn.execute(
                text(
                    "SELECT DISTINCT pool FROM allocation_intervals "
                    "WHERE ended_at IS NULL OR ended_at > to_timestamp(:lo)"
                ),
                {"lo": lo_s},
            )
        }
    )
    start = datetime.fromtimestamp(lo_s, UTC)
    records: list[UsageRecord] = []
    for name in pools:
        if pool and name != pool:
            continue
        deserved = {q.name: deserved_cu_with_types(q.quota(name), weights) for q in config.queues}
        intervals = rollup_repo.intervals_between(conn, name, lo_s, min(now_s, lo_s + HOUR_S))
        for row in type_usage(intervals, deserved, lo_s, now_s):
            if wanted is not None and row.queue not in wanted:
                continue
            records.append(
                UsageRecord(
                    period_start=start,
                    pool=name,
                    queue=row.queue,
                    gpu_type=row.gpu_type,
                    gpu_hours=row.gpu_seconds / HOUR_S,
                    cu_hours=row.cu_seconds / HOUR_S,
                    over_quota_cu_hours=row.over_quota_cu_seconds / HOUR_S,
                )
            )
    return records
