"""Ledger.GetUsage: GPU-hours per type, CU-hours and over-quota CU-hours by day, week or month,
with every matching budget's consumption, burn and projected exhaustion.

The numbers come from the `report` SQL views (store/report_repo.py), the same ones users query
directly, so the RPC, the CLI and hand-written SQL never disagree.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from google.protobuf.timestamp_pb2 import Timestamp
from sqlalchemy import Engine

from gpufair.domain.errors import InvalidInputError, NotFound, Violation
from gpufair.domain.request_rules import name_violations, time_range_violations
from gpufair.store import report_repo
from gpufair.store.report_repo import BudgetRecord, Period, UsageRecord
from gpufair.v1 import ledger_pb2 as pb

# A reply beyond this many rows is refused rather than cut short: a silently truncated report
# would add up wrong. Daily rows for a year of 100 queues x 3 GPU types fit comfortably.
MAX_ROWS = 200_000

_PERIODS: dict[int, Period] = {
    pb.USAGE_PERIOD_UNSPECIFIED: "day",
    pb.USAGE_PERIOD_DAY: "day",
    pb.USAGE_PERIOD_WEEK: "week",
    pb.USAGE_PERIOD_MONTH: "month",
}


def _instant(ts: Timestamp, field: str, violations: list[Violation]) -> datetime | None:
    try:
        return ts.ToDatetime(tzinfo=UTC)
    except (ValueError, OverflowError):
        violations.append(Violation(field, "not a valid timestamp"))
        return None


def _timestamp(at: datetime) -> Timestamp:
    ts = Timestamp()
    ts.FromDatetime(at)
    return ts


def _usage_row(r: UsageRecord) -> pb.UsageRow:
    return pb.UsageRow(
        period_start=_timestamp(r.period_start),
        pool=r.pool,
        queue=r.queue,
        gpu_type=r.gpu_type,
        gpu_hours=r.gpu_hours,
        cu_hours=r.cu_hours,
        over_quota_cu_hours=r.over_quota_cu_hours,
    )


def _budget_row(b: BudgetRecord) -> pb.BudgetRow:
    row = pb.BudgetRow(
        queue=b.queue,
        pool=b.pool,
        period=b.period,
        period_start=_timestamp(b.period_start),
        budget_cu_hours=b.budget_cu_hours,
        consumed_cu_hours=b.consumed_cu_hours,
        remaining_cu_hours=b.remaining_cu_hours,
        burn_cu_hours_per_day=b.burn_cu_hours_per_day,
    )
    if b.projected_exhaustion is not None:
        row.projected_exhaustion.CopyFrom(_timestamp(b.projected_exhaustion))
    return row


def get_usage(engine: Engine, request: pb.GetUsageRequest, now_s: float) -> pb.GetUsageResponse:
    """Usage rows of every period overlapping [since, until) (whole periods; unset = unbounded),
    for a pool and/or a queue (a parent queue: the rows of every queue below it), and the
    budgets that apply, each in its own period containing `now_s`. With `include_open_hour`,
    rows of the open UTC hour (up to `now_s`, from the raw runs) follow, marked `partial`, unless
    `until` ends before that hour or `since` starts after `now_s`.

    Raises InvalidInputError (INVALID_ARGUMENT) for an unknown period, an invalid timestamp, since not
    before until, or a range with more than MAX_ROWS rows; NotFound for a pool or queue that is
    neither configured nor in the usage history.
    """
    violations: list[Violation] = []
    period = _PERIODS.get(request.period)
    if period is None:
        violations.append(
            Violation("period", f"unknown period {request.period}; use day, week or month")
        )
    violations += name_violations("pool", request.pool, required=False)
    violations += name_violations("queue", request.queue, required=False)
    range_violations = time_range_violations(
        (request.since.seconds, request.since.nanos) if request.HasField("since") else None,
        (request.until.seconds, request.until.nanos) if request.HasField("until") else None,
    )
    violations += range_violations
    since = until = None
    if not range_violations:
        since = _instant(request.since, "since", violations) if request.HasField("since") else None
        until = _instant(request.until, "until", violations) if request.HasField("until") else None
    if violations or period is None:
        raise InvalidInputError(violations)

    # One snapshot for both queries, so the usage rows and the budgets describe the same data.
    with engine.connect().execution_options(isolation_level="REPEATABLE READ") as conn:
        if request.pool and not report_repo.pool_known(conn, request.pool):
            raise NotFound("pool", request.pool)
        if request.queue and not report_repo.queue_known(conn, request.queue):
            raise NotFound("queue", request.queue)
        rows = report_repo.usage(
            conn,
            period,
            pool=request.pool,
            queue=request.queue,
            since=since,
            until=until,
            limit=MAX_ROWS + 1,
        )
        if len(rows) > MAX_ROWS:
            raise InvalidInputError(
                [
                    Violation(
                        "since",
                        f"more than {MAX_ROWS} rows; narrow since/until, pick a longer period "
                        "or filter by pool or queue",
                    )
                ]
            )
        budgets = report_repo.budgets(
            conn, datetime.fromtimestamp(now_s, UTC), pool=request.pool, queue=request.queue
        )
        open_rows = (
            report_repo.open_hour_usage(conn, now_s, pool=request.pool, queue=request.queue)
            # The open hour so far, [its start, now), where it overlaps [since, until).
            if request.include_open_hour
            and (until is None or until.timestamp() > now_s - now_s % 3600)
            and (since is None or since.timestamp() < now_s)
            else []
        )
        conn.rollback()
    reply = pb.GetUsageResponse(
        rows=[_usage_row(r) for r in rows], budgets=[_budget_row(b) for b in budgets]
    )
    for r in open_rows:
        row = reply.rows.add()
        row.CopyFrom(_usage_row(r))
        row.period_start.CopyFrom(_timestamp(_period_start(r.period_start, period)))
        row.partial = True
    reply.as_of.FromNanoseconds(round(now_s * 1e9))
    return reply


def _period_start(at: datetime, period: Period) -> datetime:
    """The start of the UTC day, ISO week (Monday) or calendar month containing `at`."""
    day = at.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    if period == "week":
        return day - timedelta(days=day.weekday())
    if period == "month":
        return day.replace(day=1)
    return day
