"""A periodic run that fails is retried within its period, on the same claim (jobs/runner.py,
store/claims_repo.py): at most `JobSettings.attempts` runs, each retry after a backoff; a job
whose every attempt failed stays failed for the metrics and the alert."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime

import pytest
from prometheus_client import REGISTRY, CollectorRegistry
from sqlalchemy import Engine, text

from gpufair.api.state_metrics import StateCollector
from gpufair.client import GpufairClient
from gpufair.config_file import load_config_file
from gpufair.jobs.runner import JobSettings, PeriodicJobs
from gpufair.store import claims_repo as claims
from tests.jobs.test_periodic_jobs import EXAMPLE

SWEEP = {"periodic_job": "sweep"}


class FlakySweep(PeriodicJobs):
    """The sweep fails its first `failures` runs (a database error, a bug fixed by a deploy)."""

    def __init__(self, *args: object, failures: int, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.failures = failures

    def _sweep(self, now_s: float) -> str:
        if self.failures > 0:
            self.failures -= 1
            raise RuntimeError("the sweep broke")
        return super()._sweep(now_s)


def _sweep_claims(db: Engine) -> list[tuple[str, str | None, bool]]:
    with db.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT claimed_by, outcome, finished_at IS NOT NULL AS finished "
                "FROM job_claims WHERE job = 'sweep' ORDER BY period_start"
            )
        ).all()
    return [(r.claimed_by, r.outcome, r.finished) for r in rows]


def _gauges(db: Engine) -> tuple[float | None, float | None]:
    registry = CollectorRegistry()
    registry.register(StateCollector(db, cache_s=0.0))
    return (
        registry.get_sample_value("gpufair_periodic_job_last_failed", SWEEP),
        registry.get_sample_value("gpufair_periodic_job_last_success_timestamp_seconds", SWEEP),
    )


def _failures() -> float:
    return REGISTRY.get_sample_value("gpufair_periodic_job_failures_total", SWEEP) or 0.0


@pytest.fixture
def cluster(client: GpufairClient) -> GpufairClient:
    client.apply_config(load_config_file(EXAMPLE))
    return client


def test_a_failed_run_is_retried_within_its_period(cluster: GpufairClient, db: Engine) -> None:
    now = time.time()
    settings = JobSettings(retry_backoff_s=0.0)
    failures_before = _failures()
    PeriodicJobs(db, settings, clock=lambda: now - 60, replica="a").tick()  # a minute ago: ok
    later = now
    b = FlakySweep(db, settings, clock=lambda: later, replica="b", failures=1)
    b.tick()
    assert _sweep_claims(db)[1] == (
        "b",
        "failed (attempt 1 of 3): RuntimeError: the sweep broke",
        True,
    )
    assert _gauges(db)[0] == 1.0
    # Another replica's tick in the same period takes the failed claim again and succeeds.
    c = PeriodicJobs(db, settings, clock=lambda: later, replica="c")
    c.tick()
    assert _sweep_claims(db)[1] == ("c", "ok: 0 stale runs closed, 0 reopened (attempt 2)", True)
    failed, succeeded_at = _gauges(db)
    assert failed == 0.0
    assert succeeded_at == pytest.approx(time.time(), abs=60)
    assert _failures() == failures_before + 1
    c.tick()  # done for the period: nothing runs again
    assert len(_sweep_claims(db)) == 2 and _sweep_claims(db)[1][0] == "c"


def test_a_run_that_keeps_failing_stops_at_its_attempts_and_stays_failed(
    cluster: GpufairClient, db: Engine
) -> None:
    now = time.time()
    failures_before = _failures()
    jobs = FlakySweep(
        db, JobSettings(retry_backoff_s=0.0), clock=lambda: now, replica="a", failures=10
    )
    for _ in range(5):
        jobs.tick()
    (claim,) = _sweep_claims(db)
    assert claim == ("a", "failed (attempt 3 of 3): RuntimeError: the sweep broke", True)
    assert jobs.failures == 7  # three runs, no more
    assert _gauges(db) == (1.0, None)
    assert _failures() == failures_before + 3


def test_a_retry_waits_for_its_backoff(cluster: GpufairClient, db: Engine) -> None:
    now = time.time()
    jobs = FlakySweep(
        db, JobSettings(retry_backoff_s=3600.0), clock=lambda: now, replica="a", failures=1
    )
    jobs.tick()
    jobs.tick()  # within the backoff: no retry
    (claim,) = _sweep_claims(db)
    assert claim[1] == "failed (attempt 1 of 3): RuntimeError: the sweep broke"
    assert jobs.failures == 0
    # An hour later by the database's clock (the failure's finish moved back), it is retried.
    with db.begin() as conn:
        conn.execute(
            text(
                "UPDATE job_claims SET finished_at = finished_at - interval '3601 s' "
                "WHERE job = 'sweep'"
            )
        )
    jobs.tick()
    assert _sweep_claims(db)[0][1] == "ok: 0 stale runs closed, 0 reopened (attempt 2)"


def _failed_claim(db: Engine) -> float:
    """The sweep's current period, claimed by replica a and failed on its first attempt."""
    start_s = claims.period_start(time.time(), 60)
    with db.connect() as conn:
        assert claims.take_period(conn, "sweep", start_s, "a", attempts=3).attempt == 1
        claims.finish(conn, "sweep", start_s, claims.failed_outcome(1, 3, "RuntimeError: broke"))
        claims.release_period(conn, "sweep", start_s)
    return start_s


def _claim_row(db: Engine) -> tuple[str, str | None, bool]:
    with db.connect() as conn:
        row = conn.execute(
            text("SELECT claimed_by, outcome, finished_at IS NULL AS running FROM job_claims")
        ).one()
    return row.claimed_by, row.outcome, row.running


def test_replicas_retrying_together_take_the_claim_once(db: Engine) -> None:
    start_s = _failed_claim(db)
    won: dict[str, int | None] = {}
    barrier = threading.Barrier(4)

    def retry(replica: str) -> None:
        with db.connect() as conn:
            barrier.wait()
            taken = claims.take_period(conn, "sweep", start_s, replica, attempts=3)
            won[replica] = taken.attempt
            barrier.wait()  # the winner holds the period's lock until every replica tried
            if taken.attempt is not None:
                claims.release_period(conn, "sweep", start_s)

    threads = [threading.Thread(target=retry, args=(f"r{i}",)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert sorted(won.values(), key=lambda w: w or 0) == [None, None, None, 2]
    (winner,) = [r for r, attempt in won.items() if attempt == 2]
    # The retry runs: claimed anew by the winner, the failure kept in the outcome meanwhile.
    assert _claim_row(db) == (winner, "failed (attempt 1 of 3): RuntimeError: broke", True)


def test_the_take_statement_alone_retakes_a_failed_claim_once(db: Engine) -> None:
    """The row lock of the conflicting insert, without the period's lock: `take_period`
    releases that lock before its commit, so a replica taking it then runs the statement
    while the first one's transaction still holds the row. Four transactions run it at once: one
    takes the claim (attempt 2); the others wait for its row lock, then see the claim
    unfinished and get nothing."""
    start_s = _failed_claim(db)
    params = {
        "job": "sweep",
        "start": datetime.fromtimestamp(start_s, UTC),
        "attempts": 3,
        "backoff": 0.0,
        "factor": claims.BACKOFF_FACTOR,
        "holder_gone": False,
    }
    won: dict[str, int | None] = {}
    barrier = threading.Barrier(4)

    def retry(replica: str) -> None:
        with db.connect() as conn:
            conn.execute(text("SET LOCAL lock_timeout = '20s'"))
            barrier.wait()
            row = conn.execute(claims._TAKE_SQL, {**params, "replica": replica}).one_or_none()
            won[replica] = None if row is None else int(row.attempt)
            conn.commit()

    threads = [threading.Thread(target=retry, args=(f"r{i}",)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert sorted(won.values(), key=lambda w: w or 0) == [None, None, None, 2]
    (winner,) = [r for r, attempt in won.items() if attempt == 2]
    assert _claim_row(db) == (winner, "failed (attempt 1 of 3): RuntimeError: broke", True)
