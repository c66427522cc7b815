"""report.pool_utilisation_daily in a session whose time zone changes its clocks: the days are
UTC days whatever the session's TimeZone, as the README promises for every report view."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
from report_support import add_usage
from sqlalchemy import Engine, text

# New York moves to summer time on Sunday 2026-03-08 at 07:00 UTC.
SATURDAY = datetime(2026, 3, 7, tzinfo=UTC)
DAY = timedelta(days=1)


@pytest.mark.parametrize("zone", ["America/New_York", "Europe/Berlin", "UTC"])
def test_days_are_utc_days_across_a_clock_change(db: Engine, zone: str) -> None:
    with db.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO pool_capacity_changes (pool, changed_at, capacity_cu, "
                "capacity_gpus_by_type, source) VALUES ('main', :at, 100, "
                "CAST(:types AS jsonb), 'config')"
            ),
            {"at": SATURDAY, "types": json.dumps({"a100": 10})},
        )
        for day in range(3):  # 4 GPUs for the hour from 12:00 UTC, Saturday to Monday
            add_usage(
                conn,
                queue="team-a",
                bucket_start=SATURDAY + day * DAY + timedelta(hours=12),
                gpus=4,
                cu_per_gpu=10,
                gpu_type="a100",
            )
    with db.connect() as conn:
        conn.execute(text(f"SET TIME ZONE '{zone}'"))
        rows = conn.execute(
            text(
                "SELECT day, capacity_gpu_hours, used_gpu_hours, utilisation "
                "FROM report.pool_utilisation_daily WHERE day < :until ORDER BY day"
            ),
            {"until": SATURDAY + 3 * DAY},
        ).fetchall()
        conn.rollback()
    # 10 GPUs all day long: 240 GPU-hours a day, 4 of them used, each day from UTC midnight.
    assert [tuple(r) for r in rows] == [
        (SATURDAY, 240, 4, 4 / 240),
        (SATURDAY + DAY, 240, 4, 4 / 240),
        (SATURDAY + 2 * DAY, 240, 4, 4 / 240),
    ]
