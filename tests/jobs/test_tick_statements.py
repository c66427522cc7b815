"""What a tick of the periodic jobs sends to the database (jobs/runner.py, `claims.due_jobs`): with
nothing due, one statement reads every job's period, whatever the number of jobs, and no
period's lock is taken; a job with something due (a retry whose backoff passed) takes its own
period's lock, and no other job's."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import Engine, event

from gpufair.client import GpufairClient
from gpufair.config_file import load_config_file
from gpufair.jobs.runner import JobSettings, PeriodicJobs
from gpufair.store.database import make_engine
from tests.jobs.test_job_retries import FlakySweep, _sweep_claims
from tests.jobs.test_periodic_jobs import EXAMPLE

LOCK = "pg_try_advisory_lock"


class Statements:
    """The statements an engine sends, as SQL text."""

    def __init__(self, engine: Engine) -> None:
        self.sent: list[str] = []
        event.listen(engine, "before_cursor_execute", self._sent)

    def _sent(self, _conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        self.sent.append(statement)

    def during(self, action: Any) -> list[str]:
        self.sent.clear()
        action()
        return list(self.sent)


@pytest.fixture
def jobs_engine(database_url: str, client: GpufairClient) -> Iterator[Engine]:
    client.apply_config(load_config_file(EXAMPLE))
    engine = make_engine(database_url, pool_size=6)
    yield engine
    engine.dispose()


def _add_pools(client: GpufairClient, count: int) -> None:
    config = load_config_file(EXAMPLE)
    for i in range(count):
        config.pools.add().CopyFrom(config.pools[0])
        config.pools[-1].name = f"extra-{i}"
    client.apply_config(config)


def test_a_tick_with_nothing_due_reads_every_period_in_one_statement(
    jobs_engine: Engine, client: GpufairClient
) -> None:
    now = time.time()
    jobs = PeriodicJobs(jobs_engine, JobSettings(), clock=lambda: now, replica="a")
    statements = Statements(jobs_engine)
    first = statements.during(jobs.tick)  # one pool: 4 jobs, each period claimed and run
    assert sum(LOCK in s for s in first) == 4
    idle = statements.during(jobs.tick)
    assert not [s for s in idle if LOCK in s or "INSERT" in s]
    assert sum("job_claims" in s for s in idle) == 1
    # Three pools more: 7 jobs, the same statements for a tick with nothing due (before, four
    # per job: 23 statements with 4 jobs, 35 with 7).
    _add_pools(client, 3)
    assert sum(LOCK in s for s in statements.during(jobs.tick)) == 3  # the new pools' recomputes
    assert statements.during(jobs.tick) == idle
    assert len(idle) == 8
    jobs.stop(5.0)


@pytest.mark.parametrize(("backoff_s", "locks"), [(0.0, 1), (3600.0, 0)])
def test_a_retry_takes_its_own_period_alone(
    jobs_engine: Engine, backoff_s: float, locks: int
) -> None:
    now = time.time()
    jobs = FlakySweep(
        jobs_engine, JobSettings(retry_backoff_s=backoff_s), clock=lambda: now, failures=1
    )
    statements = Statements(jobs_engine)
    jobs.tick()  # the sweep fails its first attempt; the other jobs are done for the period
    retry = statements.during(jobs.tick)
    assert sum(LOCK in s for s in retry) == locks
    outcome = _sweep_claims(jobs_engine)[-1][1]
    if locks:
        assert outcome == "ok: 0 stale runs closed, 0 reopened (attempt 2)"
    else:  # the backoff has not passed: nothing is due, no lock is taken
        assert outcome == "failed (attempt 1 of 3): RuntimeError: the sweep broke"
    jobs.stop(5.0)
