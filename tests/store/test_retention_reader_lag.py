"""Retention against a reader acting at an earlier instant than its own, on PostgreSQL.

Retention runs just after UTC midnight (its period is a day), which is where budget periods and
tumbling windows anchored at midnight begin. A recompute or a budget report acting a little
before that instant (a replica whose clock is behind, a recompute whose tick began just before,
a report's transaction opened before midnight) still reads the period that just ended; a period
longer than the rollup retention is then held only up to the boundary, and retention at the
boundary's other side deleted most of it: that reader counted only the last days of its period.
The next reader, after the boundary, reads the new period and is exact again. Each pool's
horizon is now what its window and its budgets read at any instant in the hour before
retention's `now` (`domain.retention_horizon.READER_LAG_S`).

Pool `late` of `test_rollup_behind_horizon.py`'s cluster: a 2-hour run of 4 A100 starting each
of the 30 days before BEHIND, rolled up at BEHIND; retention of 3 days at AHEAD. The readers
act at BEHIND, one minute before 2026-01-01 00:00 UTC (a Thursday, the start of a month and of
a 7-day tumbling period from the Unix epoch), retention at AHEAD, one minute after.
"""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from sqlalchemy import Connection, Engine, text

from gpufair.domain.model import Budget, BudgetPeriod, FairSharePolicy, WindowKind
from gpufair.store import report_repo, rollup_repo
from gpufair.store.retention_repo import Retention, apply_retention
from tests.store.test_retention_per_pool import DECAYING, cluster, history
from tests.store.test_rollups import assert_close

DAY = 86400.0
BOUNDARY = 1_767_225_600.0  # 2026-01-01 00:00 UTC
BEHIND = BOUNDARY - 60
AHEAD = BOUNDARY + 60
KEPT = Retention(rollups_days=3)
WEEKLY = FairSharePolicy(
    window_kind=WindowKind.TUMBLING, window_s=7 * DAY, window_anchor_unix_s=0, half_life_s=DAY
)


def _recorded(conn: Connection) -> float:
    """The horizon retention recorded for the pool."""
    return float(
        conn.execute(
            text(
                "SELECT extract(epoch FROM kept_from)::float8 FROM retention_horizons "
                "WHERE pool = 'late'"
            )
        ).scalar_one()
    )


def _retention_ahead(db: Engine) -> dict[str, int]:
    with db.connect() as conn:
        deleted = apply_retention(conn, AHEAD, KEPT)
        conn.commit()
    return deleted


def test_a_recompute_just_before_a_tumbling_boundary_reads_what_retention_after_it_keeps(
    db: Engine,
) -> None:
    """A 7-day tumbling window: at BEHIND the recompute reads the 7 days from Dec 25 00:00 UTC,
    longer than the 3 days kept. Retention at AHEAD was held only by the new period (from
    BOUNDARY) and kept from BOUNDARY - 3 d: it deleted the runs of days 4 to 7 that the
    recompute at BEHIND reads, and their buckets, and that recompute's decayed usage lost them
    (queue a's 0.76 of what it was, b's 0.94). Now retention reads the window as it was an hour
    earlier too, keeps from Dec 25 00:00, and the recompute at BEHIND reads what it read before
    retention."""
    config = cluster({"late": WEEKLY})
    pool = config.pools[0]
    with db.begin() as conn:
        history(conn, config, BEHIND)
        before = rollup_repo.decayed_usage(conn, config, pool, BEHIND)
        assert_close(before, rollup_repo.exact_usage(conn, config, pool, BEHIND), rel=1e-9)
    _retention_ahead(db)
    with db.begin() as conn:  # a replica whose clock is two minutes behind
        assert rollup_repo.rollup_pool(conn, config, pool, BEHIND) == 0
        after = rollup_repo.decayed_usage(conn, config, pool, BEHIND)
        assert_close(after, before, rel=1e-12)
        assert _recorded(conn) == BOUNDARY - 7 * DAY
    with db.begin() as conn:  # and the recompute after the boundary reads its new period
        rollup_repo.rollup_pool(conn, config, pool, AHEAD)
        assert_close(
            rollup_repo.decayed_usage(conn, config, pool, AHEAD),
            rollup_repo.exact_usage(conn, config, pool, AHEAD),
            rel=1e-9,
        )


def test_a_budget_report_just_before_the_month_ends_reads_what_retention_after_it_keeps(
    db: Engine,
) -> None:
    """A monthly budget of queue a on the pool (7-day sliding window): a report acting at
    BEHIND reads December from Dec 1. Retention at AHEAD was held by the window to Dec 25 and
    by January's budget period not at all: it deleted the runs of days 8 to 30 and their
    buckets, and the report at BEHIND showed 240 CU-hours of December's 1200. Now retention
    reads the budget's period as it was an hour earlier too and keeps from Dec 1."""
    budget = Budget("a", BudgetPeriod.MONTH, 10_000.0, "late")
    config = cluster({"late": DECAYING}, budget)
    at = datetime.fromtimestamp(BEHIND, UTC)
    with db.begin() as conn:
        history(conn, config, BEHIND)
        (before,) = report_repo.budgets(conn, at)
        assert before.period_start.timestamp() == BOUNDARY - 31 * DAY
    _retention_ahead(db)
    with db.begin() as conn:
        (after,) = report_repo.budgets(conn, at)
        assert after.consumed_cu_hours == pytest.approx(before.consumed_cu_hours, rel=1e-12)
        assert _recorded(conn) == BOUNDARY - 31 * DAY
