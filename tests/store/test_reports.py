"""The `report` views and budget function on real PostgreSQL, against hand-computed numbers
(the scenario is described in tests/report_support.py)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

import pytest
from report_support import (
    DAY,
    HOUR,
    MONTH,
    PINNED,
    WEEK,
    add_budget,
    add_scenario,
    add_usage,
)
from sqlalchemy import Connection, Engine, text

from gpufair.store import report_repo


@pytest.fixture
def scenario(db: Engine) -> Iterator[Engine]:
    with db.begin() as conn:
        add_scenario(conn)
    yield db


def rows(conn: Connection, sql: str, **params: Any) -> list[tuple[Any, ...]]:
    return [tuple(r) for r in conn.execute(text(sql), params)]


def usage(conn: Connection, view: str) -> list[tuple[Any, ...]]:
    return rows(
        conn,
        f"SELECT period_start, pool, queue, gpu_type, gpu_hours, cu_hours, over_quota_cu_hours "
        f"FROM report.{view} ORDER BY period_start, pool, queue, gpu_type",
    )


def budget(conn: Connection, at: datetime, queue: str, period: str, pool: str = "") -> Any:
    """The budget's row; the view says NULL for a budget of all pools (stored as '')."""
    row = conn.execute(
        text(
            "SELECT * FROM report.budget_status_at(:at) "
            "WHERE queue = :q AND period = :per AND pool IS NOT DISTINCT FROM :pool"
        ),
        {"at": at, "q": queue, "per": period, "pool": pool or None},
    ).one()
    return row


def test_daily_weekly_monthly_rollups(scenario: Engine) -> None:
    mon, tue = WEEK, WEEK + DAY
    with scenario.connect() as conn:
        assert usage(conn, "usage_daily") == [
            (mon, "main", "ops", "a100", 1, 10, 0),
            (mon, "main", "team-a", "a100", 30, 300, 0),
            (mon, "main", "vision-train", "v100", 5, 20, 0),
            (tue, "main", "team-a", "a100", 20, 200, 80),
            (tue, "spot", "vision-train", "rtx4090", 10, 20, 0),
        ]
        week = [
            (WEEK, "main", "ops", "a100", 1, 10, 0),
            (WEEK, "main", "team-a", "a100", 50, 500, 80),
            (WEEK, "main", "vision-train", "v100", 5, 20, 0),
            (WEEK, "spot", "vision-train", "rtx4090", 10, 20, 0),
        ]
        assert usage(conn, "usage_weekly") == week
        assert usage(conn, "usage_monthly") == [(MONTH, *r[1:]) for r in week]


def test_periods_are_utc_whatever_the_session_time_zone(db: Engine) -> None:
    # Tuesday 2026-03-31 23:00 UTC and Wednesday 2026-04-01 00:00 UTC: one ISO week (from Monday
    # 03-30), two days, two months. In Kolkata (+05:30) both hours fall on April 1st local time.
    last_hour_of_march = datetime.fromisoformat("2026-03-31T23:00:00+00:00")
    with db.begin() as conn:
        for at in (last_hour_of_march, last_hour_of_march + HOUR):
            add_usage(conn, queue="q", bucket_start=at, gpus=2, cu_per_gpu=10, gpu_type="a100")
    with db.connect() as conn:
        conn.execute(text("SET TIME ZONE 'Asia/Kolkata'"))
        daily = [(r[0], r[5]) for r in usage(conn, "usage_daily")]
        weekly = [(r[0], r[5]) for r in usage(conn, "usage_weekly")]
        monthly = [(r[0], r[5]) for r in usage(conn, "usage_monthly")]
        conn.rollback()
    utc = datetime.fromisoformat
    assert daily == [(utc("2026-03-31T00:00:00+00:00"), 20), (utc("2026-04-01T00:00:00+00:00"), 20)]
    assert weekly == [(utc("2026-03-30T00:00:00+00:00"), 40)]
    assert monthly == [
        (utc("2026-03-01T00:00:00+00:00"), 20),
        (utc("2026-04-01T00:00:00+00:00"), 20),
    ]


def test_budget_status_hand_computed(scenario: Engine) -> None:
    with scenario.begin() as conn:
        add_budget(conn, "team-a", "week", 1000)
    with scenario.connect() as conn:
        b = budget(conn, PINNED, "team-a", "week")
    # 500 CU-hours in the first 2.5 days: 200 a day, the other 500 last 2.5 days more.
    assert b.period_start == WEEK
    assert b.period_end == WEEK + 7 * DAY
    assert b.as_of == PINNED
    assert b.budget_cu_hours == 1000
    assert b.consumed_cu_hours == 500
    assert b.remaining_cu_hours == 500
    assert b.burn_cu_hours_per_day == pytest.approx(200)
    assert b.projected_exhaustion == WEEK + 5 * DAY
    assert b.percent_used == pytest.approx(50)


def test_parent_budget_counts_every_queue_below_it(scenario: Engine) -> None:
    with scenario.begin() as conn:
        add_budget(conn, "research", "week", 1000)
        add_budget(conn, "vision", "week", 100)
    with scenario.connect() as conn:
        research = budget(conn, PINNED, "research", "week")
        vision = budget(conn, PINNED, "vision", "week")
    # team-a 500 + vision-train 20 (main) + 20 (spot); ops is not under research.
    assert research.consumed_cu_hours == 540
    assert research.burn_cu_hours_per_day == pytest.approx(216)
    # 1000 / 216 days after the week began = 400,000 s = 4 days 15:06:40.
    assert research.projected_exhaustion == WEEK + timedelta(
        days=4, hours=15, minutes=6, seconds=40
    )
    # vision holds no usage itself: all of it is its child's. 40 / 2.5 = 16 a day, and 100 lasts
    # 6.25 days: it runs out within the week.
    assert vision.consumed_cu_hours == 40
    assert vision.projected_exhaustion == WEEK + timedelta(days=6, hours=6)


def test_pool_budget_counts_its_pool_all_pools_budget_counts_all(scenario: Engine) -> None:
    with scenario.begin() as conn:
        add_budget(conn, "research", "week", 1040, pool="main")
        add_budget(conn, "research", "week", 1000, pool="")
        add_budget(conn, "vision-train", "week", 15, pool="spot")
    with scenario.connect() as conn:
        main = budget(conn, PINNED, "research", "week", "main")
        everywhere = budget(conn, PINNED, "research", "week", "")
        spot = budget(conn, PINNED, "vision-train", "week", "spot")
    assert main.consumed_cu_hours == 520  # team-a 500 + vision-train's v100 20
    assert main.burn_cu_hours_per_day == pytest.approx(208)
    assert main.projected_exhaustion == WEEK + 5 * DAY
    assert everywhere.consumed_cu_hours == 540
    # Overspent: 20 CU-hours in the Tuesday 12:00 hour, the 15th reached three quarters into it.
    assert spot.consumed_cu_hours == 20
    assert spot.remaining_cu_hours == -5
    assert spot.percent_used == pytest.approx(400 / 3)
    assert spot.projected_exhaustion == WEEK + DAY + timedelta(hours=12, minutes=45)


def test_day_and_month_budgets_and_budgets_that_last(scenario: Engine) -> None:
    with scenario.begin() as conn:
        add_budget(conn, "team-a", "day", 400)
        add_budget(conn, "team-a", "month", 10_000)
        add_budget(conn, "ops", "week", 5000)
    with scenario.connect() as conn:
        day = budget(conn, PINNED, "team-a", "day")
        month = budget(conn, PINNED, "team-a", "month")
        ops = budget(conn, PINNED, "ops", "week")
    # Wednesday: nothing used yet today, twelve hours in.
    assert (day.period_start, day.period_end) == (WEEK + 2 * DAY, WEEK + 3 * DAY)
    assert (day.consumed_cu_hours, day.remaining_cu_hours, day.burn_cu_hours_per_day) == (0, 400, 0)
    assert day.projected_exhaustion is None
    # March began on Sunday the 1st: 500 over 3.5 days, and 10,000 would last 70 days.
    assert (month.period_start, month.period_end) == (MONTH, MONTH.replace(month=4))
    assert month.burn_cu_hours_per_day == pytest.approx(500 / 3.5)
    assert month.projected_exhaustion is None
    assert ops.consumed_cu_hours == 10 and ops.projected_exhaustion is None


def test_only_whole_hours_up_to_the_instant_count(scenario: Engine) -> None:
    with scenario.begin() as conn:
        add_budget(conn, "team-a", "day", 150)
    with scenario.connect() as conn:
        b = budget(conn, WEEK + DAY + timedelta(hours=10, minutes=30), "team-a", "day")
    # At Tuesday 10:30 the 10:00 hour is not over: only the 09:00 hour (100 CU-hours) counts,
    # over the ten hours to 10:00: 240 a day, and the last 50 last five more hours.
    assert b.as_of == WEEK + DAY + 10 * HOUR
    assert b.consumed_cu_hours == 100
    assert b.burn_cu_hours_per_day == pytest.approx(240)
    assert b.projected_exhaustion == WEEK + DAY + 15 * HOUR


def test_budget_without_usage_and_at_the_start_of_its_period(db: Engine) -> None:
    with db.begin() as conn:
        conn.execute(text("INSERT INTO queues (name) VALUES ('idle')"))
        add_budget(conn, "idle", "week", 10)
    with db.connect() as conn:
        b = budget(conn, WEEK, "idle", "week")
    assert (b.consumed_cu_hours, b.remaining_cu_hours, b.burn_cu_hours_per_day) == (0, 10, 0)
    assert b.percent_used == 0 and b.projected_exhaustion is None


def test_budget_status_view_is_the_function_at_now(db: Engine) -> None:
    with db.begin() as conn:
        conn.execute(text("INSERT INTO queues (name) VALUES ('q')"))
        add_budget(conn, "q", "day", 10)
        add_budget(conn, "q", "month", 1000)
        add_usage(
            conn,
            queue="q",
            bucket_start=conn.execute(
                text("SELECT date_trunc('hour', now()) - interval '1 hour'")
            ).scalar_one(),
            gpus=1,
            cu_per_gpu=10,
            gpu_type="a100",
        )
    with db.connect() as conn:  # one transaction: now() is the same in both
        view = rows(conn, "SELECT * FROM report.budget_status ORDER BY period")
        at_now = rows(conn, "SELECT * FROM report.budget_status_at(now()) ORDER BY period")
        conn.rollback()
    assert len(view) == 2 and view == at_now


def test_repo_filters(scenario: Engine) -> None:
    with scenario.begin() as conn:
        add_budget(conn, "research", "week", 1000)
        add_budget(conn, "team-a", "week", 1000)
        add_budget(conn, "ops", "week", 5000)
        add_budget(conn, "vision-train", "week", 15, pool="spot")
    with scenario.connect() as conn:
        research = report_repo.usage(conn, "day", queue="research")
        assert {r.queue for r in research} == {"team-a", "vision-train"}
        spot = report_repo.usage(conn, "week", pool="spot")
        assert [(r.queue, r.cu_hours) for r in spot] == [("vision-train", 20)]
        # since inside Tuesday selects Tuesday's whole day; until is exclusive.
        tuesday = report_repo.usage(conn, "day", since=WEEK + DAY + 10 * HOUR, until=WEEK + 2 * DAY)
        assert {r.period_start for r in tuesday} == {WEEK + DAY}
        assert report_repo.usage(conn, "week", since=WEEK + DAY, until=WEEK) == []
        assert len(report_repo.usage(conn, "day", limit=2)) == 2

        assert [(b.queue, b.pool) for b in report_repo.budgets(conn, PINNED, queue="vision")] == [
            ("vision-train", "spot")
        ]
        assert [(b.queue, b.pool) for b in report_repo.budgets(conn, PINNED, pool="main")] == [
            ("ops", ""),
            ("research", ""),
            ("team-a", ""),
        ]
        assert report_repo.queue_known(conn, "vision") and report_repo.pool_known(conn, "spot")
        assert not report_repo.queue_known(conn, "nope")
        assert not report_repo.pool_known(conn, "nope")
