"""A slow periodic job holds back no other (jobs/runner.py: each job on a lane of its own), and a
recompute waiting for another process's rollup of its pool waits, which is no failure.

The waits are forced with locks the test holds: a row lock on an old claim that retention
deletes (retention waits on it), and a pool's rollup lock (`locks.rollup_key`)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from lock_waits import until, waiting_on_locks
from prometheus_client import REGISTRY, CollectorRegistry
from sqlalchemy import Engine, event, text

from gpufair.api.state_metrics import StateCollector
from gpufair.client import GpufairClient
from gpufair.config_file import load_config_file
from gpufair.jobs.runner import JobSettings, PeriodicJobs
from gpufair.store import locks
from gpufair.store.database import make_engine
from tests.jobs.test_periodic_jobs import EXAMPLE

RECOMPUTE = {"periodic_job": "recompute:default"}


def _engine(url: str, lock_timeout_ms: int) -> Engine:
    """An engine as `gpufair serve` makes it, with its lock timeout (10 s) set to
    `lock_timeout_ms` and its statement timeout to a minute, so the test's waits are short or
    long as it needs."""
    engine = make_engine(url, pool_size=6)

    @event.listens_for(engine, "connect")
    def _timeouts(dbapi_conn: Any, _record: Any) -> None:
        with dbapi_conn.cursor() as cur:
            cur.execute(f"SET lock_timeout = {lock_timeout_ms}")
            cur.execute("SET statement_timeout = 60000")
        dbapi_conn.commit()

    return engine


@pytest.fixture
def jobs_engine(database_url: str, client: GpufairClient, db: Engine) -> Iterator[Engine]:
    config = load_config_file(EXAMPLE)
    config.pools[0].policy.recompute_interval_s = 1
    client.apply_config(config)
    engine = _engine(database_url, 60_000)
    yield engine
    engine.dispose()


def _outcomes(db: Engine, job: str) -> list[str | None]:
    with db.connect() as conn:
        return list(
            conn.execute(
                text("SELECT outcome FROM job_claims WHERE job = :job ORDER BY period_start"),
                {"job": job},
            ).scalars()
        )


def test_recomputes_go_on_while_retention_waits(jobs_engine: Engine, db: Engine) -> None:
    # An old claim retention deletes (claims are kept 30 days), row-locked here: retention
    # waits on it, as it would on a long delete.
    with db.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO job_claims (job, period_start, claimed_by, finished_at, outcome) "
                "VALUES ('gone', now() - interval '40 days', 'x', now() - interval '40 days', "
                "'failed: old')"
            )
        )
    jobs = PeriodicJobs(jobs_engine, JobSettings(tick_s=0.2), replica="a")
    with db.connect() as holder:
        holder.execute(text("SELECT 1 FROM job_claims WHERE job = 'gone' FOR UPDATE"))
        jobs.start()
        try:
            until(
                lambda: waiting_on_locks(db, "tuple") + waiting_on_locks(db, "transactionid") > 0,
                "retention never waited for the held claim",
            )
            assert _outcomes(db, "retention") == [None]  # claimed, running
            first = len(_outcomes(db, "recompute:default"))
            # While retention waits, the pool's recompute (every second) keeps running.
            until(
                lambda: len([o for o in _outcomes(db, "recompute:default") if o]) >= first + 2,
                "no recompute finished while retention waited",
            )
            assert _outcomes(db, "retention") == [None]  # still waiting
            assert all(o.startswith("ok: run ") for o in _outcomes(db, "recompute:default") if o)
            assert _outcomes(db, "sweep")[0] is not None  # the sweep did not wait either
        finally:
            holder.rollback()
            assert jobs.stop(30) is True
    assert _outcomes(db, "retention")[0].startswith("ok")  # type: ignore[union-attr]


def test_a_recompute_waiting_for_another_rollup_past_the_lock_timeout_is_no_failure(
    database_url: str, client: GpufairClient, db: Engine
) -> None:
    client.apply_config(load_config_file(EXAMPLE))
    engine = _engine(database_url, 1_000)  # the engine's 10 s, shortened
    failures_before = REGISTRY.get_sample_value("gpufair_periodic_job_failures_total", RECOMPUTE)
    try:
        jobs = PeriodicJobs(engine, JobSettings(), replica="a")
        with db.connect() as holder:  # another process rewriting the pool's rollups
            locks.xact_lock(holder, locks.rollup_key("default"))
            ticking = threading.Thread(target=jobs.tick, daemon=True)
            ticking.start()
            until(lambda: waiting_on_locks(db, "advisory") > 0, "the recompute never waited")
            time.sleep(2.0)  # twice the lock timeout
            assert _outcomes(db, "recompute:default") == [None]  # still waiting, not failed
            holder.rollback()
        ticking.join(timeout=60)
        assert not ticking.is_alive()
        (outcome,) = _outcomes(db, "recompute:default")
        assert outcome is not None and outcome.startswith("ok: run ")
        assert "s for the pool's rollups)" in outcome
        waited_s = float(outcome.split("(waited ")[1].split(" s")[0])
        assert waited_s >= 2.0
        registry = CollectorRegistry()
        registry.register(StateCollector(db, cache_s=0.0))
        assert registry.get_sample_value("gpufair_periodic_job_last_failed", RECOMPUTE) == 0.0
        failures = REGISTRY.get_sample_value("gpufair_periodic_job_failures_total", RECOMPUTE)
        assert (failures or 0.0) == (failures_before or 0.0)
    finally:
        engine.dispose()


def test_a_recompute_waiting_past_its_bound_is_deferred_not_failed(
    database_url: str, client: GpufairClient, db: Engine
) -> None:
    client.apply_config(load_config_file(EXAMPLE))
    engine = _engine(database_url, 10_000)
    failures_before = REGISTRY.get_sample_value("gpufair_periodic_job_failures_total", RECOMPUTE)
    try:
        jobs = PeriodicJobs(engine, JobSettings(rollup_wait_s=1.0), replica="a")
        with db.connect() as holder:
            locks.xact_lock(holder, locks.rollup_key("default"))
            ticking = threading.Thread(target=jobs.tick, daemon=True)
            ticking.start()
            # The recompute waits its second, then gives up (the rollup job waits on too).
            until(lambda: any(_outcomes(db, "recompute:default")), "no recompute outcome")
            holder.rollback()
        ticking.join(timeout=60)
        (outcome,) = _outcomes(db, "recompute:default")
        assert outcome == (
            "deferred: the rollup lock of pool 'default' stayed held by another process for 1 s"
        )
        registry = CollectorRegistry()
        registry.register(StateCollector(db, cache_s=0.0))
        # Neither failed nor a success: the overdue alert sees a pool that is never recomputed.
        assert registry.get_sample_value("gpufair_periodic_job_last_failed", RECOMPUTE) is None
        success = "gpufair_periodic_job_last_success_timestamp_seconds"
        assert registry.get_sample_value(success, RECOMPUTE) is None
        failures = REGISTRY.get_sample_value("gpufair_periodic_job_failures_total", RECOMPUTE)
        assert (failures or 0.0) == (failures_before or 0.0)
    finally:
        engine.dispose()
