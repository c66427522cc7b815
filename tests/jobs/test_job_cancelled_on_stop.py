"""A periodic job cancelled because its server stops has not failed: `gpufair serve` cancels the
statement of a job still running past the grace period (`PeriodicJobs.stop`), and the next run
does the work. The job's failure gauge, read by the GpufairPeriodicJobFailing alert, keeps what
the latest run that ended on its own said; the failures counter counts none."""

from __future__ import annotations

import threading
import time

from prometheus_client import REGISTRY, CollectorRegistry
from sqlalchemy import Engine, text

from gpufair.api.state_metrics import StateCollector
from gpufair.client import GpufairClient
from gpufair.config_file import load_config_file
from gpufair.jobs.runner import JobSettings, PeriodicJobs
from gpufair.store import locks
from tests.jobs.test_periodic_jobs import EXAMPLE

JOB = {"periodic_job": "recompute:default"}


def _waiting_on_an_advisory_lock(db: Engine) -> bool:
    with db.connect() as conn:
        return bool(
            conn.execute(
                text(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                    "AND wait_event_type = 'Lock' AND wait_event = 'advisory'"
                )
            ).scalar_one()
        )


def test_a_job_cancelled_by_a_stopping_server_is_not_a_failure(
    client: GpufairClient, db: Engine
) -> None:
    client.apply_config(load_config_file(EXAMPLE))  # recompute every 60 s
    now = time.time()
    failures_before = REGISTRY.get_sample_value("gpufair_periodic_job_failures_total", JOB) or 0.0
    # Two minutes ago, a run that succeeded.
    PeriodicJobs(db, JobSettings(), clock=lambda: now - 120, replica="a").tick()
    registry = CollectorRegistry()
    registry.register(StateCollector(db, cache_s=0.0))
    succeeded_at = registry.get_sample_value(
        "gpufair_periodic_job_last_success_timestamp_seconds", JOB
    )
    assert succeeded_at is not None
    assert registry.get_sample_value("gpufair_periodic_job_last_failed", JOB) == 0.0
    took_s = registry.get_sample_value("gpufair_periodic_job_last_duration_seconds", JOB)

    # Now the recompute waits for the pool's rollup lock, held here, and the server stops.
    jobs = PeriodicJobs(db, JobSettings(), clock=lambda: now, replica="b")
    with db.connect() as holder:
        locks.xact_lock(holder, locks.rollup_key("default"))
        ticking = threading.Thread(target=jobs.tick, daemon=True)
        ticking.start()
        for _ in range(500):
            if _waiting_on_an_advisory_lock(db):
                break
            time.sleep(0.02)
        else:
            raise AssertionError("the recompute never waited for the lock")
        assert jobs.stop(0.2) is True  # cancelled, rolled back, its outcome recorded
        holder.rollback()
    ticking.join(timeout=30)
    with db.connect() as conn:
        outcomes = conn.execute(
            text(
                "SELECT claimed_by, outcome FROM job_claims WHERE job = :job ORDER BY period_start"
            ),
            {"job": JOB["periodic_job"]},
        ).all()
    assert [tuple(r) for r in outcomes][1] == ("b", "cancelled: the server stopped")
    assert outcomes[0][1].startswith("ok: run ")
    with db.connect() as conn:
        claimed = conn.execute(
            text("SELECT job, outcome FROM job_claims WHERE claimed_by = 'b' ORDER BY job")
        ).all()
    # The other jobs of the tick ran on their own lanes beside the waiting recompute (the
    # sweep's period, a minute, is a new one since the first tick's) and finished on their own:
    # none was started after the cancellation and cut short with its period claimed.
    others = {r.job: r.outcome for r in claimed if r.job != JOB["periodic_job"]}
    assert "sweep" in others
    assert all(outcome.startswith("ok") for outcome in others.values()), others
    jobs.tick()  # stopped: starts nothing
    with db.connect() as conn:
        assert conn.execute(
            text("SELECT count(*) FROM job_claims WHERE claimed_by = 'b'")
        ).scalar_one() == len(claimed)

    assert registry.get_sample_value("gpufair_periodic_job_last_failed", JOB) == 0.0
    assert (
        registry.get_sample_value("gpufair_periodic_job_last_success_timestamp_seconds", JOB)
        == succeeded_at
    )
    assert registry.get_sample_value("gpufair_periodic_job_last_duration_seconds", JOB) == took_s
    failures = REGISTRY.get_sample_value("gpufair_periodic_job_failures_total", JOB) or 0.0
    assert failures == failures_before
