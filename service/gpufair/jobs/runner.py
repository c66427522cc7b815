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
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from apscheduler.executors.pool import ThreadPoolExecutor
from apscheduler.schedulers.background import BackgroundScheduler
from sqlalchemy import Engine, event

from gpufair.domain.stored_limits import within_limits
from gpufair.metrics import observe_job, observe_job_period
from gpufair.services.recompute import recompute_pool
from gpufair.services.sweep import DEFAULT_STALE_AFTER_S, sweep
from gpufair.store import claims_repo as claims
from gpufair.store import config_repo, rollup_repo
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


@dataclass(frozen=True)
class JobSettings:
    tick_s: float = 10.0  # how often every job checks whether its period is due
    rollup_period_s: float = 3600.0
    sweep_period_s: float = 60.0
    retention_period_s: float = 86400.0
    stale_after_s: float = DEFAULT_STALE_AFTER_S
    retention: Retention = field(default_factory=Retention)


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
            executors={"default": ThreadPoolExecutor(2)},
            job_defaults={"coalesce": True, "max_instances": 1, "misfire_grace_time": 30},
            timezone="UTC",
        )
        self._idle = threading.Condition()
        self._running = 0  # ticks in progress
        self._stopping = False  # no new tick
        self._cancelling = False  # the statements of the tick in progress are being cancelled
        # The database connections the jobs hold now, to cancel their statements on `stop`.
        self._in_tick = threading.local()
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
            self.tick,
            "interval",
            seconds=self.settings.tick_s,
            id="tick",
            next_run_time=datetime.now(UTC) + timedelta(seconds=1),
        )
        self.scheduler.start()

    def stop_ticking(self) -> None:
        """No more ticks; a tick in progress goes on."""
        with self._idle:
            self._stopping = True
        if self.scheduler.running:
            self.scheduler.shutdown(wait=False)

    def stop(self, timeout_s: float | None = None) -> bool:
        """No more ticks; a tick in progress gets `timeout_s` (None: as long as it takes) to
        finish, then the statement it runs is cancelled: its transaction rolls back, its
        period's claim records the cancellation, and the next period does the work (every job
        repairs what a lost run left, `store/claims_repo.py`). Returns whether no tick was left
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
        event.remove(self.engine, "checkout", self._checked_out)
        event.remove(self.engine, "checkin", self._checked_in)
        return idle

    def tick(self) -> None:
        """Run every job whose current period nobody has claimed yet."""
        with self._idle:
            if self._stopping:
                return
            self._running += 1
        self._in_tick.active = True
        try:
            self._tick()
        finally:
            self._in_tick.active = False
            with self._idle:
                self._running -= 1
                self._idle.notify_all()

    def _tick(self) -> None:
        now_s = self.clock()
        try:
            with self.engine.connect() as conn:
                database_s = claims.database_time(conn)
                pools = within_limits(config_repo.load_config(conn))[0].pools
        except Exception:
            log.warning("periodic jobs: database unavailable, retrying next tick", exc_info=True)
            return
        if now_s > database_s + CLOCK_AHEAD_WARN_S:
            log.warning(
                "periodic jobs: this host's clock is %.0f s ahead of the database's; "
                "the jobs run at the database's time",
                now_s - database_s,
            )
        # A clock ahead of the database's (a host whose clock jumped) is not trusted: acting on
        # that future, retention would delete what is not yet past its age, the sweeper close
        # runs that are alive, the recompute store shares dated ahead of every later one (read
        # as the latest until then), and the claims take periods no replica would run again.
        now_s = min(now_s, database_s)
        for pool in pools:
            self._run_once(
                f"recompute:{pool.name}",
                pool.policy.recompute_interval_s,
                now_s,
                functools.partial(self._recompute, pool.name, now_s),
            )
        self._run_once("rollup", self.settings.rollup_period_s, now_s, lambda: self._rollup(now_s))
        self._run_once("sweep", self.settings.sweep_period_s, now_s, lambda: self._sweep(now_s))
        self._run_once(
            "retention", self.settings.retention_period_s, now_s, lambda: self._retention(now_s)
        )

    def _run_once(self, job: str, period_s: float, now_s: float, work: Callable[[], str]) -> None:
        observe_job_period(job, period_s)  # for the overdue alert (metrics.py)
        if self._cancelling:
            # `stop` cancelled a job of this tick: the server exits within `CANCEL_WAIT_S`. A
            # job started now would be cut short with its period claimed, and that period lost.
            return
        start_s = claims.period_start(now_s, period_s)
        try:
            if not claims.claim(self.engine, job, start_s, self.replica):
                return
        except Exception:
            log.warning("periodic job %s: cannot claim its period", job, exc_info=True)
            return
        try:
            outcome = work()
            observe_job(job, failed=False)
        except Exception as exc:
            if self._cancelling:
                log.info("periodic job %s cancelled: the server is stopping", job)
                outcome = "cancelled: the server stopped"
            else:
                log.exception("periodic job %s failed", job)
                outcome = f"failed: {exc.__class__.__name__}: {exc}"
                observe_job(job, failed=True)
        try:
            claims.finish(self.engine, job, start_s, outcome)
        except Exception:
            log.warning("periodic job %s: cannot record its outcome", job, exc_info=True)

    def _recompute(self, pool: str, now_s: float) -> str:
        with self.engine.connect() as conn:
            done = recompute_pool(conn, pool, now_s)
            conn.commit()
        return f"ok: run {done.run_id}"

    def _rollup(self, now_s: float) -> str:
        written = 0
        with self.engine.connect() as conn:
            version = config_repo.config_version(conn)  # before the config (`rollup_pool`)
            config = within_limits(config_repo.load_config(conn))[0]
            for pool in config.pools:
                written += rollup_repo.rollup_pool(conn, config, pool, now_s, version)
            conn.commit()
        return f"ok: {written} buckets"

    def _sweep(self, now_s: float) -> str:
        with self.engine.connect() as conn:
            swept = sweep(conn, now_s, self.settings.stale_after_s)
            conn.commit()
        return f"ok: {swept.closed} stale runs closed, {swept.reopened} reopened"

    def _retention(self, now_s: float) -> str:
        with self.engine.connect() as conn:
            deleted = apply_retention(conn, now_s, self.settings.retention)
            conn.commit()
        return "ok: " + ", ".join(f"{k} {v}" for k, v in sorted(deleted.items()) if v)
