"""The periodic jobs of a replica: APScheduler 3, in-memory job store, once per period overall.

Each job ticks more often than its period and claims the current period before working
(`claims`), so a replica that starts late or misses a tick still gets the period done, and any
number of replicas do it once. A tick acts at its host's time or the database's, whichever is
earlier: a host clock that jumped ahead never makes a job act on a future.

| job | period | work |
|---|---|---|
| `recompute:<pool>` | the pool's `recompute_interval_s` (default 60 s) | rollups, then fair shares into history |
| `rollup` | 1 h | bring every pool's hourly rollups up to the last complete hour |
| `sweep` | 60 s | close runs whose heartbeats stopped |
| `retention` | 1 d | age out events, history, and each pool's rollups at its own horizon |

A tick only decides what is due, in one statement for every job (`claims.due_jobs`): a job
whose period is done, or failed with no retry due yet, costs no lock and no thread. A job with
something due runs on a thread of its own lane, which takes its period (`claims.take_period`);
a job still running when the next tick comes is left to run (at most one run of a job at a
time in a process). `rollup`, `sweep` and `retention` have a thread each; the pools'
recomputes share `JobSettings.recompute_workers` threads of their own, recomputes first. So an
hour of retention, or a rollup rewriting months of history, holds back no recompute and no
sweep. `gpufair serve` sets the threads, and the attempts and backoff below
(`--recompute-threads`, `--job-attempts`, `--job-retry-backoff-s`).

A run that fails is retried within its period: the same claim, taken again by whichever replica
ticks first once the backoff has passed (`claims.take_period`), at most
`JobSettings.attempts` runs a period; past the period, the next period's run is the retry. The
claim's outcome says the attempt (`failed (attempt 2 of 3): ...`), and a job whose last attempt
failed stays failed for the metrics and the alert (`gpufair_periodic_job_last_failed`) until a
run succeeds.

A run whose replica died mid-run (killed, host lost) is taken over by the next replica to tick
once PostgreSQL has ended the dead replica's connection (at once for a killed process, within
`JobSettings.holder_check_s` or its keepalives otherwise), counted as an attempt: each run holds
its period's advisory lock on the one connection it works on (`claims.take_period` has the rule).
The retaking run ends `ok: ... (attempt 2, taken over from <replica>)`, and the abandoned
attempt counts as a failure in `gpufair_periodic_job_failures_total` on the replica that found it.

A recompute that finds its pool's rollups being rewritten by another process waits for them
(`RECOMPUTE_ROLLUP_WAIT_S`, far past the engine's lock timeout); that is not a failure: the
outcome says how long it waited, and a wait past even that bound ends the run `deferred`, which
the metrics count neither as a failure nor as a success (the overdue alert sees a pool whose
recomputes keep being deferred).
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent import futures
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from apscheduler.schedulers.background import BackgroundScheduler
from psycopg import errors as pg_errors
from sqlalchemy import Connection, Engine, event, exc

from gpufair.domain.model import NodePool
from gpufair.domain.stored_limits import within_limits
from gpufair.metrics import observe_job, observe_job_period
from gpufair.services.recompute import recompute_pool
from gpufair.services.sweep import DEFAULT_STALE_AFTER_S, sweep
from gpufair.store import claims_repo as claims
from gpufair.store import config_repo, locks, rollup_repo
from gpufair.store.retention_repo import Retention, apply_retention

log = logging.getLogger(__name__)


class _SkippedTick(logging.Filter):
    """Drops APScheduler's warning that a tick was skipped because the previous one still runs.
    That is the design (one tick at a time; the next claims whatever period is still due), not
    something to act on, and a busy or slow database makes it frequent."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "maximum number of running instances reached" not in record.getMessage()


logging.getLogger("apscheduler.scheduler").addFilter(_SkippedTick())

CANCEL_WAIT_S = 2.0  # for a cancelled job to roll back and record its outcome
CLOCK_AHEAD_WARN_S = 5.0  # a host clock further ahead of the database's is logged
# How long a periodic recompute waits for its pool's rollup lock held by another process (a
# periodic rollup, a retention run, a `Schedule` rolling the pool up): the redo of a long
# history takes minutes. The rule is written with the key (`locks.rollup_key`).
RECOMPUTE_ROLLUP_WAIT_S = 600.0
WAITED_SAID_S = 1.0  # a wait for the rollup lock at least this long is in the run's outcome
MAINTENANCE_JOBS = ("rollup", "sweep", "retention")


class RollupBusy(Exception):
    """The pool's rollup lock stayed held by another process past `RECOMPUTE_ROLLUP_WAIT_S`."""


@dataclass(frozen=True)
class JobSettings:
    tick_s: float = 10.0  # how often every job checks whether its period is due
    rollup_period_s: float = 3600.0
    sweep_period_s: float = 60.0
    retention_period_s: float = 86400.0
    stale_after_s: float = DEFAULT_STALE_AFTER_S
    retention: Retention = field(default_factory=Retention)
    attempts: int = 3  # runs of a job per period at most: the first and two retries
    retry_backoff_s: float = 15.0  # before the first retry; times 4 before each later one
    recompute_workers: int = 2  # threads the pools' recomputes share
    rollup_wait_s: float = RECOMPUTE_ROLLUP_WAIT_S
    # How soon the database notices that a run's replica is gone while it runs a statement, and
    # the keepalive period for a lost host (`claims.take_period`); a period is retaken after.
    holder_check_s: float = 5.0


class PeriodicJobs:
    def __init__(
        self,
        engine: Engine,
        settings: JobSettings | None = None,
        clock: Callable[[], float] = time.time,
        replica: str = claims.REPLICA_ID,
    ) -> None:
        self.engine = engine
        self.settings = settings or JobSettings()
        self.clock = clock
        self.replica = replica
        self.scheduler = BackgroundScheduler(
            job_defaults={"coalesce": True, "max_instances": 1, "misfire_grace_time": 30},
            timezone="UTC",
        )
        # The lanes: one thread for each maintenance job, a few for the recomputes.
        self._maintenance = ThreadPoolExecutor(len(MAINTENANCE_JOBS), "periodic-job")
        self._recomputes = ThreadPoolExecutor(
            max(1, self.settings.recompute_workers), "periodic-recompute"
        )
        self._idle = threading.Condition()
        self._running = 0  # ticks and job runs in progress (or queued on a lane)
        self._in_flight: set[str] = set()  # jobs queued or running in this process
        self._stopping = False  # no new tick
        self._cancelling = False  # the statements of the jobs in progress are being cancelled
        # The database connections the jobs hold now, to cancel their statements on `stop`.
        self._in_tick = threading.local()
        # The connection the run on this thread works on: it holds the period's lock.
        self._run = threading.local()
        self._in_use: set[Any] = set()
        event.listen(engine, "checkout", self._checked_out)
        event.listen(engine, "checkin", self._checked_in)

    def _checked_out(self, dbapi_conn: Any, _record: Any, _proxy: Any) -> None:
        if getattr(self._in_tick, "active", False):
            with self._idle:
                self._in_use.add(dbapi_conn)

    def _checked_in(self, dbapi_conn: Any, _record: Any) -> None:
        with self._idle:
            self._in_use.discard(dbapi_conn)

    def start(self) -> None:
        self.scheduler.add_job(
            functools.partial(self.tick, wait=False),
            "interval",
            seconds=self.settings.tick_s,
            id="tick",
            next_run_time=datetime.now(UTC) + timedelta(seconds=1),
        )
        self.scheduler.start()

    def stop_ticking(self) -> None:
        """No more ticks; the jobs in progress go on."""
        with self._idle:
            self._stopping = True
        if self.scheduler.running:
            self.scheduler.shutdown(wait=False)

    def stop(self, timeout_s: float | None = None) -> bool:
        """No more ticks; the jobs in progress get `timeout_s` (None: as long as they take) to
        finish, then the statements they run are cancelled: their transactions roll back, their
        periods' claims record the cancellation, and the next period does the work (every job
        repairs what a lost run left, `store/claims_repo.py`). Returns whether no job was left
        running (a cancelled one gets `CANCEL_WAIT_S` to unwind)."""
        self.stop_ticking()
        with self._idle:
            idle = self._idle.wait_for(lambda: self._running == 0, timeout_s)
            in_use = list(self._in_use)
        if not idle:
            self._cancelling = True
            for dbapi_conn in in_use:
                try:
                    dbapi_conn.cancel_safe(timeout=CANCEL_WAIT_S)
                except Exception:  # the statement may have ended, or the connection be gone
                    log.debug("periodic jobs: cancelling a statement failed", exc_info=True)
            with self._idle:
                idle = self._idle.wait_for(lambda: self._running == 0, CANCEL_WAIT_S)
        for lane in (self._maintenance, self._recomputes):
            lane.shutdown(wait=False, cancel_futures=True)
        event.remove(self.engine, "checkout", self._checked_out)
        event.remove(self.engine, "checkin", self._checked_in)
        return idle

    def tick(self, wait: bool = True) -> None:
        """Start every job whose current period is due (not claimed yet, or failed and due for
        a retry) and not already running here, each on its lane; with `wait`, return once the
        runs started have ended (the scheduler's ticks do not wait)."""
        with self._idle:
            if self._stopping:
                return
            self._running += 1
        self._in_tick.active = True
        try:
            started = self._tick()
        finally:
            self._in_tick.active = False
            self._done()
        if wait:
            futures.wait(started)  # a run queued when `stop` shut its lane is cancelled

    def _done(self) -> None:
        with self._idle:
            self._running -= 1
            self._idle.notify_all()

    def _tick(self) -> list[Future[None]]:
        host_s = self.clock()
        settings = self.settings
        try:
            with self.engine.connect() as conn:
                database_s = claims.database_time(conn)
                pools = within_limits(config_repo.load_config(conn))[0].pools
                # A clock ahead of the database's (a host whose clock jumped) is not trusted:
                # acting on that future, retention would delete what is not yet past its age,
                # the sweeper close runs that are alive, the recompute store shares dated
                # ahead of every later one (read as the latest until then), and the claims
                # take periods no replica would run again.
                now_s = min(host_s, database_s)
                jobs = self._jobs(pools, now_s)
                due = claims.due_jobs(
                    conn,
                    {job: claims.period_start(now_s, period_s) for job, period_s, _, _ in jobs},
                    attempts=settings.attempts,
                    backoff_s=settings.retry_backoff_s,
                )
        except Exception:
            log.warning("periodic jobs: database unavailable, retrying next tick", exc_info=True)
            return []
        if host_s > database_s + CLOCK_AHEAD_WARN_S:
            log.warning(
                "periodic jobs: this host's clock is %.0f s ahead of the database's; "
                "the jobs run at the database's time",
                host_s - database_s,
            )
        started = []
        for job, period_s, run, lane in jobs:
            observe_job_period(job, period_s)  # for the overdue alert (metrics.py)
            if job not in due:  # done for its period, or failed with no retry due yet
                continue
            with self._idle:
                # `stop` cancelled the jobs in progress: the server exits within
                # `CANCEL_WAIT_S`. A job started now would be cut short, its period lost.
                if self._cancelling or job in self._in_flight:
                    continue
                self._in_flight.add(job)
                self._running += 1
            try:
                started.append(lane.submit(self._run_once, job, period_s, now_s, run))
            except RuntimeError:  # the lane was shut down: the server stops
                self._release(job)
        return started

    def _jobs(
        self, pools: Sequence[NodePool], now_s: float
    ) -> list[tuple[str, float, Callable[[], str], ThreadPoolExecutor]]:
        """Every job of this tick: its name, period, work and lane."""
        jobs: list[tuple[str, float, Callable[[], str], ThreadPoolExecutor]] = [
            (
                f"recompute:{pool.name}",
                pool.policy.recompute_interval_s,
                functools.partial(self._recompute, pool.name, now_s),
                self._recomputes,
            )
            for pool in pools
        ]
        maintenance = {
            "rollup": (self.settings.rollup_period_s, self._rollup),
            "sweep": (self.settings.sweep_period_s, self._sweep),
            "retention": (self.settings.retention_period_s, self._retention),
        }
        for job in MAINTENANCE_JOBS:
            period_s, work = maintenance[job]
            jobs.append((job, period_s, functools.partial(work, now_s), self._maintenance))
        return jobs

    def _release(self, job: str) -> None:
        with self._idle:
            self._in_flight.discard(job)
        self._done()

    def _run_once(self, job: str, period_s: float, now_s: float, work: Callable[[], str]) -> None:
        self._in_tick.active = True
        try:
            if not self._cancelling:
                self._claim_and_run(job, period_s, now_s, work)
        finally:
            self._in_tick.active = False
            self._release(job)

    def _claim_and_run(
        self, job: str, period_s: float, now_s: float, work: Callable[[], str]
    ) -> None:
        start_s = claims.period_start(now_s, period_s)
        settings = self.settings
        try:
            with self.engine.connect() as conn:
                try:
                    taken = claims.take_period(
                        conn,
                        job,
                        start_s,
                        self.replica,
                        attempts=settings.attempts,
                        backoff_s=settings.retry_backoff_s,
                        holder_check_s=settings.holder_check_s,
                    )
                except Exception:
                    log.warning("periodic job %s: cannot claim its period", job, exc_info=True)
                    conn.invalidate()  # it may hold the period's lock
                    return
                if taken.took_over is not None:
                    log.warning(
                        "periodic job %s: replica %s stopped mid-run; %s",
                        job,
                        taken.took_over,
                        "taken over" if taken.attempt else "that was its last attempt",
                    )
                    observe_job(job, failed=True)  # the abandoned attempt
                if taken.attempt is None:
                    return
                try:
                    self._run.conn = conn
                    self._run_claimed(conn, job, start_s, taken, work)
                finally:
                    self._run.conn = None
                    claims.release_period(conn, job, start_s)
        except Exception:
            log.warning("periodic job %s: its connection failed", job, exc_info=True)

    def _run_claimed(
        self,
        conn: Connection,
        job: str,
        start_s: float,
        taken: claims.Taken,
        work: Callable[[], str],
    ) -> None:
        attempt = taken.attempt or 1
        settings = self.settings
        if attempt > 1:
            log.info("periodic job %s: attempt %d of %d", job, attempt, settings.attempts)
        try:
            outcome = work()
            if taken.took_over is not None:
                outcome += f" (attempt {attempt}, taken over from {taken.took_over})"
            elif attempt > 1:
                outcome += f" (attempt {attempt})"
            observe_job(job, failed=False)
        except RollupBusy as busy:
            log.warning("periodic job %s deferred: %s", job, busy)
            outcome = f"deferred: {busy}"
        except Exception as error:
            if self._cancelling:
                log.info("periodic job %s cancelled: the server is stopping", job)
                outcome = "cancelled: the server stopped"
            else:
                log.exception("periodic job %s failed (attempt %d)", job, attempt)
                outcome = claims.failed_outcome(
                    attempt, settings.attempts, f"{error.__class__.__name__}: {error}"
                )
                observe_job(job, failed=True)
        try:
            if conn.in_transaction():
                conn.rollback()
            claims.finish(conn, job, start_s, outcome, self.replica)
        except Exception:
            log.warning("periodic job %s: cannot record its outcome", job, exc_info=True)

    @contextmanager
    def _connection(self) -> Iterator[Connection]:
        """The connection a job works on: in a run, the run's own (it holds the period's lock,
        so the work ends with it); left without a transaction in progress. Outside a run, a
        connection of the engine's."""
        conn = getattr(self._run, "conn", None)
        if conn is None:
            with self.engine.connect() as own:
                yield own
            return
        try:
            yield conn
        finally:
            if conn.in_transaction():
                conn.rollback()

    def _recompute(self, pool: str, now_s: float) -> str:
        with self._connection() as conn:
            waited_s = self._wait_for_rollups(conn, pool)
            done = recompute_pool(conn, pool, now_s)
            conn.commit()
        if waited_s >= WAITED_SAID_S:
            return f"ok: run {done.run_id} (waited {waited_s:.1f} s for the pool's rollups)"
        return f"ok: run {done.run_id}"

    def _wait_for_rollups(self, conn: Connection, pool: str) -> float:
        """Take the pool's rollup lock for the recompute's transaction (the rollup takes it
        again, at once), waiting up to `rollup_wait_s` for another process's rollup instead of
        the engine's lock timeout; returns the seconds waited. `RollupBusy` past the wait."""
        started = time.monotonic()
        try:
            return locks.xact_lock_waiting(
                conn, locks.rollup_key(pool), self.settings.rollup_wait_s
            )
        except exc.OperationalError as error:
            timed_out = isinstance(error.orig, pg_errors.LockNotAvailable | pg_errors.QueryCanceled)
            if timed_out and not self._cancelling:
                conn.rollback()
                raise RollupBusy(
                    f"the rollup lock of pool {pool!r} stayed held by another process for "
                    f"{time.monotonic() - started:.0f} s"
                ) from error
            raise

    def _rollup(self, now_s: float) -> str:
        written = 0
        with self._connection() as conn:
            version = config_repo.config_version(conn)  # before the config (`rollup_pool`)
            config = within_limits(config_repo.load_config(conn))[0]
            for pool in config.pools:
                written += rollup_repo.rollup_pool(conn, config, pool, now_s, version)
            conn.commit()
        return f"ok: {written} buckets"

    def _sweep(self, now_s: float) -> str:
        with self._connection() as conn:
            swept = sweep(conn, now_s, self.settings.stale_after_s)
            conn.commit()
        return f"ok: {swept.closed} stale runs closed, {swept.reopened} reopened"

    def _retention(self, now_s: float) -> str:
        with self._connection() as conn:
            deleted = apply_retention(conn, now_s, self.settings.retention)
            conn.commit()
        return "ok: " + ", ".join(f"{k} {v}" for k, v in sorted(deleted.items()) if v)
