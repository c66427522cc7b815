"""Retention keeps each periodic job's latest success, however old (store/retention_repo.py):
the overdue alert reads the time since it. Pruned with the other claims after 30 days, a job
that had not succeeded since then lost its last success and, with it, the overdue alert."""

from __future__ import annotations

import time

import pytest
from prometheus_client import CollectorRegistry
from sqlalchemy import Engine, text

from gpufair.api.state_metrics import StateCollector
from gpufair.client import GpufairClient
from gpufair.config_file import load_config_file
from gpufair.store.retention_repo import Retention, apply_retention
from tests.jobs.test_periodic_jobs import EXAMPLE

DAY = 86400.0
ROLLUP = {"periodic_job": "rollup"}


def _claim(conn: object, at_s: float, outcome: str | None) -> None:
    conn.execute(  # type: ignore[attr-defined]
        text(
            "INSERT INTO job_claims (job, period_start, claimed_by, claimed_at, finished_at, "
            "outcome) VALUES ('rollup', to_timestamp(:at), 'a', to_timestamp(:at), "
            "CASE WHEN CAST(:outcome AS text) IS NULL THEN NULL "
            "ELSE to_timestamp(:at + 5) END, :outcome)"
        ),
        {"at": at_s, "outcome": outcome},
    )


def test_a_job_not_successful_for_40_days_keeps_its_last_success(
    client: GpufairClient, db: Engine
) -> None:
    client.apply_config(load_config_file(EXAMPLE))
    now = time.time()
    with db.begin() as conn:
        _claim(conn, now - 45 * DAY, "ok: 10 buckets")
        _claim(conn, now - 40 * DAY, "ok: 12 buckets")  # the latest success
        _claim(conn, now - 35 * DAY, "failed (attempt 3 of 3): OperationalError: disk full")
        for days in (31, 20, 2):  # runs lost with the replicas that ran them
            _claim(conn, now - days * DAY, None)
    with db.connect() as conn:
        deleted = apply_retention(conn, now, Retention())
        conn.commit()
    assert deleted["claims"] == 3  # 45 days (an older success), 35 and 31 days
    with db.connect() as conn:
        kept = conn.execute(
            text(
                "SELECT round((:now - extract(epoch FROM period_start)) / 86400) AS days, outcome "
                "FROM job_claims WHERE job = 'rollup' ORDER BY period_start"
            ),
            {"now": now},
        ).all()
    assert [(int(r.days), r.outcome) for r in kept] == [
        (40, "ok: 12 buckets"),
        (20, None),
        (2, None),
    ]
    registry = CollectorRegistry()
    registry.register(StateCollector(db, cache_s=0.0))
    success = "gpufair_periodic_job_last_success_timestamp_seconds"
    # 40 days without a success: the overdue alert's expression has its reference.
    assert registry.get_sample_value(success, ROLLUP) == pytest.approx(now - 40 * DAY + 5)
