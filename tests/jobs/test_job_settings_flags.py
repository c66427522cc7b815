"""`gpufair serve --job-attempts/--job-retry-backoff-s/--recompute-threads` reach the periodic
jobs: the settings `serve` builds from them (`cli.main.job_settings`) bound the attempts, delay
the retry and size the recomputes' lane."""

from __future__ import annotations

import threading
import time

from sqlalchemy import Engine, text

from gpufair.cli import build_parser
from gpufair.cli.serve import job_settings
from gpufair.client import GpufairClient
from gpufair.config_file import load_config_file
from gpufair.jobs.runner import JobSettings, PeriodicJobs
from tests.jobs.test_job_retries import FlakySweep, _sweep_claims
from tests.jobs.test_periodic_jobs import EXAMPLE
from tests.jobs.test_tick_statements import _add_pools


def from_flags(*argv: str) -> JobSettings:
    return job_settings(build_parser().parse_args(["serve", *argv]), JobSettings)


def test_job_attempts_bounds_the_runs_of_a_period(client: GpufairClient, db: Engine) -> None:
    client.apply_config(load_config_file(EXAMPLE))
    now = time.time()
    settings = from_flags("--job-attempts", "2", "--job-retry-backoff-s", "0")
    jobs = FlakySweep(db, settings, clock=lambda: now, replica="a", failures=10)
    for _ in range(4):
        jobs.tick()
    (claim,) = _sweep_claims(db)
    assert claim == ("a", "failed (attempt 2 of 2): RuntimeError: the sweep broke", True)
    assert jobs.failures == 8  # two runs (three by default)
    jobs.stop(5.0)


def test_job_retry_backoff_delays_the_retry(client: GpufairClient, db: Engine) -> None:
    client.apply_config(load_config_file(EXAMPLE))
    now = time.time()
    jobs = FlakySweep(
        db, from_flags("--job-retry-backoff-s", "2"), clock=lambda: now, replica="a", failures=1
    )
    jobs.tick()
    failed_at = time.monotonic()
    jobs.tick()  # within the 2 s
    assert time.monotonic() - failed_at < 2.0
    assert _sweep_claims(db)[0][1] == "failed (attempt 1 of 3): RuntimeError: the sweep broke"
    time.sleep(2.1 - (time.monotonic() - failed_at))
    jobs.tick()
    assert _sweep_claims(db)[0][1] == "ok: 0 stale runs closed, 0 reopened (attempt 2)"
    jobs.stop(5.0)


class HeldRecomputes(PeriodicJobs):
    """Recomputes that take `hold_s` (or wait at `together`) and count how many run at once."""

    def __init__(self, *args: object, together: threading.Barrier | None = None) -> None:
        super().__init__(*args)  # type: ignore[arg-type]
        self.together = together
        self.lock = threading.Lock()
        self.now_running = self.most = 0
        self.threads: set[str] = set()

    def _recompute(self, pool: str, now_s: float) -> str:
        with self.lock:
            self.now_running += 1
            self.most = max(self.most, self.now_running)
            self.threads.add(threading.current_thread().name)
        try:
            if self.together is not None:
                self.together.wait()  # BrokenBarrierError (a failed run) if they are not
            else:
                time.sleep(0.3)
        finally:
            with self.lock:
                self.now_running -= 1
        return "ok: held"


def _recomputes(db: Engine) -> list[str]:
    with db.connect() as conn:
        return list(
            conn.execute(
                text("SELECT outcome FROM job_claims WHERE job LIKE 'recompute:%' ORDER BY job")
            ).scalars()
        )


def test_recompute_threads_run_that_many_pools_at_once(client: GpufairClient, db: Engine) -> None:
    _add_pools(client, 2)  # three pools
    now = time.time()
    three = HeldRecomputes(
        db,
        from_flags("--recompute-threads", "3"),
        lambda: now,
        "a",
        together=threading.Barrier(3, timeout=20),
    )
    three.tick()
    assert three.most == 3 and len(three.threads) == 3
    assert _recomputes(db) == ["ok: held"] * 3
    three.stop(5.0)


def test_one_recompute_thread_runs_the_pools_in_turn(client: GpufairClient, db: Engine) -> None:
    _add_pools(client, 2)
    now = time.time()
    one = HeldRecomputes(db, from_flags("--recompute-threads", "1"), lambda: now, "a")
    one.tick()
    assert one.most == 1 and len(one.threads) == 1
    assert _recomputes(db) == ["ok: held"] * 3
    one.stop(5.0)
