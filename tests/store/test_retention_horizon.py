"""Retention keeps what fair shares and budgets still read, on PostgreSQL.

Rollup retention shorter than a pool's usage window, or than a budget's period, deleted buckets
and runs the recompute and `report.budget_status_at` read: decayed usage and budget consumption
changed with housekeeping. A pool's horizon is now the earliest of the configured age, its
window start and the period start of each budget on it, on an hour: what is older goes, nothing
younger. (Two pools with horizons of their own: `test_retention_per_pool.py`.)
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime

import pytest
from sqlalchemy import Connection, Engine, text

from gpufair.domain.model import Budget, BudgetPeriod, FairSharePolicy, WindowKind
from gpufair.domain.retention_horizon import READER_LAG_S, Horizon
from gpufair.store import report_repo, retention_horizons, rollup_repo
from gpufair.store.retention_repo import Retention, apply_retention
from tests.store.test_rollups import (
    HOUR,
    NOW,
    POLICIES,
    assert_close,
    install,
    make_config,
    snapshot,
    with_history,
)

DAY = 86400.0
WEEK_START = datetime(2025, 12, 29, tzinfo=UTC).timestamp()  # Monday before NOW (a Thursday)


@pytest.fixture
def conn(db: Engine) -> Iterator[Connection]:
    with db.connect() as connection:
        yield connection
        connection.rollback()


def _bucket_starts(conn: Connection) -> list[float]:
    return [
        float(r[0])
        for r in conn.execute(
            text(
                "SELECT DISTINCT extract(epoch FROM bucket_start)::float8 FROM fairness_hourly "
                "ORDER BY 1"
            )
        )
    ]


def test_rollups_a_pools_window_reads_stay(conn: Connection) -> None:
    """A 2-day window (6 h half-life), 3 days of runs, rollup retention of 1 day: the buckets
    and runs of the window's 2 days stay (50 hours from the hour the window started in an hour
    before, `READER_LAG_S`), decayed
    usage is what it was; only older buckets go."""
    config = with_history(conn, seed=5, runs=300)
    pool = config.pools[0]
    rollup_repo.rollup_pool(conn, config, pool, NOW)
    before = rollup_repo.decayed_usage(conn, config, pool, NOW)
    rows = snapshot(conn)
    horizon = math.floor((NOW - READER_LAG_S - 2 * DAY) / HOUR) * HOUR
    deleted = apply_retention(conn, NOW, Retention(rollups_days=1))
    kept = [r for r in rows if float(r[3]) >= horizon]
    assert deleted["fairness_hourly"] + deleted["usage_hourly"] == len(rows) - len(kept) > 0
    assert snapshot(conn) == kept
    assert _bucket_starts(conn)[0] == horizon
    assert rollup_repo.rollup_pool(conn, config, pool, NOW) == 0
    assert_close(rollup_repo.decayed_usage(conn, config, pool, NOW), before, rel=1e-12)
    assert_close(before, rollup_repo.exact_usage(conn, config, pool, NOW))


def test_rollups_a_budgets_period_reads_stay(conn: Connection) -> None:
    """A weekly budget of queue c: its period began on Monday, 3 d 20 min before NOW, longer
    ago than the 1-day window and the 1-day retention. Its consumption stays what it was."""
    config = with_history(conn, seed=5, runs=300)
    config = replace(
        config,
        pools=(replace(config.pools[0], policy=POLICIES["sliding-1d-no-decay"]),),
        budgets=(Budget("c", BudgetPeriod.WEEK, 5000.0, "p"),),
    )
    install(conn, config, NOW - 4 * DAY)
    rollup_repo.rollup_pool(conn, config, config.pools[0], NOW)
    at = datetime.fromtimestamp(NOW, UTC)
    (before,) = report_repo.budgets(conn, at)
    assert before.period_start.timestamp() == WEEK_START
    assert before.consumed_cu_hours > 100
    apply_retention(conn, NOW, Retention(rollups_days=1))
    (after,) = report_repo.budgets(conn, at)
    assert after.consumed_cu_hours == pytest.approx(before.consumed_cu_hours, rel=1e-12)
    assert _bucket_starts(conn)[0] == WEEK_START
    assert retention_horizons.pool_horizons(conn, NOW, 1) == {
        "p": Horizon(WEEK_START, ("the weekly budget of queue 'c': its period", "its usage window"))
    }


@pytest.mark.parametrize(
    ("policy", "kept_from", "held_by"),
    [
        # Configured 1 day: the pool reads its 2-day window, as of an hour before too.
        (
            POLICIES["sliding-2d-halflife-6h"],
            NOW - READER_LAG_S - 2 * DAY,
            ("its usage window",),
        ),
        # A 1-day window reads less than the 30 days configured: the configured age holds.
        (replace(POLICIES["sliding-1d-no-decay"]), NOW - 30 * DAY, ()),
        # Tumbling 1-day periods from 0 h UTC: the current period began 20 min before NOW, the
        # one an hour before NOW a day earlier, within the hour the configured day ends in.
        (POLICIES["tumbling-1d"], NOW - 1 * DAY, ()),
        # All history with a 1-day half-life: 53 half-lives back, what a double still sees.
        (
            POLICIES["all-history-halflife-1d"],
            NOW - READER_LAG_S - 53 * DAY,
            ("its usage window, all history, halved each 1 d (53 half-lives)",),
        ),
        # All history, no decay: everything counts, nothing goes.
        (
            FairSharePolicy(window_kind=WindowKind.NONE),
            -math.inf,
            ("its usage window, all history without decay",),
        ),
    ],
)
def test_the_horizon_of_each_window(
    conn: Connection, policy: FairSharePolicy, kept_from: float, held_by: tuple[str, ...]
) -> None:
    install(conn, make_config(policy), NOW - 4 * DAY)
    days = 30.0 if policy.window_kind == WindowKind.SLIDING and not policy.half_life_s else 1.0
    (got,) = retention_horizons.pool_horizons(conn, NOW, days).values()
    want = kept_from if math.isinf(kept_from) else math.floor(kept_from / HOUR) * HOUR
    assert (got.kept_from_s, got.held_by) == (want, held_by)


def test_the_held_horizon_is_logged_once(
    conn: Connection, caplog: pytest.LogCaptureFixture
) -> None:
    install(conn, make_config(POLICIES["sliding-2d-halflife-6h"]), NOW - 4 * DAY)
    retention_horizons.forget_warnings()
    with caplog.at_level(logging.WARNING, logger="gpufair.store.retention_horizons"):
        for at in (NOW, NOW + DAY, NOW + 2 * DAY):
            apply_retention(conn, at, Retention(rollups_days=1))
    assert [r.getMessage() for r in caplog.records] == [
        "retention: pool 'p' keeps its rollups, runs and capacity history from "
        "2025-12-29 23:00 UTC, not 1 d as --rollup-retention-days says: its usage window still "
        "reads them"
    ]


def test_a_window_stored_beyond_the_limits_holds_what_the_recompute_reads(
    conn: Connection,
) -> None:
    """A window of 1e308 s, stored by a version before the input limits: the recompute and the
    rollups read it as the longest window allowed (10 years, `stored_limits`), and so does
    retention now. It took it as stored, a horizon of -1e308 s: no timestamp holds it, and each
    run failed (OverflowError) before it deleted anything."""
    with_history(conn, seed=5, runs=20)
    conn.execute(text("UPDATE node_pools SET window_s = 1e308"))
    deleted = apply_retention(conn, NOW, Retention(rollups_days=1))
    assert deleted["intervals"] == 0
    longest = 10 * 366 * DAY
    assert retention_horizons.pool_horizons(conn, NOW, 1)["p"] == Horizon(
        math.floor((NOW - READER_LAG_S - longest) / HOUR) * HOUR, ("its usage window",)
    )
