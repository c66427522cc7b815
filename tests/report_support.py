"""A hand-computed reporting scenario, written straight into the tables, and a real gRPC server
whose Ledger.GetUsage runs api/usage.get_usage.

The week of Monday 2026-03-02 (UTC). Queue tree: research -> team-a, research -> vision ->
vision-train, and ops on its own. Hourly rollups:

| day (UTC) | hours        | pool | queue        | type    | GPUs | CU/GPU | over-quota CU |
|-----------|--------------|------|--------------|---------|------|--------|---------------|
| Mon 03-02 | 09, 10, 11   | main | team-a       | a100    | 10   | 10     | 0             |
| Mon 03-02 | 12           | main | vision-train | v100    | 5    | 4      | 0             |
| Mon 03-02 | 09           | main | ops          | a100    | 1    | 10     | 0             |
| Tue 03-03 | 09, 10       | main | team-a       | a100    | 10   | 10     | 40            |
| Tue 03-03 | 12           | spot | vision-train | rtx4090 | 10   | 2      | 0             |

So team-a: 50 GPU-hours, 500 CU-hours (300 on Monday, 200 on Tuesday), 80 over-quota CU-hours;
vision-train: 20 CU-hours in main and 20 in spot; ops: 10 CU-hours.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

from sqlalchemy import Connection, Engine, text

from gpufair.api.server import build_server

WEEK = datetime(2026, 3, 2, tzinfo=UTC)  # a Monday
MONTH = datetime(2026, 3, 1, tzinfo=UTC)
DAY = timedelta(days=1)
HOUR = timedelta(hours=1)
# Wednesday 12:00, two and a half days into the week: the instant budgets are computed at.
PINNED = WEEK + 2.5 * DAY

QUEUES = [
    ("research", None),
    ("team-a", "research"),
    ("vision", "research"),
    ("vision-train", "vision"),
    ("ops", None),
]


def add_usage(
    conn: Connection,
    *,
    queue: str,
    bucket_start: datetime,
    gpus: float,
    cu_per_gpu: float,
    gpu_type: str,
    pool: str = "main",
    over_quota_cu: float = 0.0,
) -> None:
    """One hourly rollup row: `gpus` GPUs held for the whole hour."""
    conn.execute(
        text(
            "INSERT INTO usage_hourly (pool, queue, gpu_type, bucket_start, gpu_seconds, "
            "cu_seconds, over_quota_cu_seconds) VALUES (:pool, :queue, :type, :at, :g, :cu, :oq)"
        ),
        {
            "pool": pool,
            "queue": queue,
            "type": gpu_type,
            "at": bucket_start,
            "g": gpus * 3600,
            "cu": gpus * cu_per_gpu * 3600,
            "oq": over_quota_cu * 3600,
        },
    )


def add_queues(conn: Connection) -> None:
    for name, parent in QUEUES:
        conn.execute(
            text("INSERT INTO queues (name, parent) VALUES (:n, :p)"), {"n": name, "p": parent}
        )


def add_budget(conn: Connection, queue: str, period: str, cu_hours: float, pool: str = "") -> None:
    conn.execute(
        text("INSERT INTO budgets (queue, period, pool, cu_hours) VALUES (:q, :per, :pool, :cu)"),
        {"q": queue, "per": period, "pool": pool, "cu": cu_hours},
    )


def add_scenario(conn: Connection) -> None:
    """The queues and rollups of the table in this module's docstring (no budgets)."""
    add_queues(conn)
    mon, tue = WEEK, WEEK + DAY
    for h in (9, 10, 11):
        add_usage(
            conn,
            queue="team-a",
            bucket_start=mon + h * HOUR,
            gpus=10,
            cu_per_gpu=10,
            gpu_type="a100",
        )
    for h in (9, 10):
        add_usage(
            conn,
            queue="team-a",
            bucket_start=tue + h * HOUR,
            gpus=10,
            cu_per_gpu=10,
            gpu_type="a100",
            over_quota_cu=40,
        )
    add_usage(
        conn,
        queue="vision-train",
        bucket_start=mon + 12 * HOUR,
        gpus=5,
        cu_per_gpu=4,
        gpu_type="v100",
    )
    add_usage(
        conn,
        queue="vision-train",
        bucket_start=tue + 12 * HOUR,
        gpus=10,
        cu_per_gpu=2,
        gpu_type="rtx4090",
        pool="spot",
    )
    add_usage(
        conn, queue="ops", bucket_start=mon + 9 * HOUR, gpus=1, cu_per_gpu=10, gpu_type="a100"
    )


@contextlib.contextmanager
def usage_server(engine: Engine, now: datetime = PINNED) -> Iterator[str]:
    """The service's gRPC server on a free port, its clock pinned to `now`; yields its address."""
    running = build_server(engine, "127.0.0.1:0", max_workers=2, clock=now.timestamp)
    try:
        yield f"127.0.0.1:{running.port}"
    finally:
        running.stop(0.5)
