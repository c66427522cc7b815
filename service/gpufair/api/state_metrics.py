"""Gauges of the cluster's state, read from the database when Prometheus scrapes.

Every replica reads the same tables, so every replica exports the same values: the fair shares of
each pool's latest recompute (whichever replica ran it), not the numbers this process last
computed; a queue or pool deleted from the config disappears from the next scrape. The reads
(`store/metrics_repo.py`) are bounded by what is configured now and run in one short read-only
transaction under a statement timeout; their result is kept for `cache_s`, so several scrapers
(or a dashboard refreshing quickly) cost one read.

A job's period is a pool's `recompute_interval_s` as configured (read within the input limits, as
the runner reads it) for `recompute:<pool>`, and for the other jobs the period this process's
runner gives them: a replica that runs no jobs leaves those out (the alert takes the max over
replicas).

When the database cannot be read, the state gauges are left out (a stale value would be a lie)
and `gpufair_database_up` says 0.

| metric | labels | unit |
|---|---|---|
| `gpufair_fair_share_cu`, `gpufair_allocated_cu`, `gpufair_deserved_cu`, `gpufair_demand_cu`, `gpufair_limit_cu` | pool, queue | CU |
| `gpufair_decayed_usage_cu_seconds` | pool, queue | CU·s |
| `gpufair_effective_weight` | pool, queue | fraction (P) |
| `gpufair_fair_share_computed_timestamp_seconds`, `gpufair_pool_fair_share_capacity_cu` | pool | s since epoch, CU |
| `gpufair_pool_capacity_gpus`, `gpufair_pool_capacity_cu`, `gpufair_pool_allocated_gpus`, `gpufair_pool_allocated_cu` | pool, gpu_type | GPUs, CU |
| `gpufair_pending_workloads` | pool, queue, reason | workloads |
| `gpufair_budget_cu_hours`, `…_consumed_cu_hours`, `…_remaining_cu_hours`, `…_burn_cu_hours_per_day`, `…_period_end_timestamp_seconds`, `…_projected_exhaustion_timestamp_seconds` | queue, pool, period | CU·h, CU·h/day, s |
| `gpufair_periodic_job_last_success_timestamp_seconds`, `…_last_duration_seconds`, `…_last_failed` | periodic_job | s, s, 0/1 |
| `gpufair_periodic_job_period_seconds` | periodic_job | s |
| `gpufair_database_up` | | 0/1 |
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from sqlalchemy import Connection, Engine

from gpufair.api.health import DatabaseHealth
from gpufair.domain import limits
from gpufair.metrics import job_periods
from gpufair.store import metrics_repo
from gpufair.v1 import scheduler_pb2

log = logging.getLogger(__name__)

DEFAULT_CACHE_S = 2.0
READ_TIMEOUT_MS = 5000
# A read still running this long after it started waits on a database that does not answer.
STUCK_READ_S = READ_TIMEOUT_MS / 1000 + 1.0
# A pending workload no recorded Schedule has looked at since it was submitted.
NOT_SCHEDULED_YET = "not_scheduled_yet"

_QUEUE_GAUGES: tuple[tuple[str, str, str], ...] = (
    ("gpufair_fair_share_cu", "fair_share_cu", "Fair share of a queue (latest recompute)"),
    ("gpufair_allocated_cu", "allocated_cu", "CU a queue held at the latest recompute"),
    ("gpufair_deserved_cu", "deserved_cu", "Deserved (guaranteed) CU of a queue"),
    ("gpufair_demand_cu", "demand_cu", "Demand of a queue: allocated + pending, in CU"),
    ("gpufair_limit_cu", "limit_cu", "Limit of a queue in CU (absent when unlimited)"),
    (
        "gpufair_decayed_usage_cu_seconds",
        "decayed_usage_cu_s",
        "Decayed usage under the pool's basis",
    ),
    ("gpufair_effective_weight", "effective_weight", "Effective over-quota weight P after history"),
)
_BUDGET_GAUGES: tuple[tuple[str, str, str], ...] = (
    ("gpufair_budget_cu_hours", "budget_cu_hours", "A budget's size for its period"),
    ("gpufair_budget_consumed_cu_hours", "consumed_cu_hours", "Consumed in the current period"),
    ("gpufair_budget_remaining_cu_hours", "remaining_cu_hours", "Remaining in the current period"),
    (
        "gpufair_budget_burn_cu_hours_per_day",
        "burn_cu_hours_per_day",
        "Average burn rate in the current period",
    ),
)


class StateCollector(Collector):
    """Collects the state gauges at scrape time (module docstring)."""

    def __init__(
        self,
        engine: Engine,
        health: DatabaseHealth | None = None,
        *,
        clock: Callable[[], float] = time.time,
        cache_s: float = DEFAULT_CACHE_S,
    ) -> None:
        self.engine = engine
        self.health = health
        self.clock = clock
        self.cache_s = cache_s
        self._changed = threading.Condition()  # guards what follows
        self._cached: list[Metric] = []
        self._read_at = float("-inf")
        self._read_ok = False
        self._reads_started = 0
        self._reading: tuple[int, float] | None = None  # the read in flight: number, start

    def collect(self) -> Iterator[Metric]:
        if self.health is not None and not self.health.up:
            # The health probe found the database away: read nothing, export nothing stale.
            with self._changed:
                self._cached, self._read_ok, self._read_at = [], False, float("-inf")
            families: list[Metric] = []
            read_ok = False
        else:
            families, read_ok = self._families()
        up = GaugeMetricFamily(
            "gpufair_database_up", "1 when the database answers (health SERVING), else 0"
        )
        up.add_metric([], 1.0 if (self.health.up if self.health else read_ok) else 0.0)
        yield up
        yield from families

    def _families(self) -> tuple[list[Metric], bool]:
        """The state gauges: kept ones up to `cache_s` old, else those of a read. One read runs
        at a time, and scrapers arriving meanwhile take its result. A read still running
        `STUCK_READ_S` after it started waits on a database that stopped answering (its
        statement timeout is the server's, and a silent server enforces nothing): the scrapers
        after it wait no longer and read anew, the latest read's result is the one kept, and
        no lock is held while reading, so `gpufair_database_up` is exported whatever a read
        waits on."""
        with self._changed:
            now = time.monotonic()
            if now - self._read_at < self.cache_s:
                return list(self._cached), self._read_ok
            if self._reading is not None:
                started = self._reading[1]
                self._changed.wait_for(
                    lambda: self._reading is None or self._reading[1] != started,
                    max(0.0, started + STUCK_READ_S - now),
                )
                if time.monotonic() - self._read_at < self.cache_s:
                    return list(self._cached), self._read_ok
            self._reads_started += 1
            number = self._reads_started
            self._reading = (number, time.monotonic())
        try:
            families, read_ok = self._read(), True
        except Exception as exc:
            if self._read_ok:
                log.warning("metrics: cannot read the cluster state: %s", exc)
            families, read_ok = [], False
        with self._changed:
            if self._reading is not None and self._reading[0] == number:
                self._reading = None
            if number == self._reads_started:  # no later read started while this one waited
                self._cached, self._read_ok, self._read_at = families, read_ok, time.monotonic()
            self._changed.notify_all()
        return list(families), read_ok

    def _read(self) -> list[Metric]:
        with self.engine.connect() as conn:
            metrics_repo.begin_light_read(conn, READ_TIMEOUT_MS)
            families = [
                *_fair_shares(conn),
                *_capacity(conn),
                _pending(conn),
                *_budgets(conn, datetime.fromtimestamp(self.clock(), UTC)),
                *_jobs(conn),
            ]
            conn.rollback()
        return families


def _fair_shares(conn: Connection) -> list[Metric]:
    runs, records = metrics_repo.latest_runs(conn)
    families = []
    for name, attribute, doc in _QUEUE_GAUGES:
        family = GaugeMetricFamily(name, doc, labels=["pool", "queue"])
        for r in records:
            value = getattr(r, attribute)
            if value is not None:
                family.add_metric([r.pool, r.queue], float(value))
        families.append(family)
    at = GaugeMetricFamily(
        "gpufair_fair_share_computed_timestamp_seconds",
        "When the pool's latest fair-share recompute ran",
        labels=["pool"],
    )
    capacity = GaugeMetricFamily(
        "gpufair_pool_fair_share_capacity_cu",
        "The CU capacity the latest recompute divided",
        labels=["pool"],
    )
    for run in runs:
        at.add_metric([run.pool], run.computed_at_s)
        capacity.add_metric([run.pool], run.capacity_cu)
    return [*families, at, capacity]


def _capacity(conn: Connection) -> list[Metric]:
    labels = ["pool", "gpu_type"]
    cap_gpus = GaugeMetricFamily(
        "gpufair_pool_capacity_gpus",
        "GPUs of the pool's ready nodes, and those work still holds on its nodes not ready",
        labels=labels,
    )
    cap_cu = GaugeMetricFamily(
        "gpufair_pool_capacity_cu",
        "CU of the pool's ready nodes, and those work still holds on its nodes not ready",
        labels=labels,
    )
    alloc_gpus = GaugeMetricFamily(
        "gpufair_pool_allocated_gpus", "GPUs held by what runs now", labels=labels
    )
    alloc_cu = GaugeMetricFamily(
        "gpufair_pool_allocated_cu", "CU held by what runs now", labels=labels
    )
    held = metrics_repo.allocated(conn)
    keys = set(held)
    for pool, by_type in sorted(metrics_repo.capacity(conn).items()):
        for gpu_type, (gpus, cu) in sorted(by_type.items()):
            cap_gpus.add_metric([pool, gpu_type], gpus)
            cap_cu.add_metric([pool, gpu_type], cu)
            keys.add((pool, gpu_type))
    for pool, gpu_type in sorted(keys):
        gpus, cu = held.get((pool, gpu_type), (0.0, 0.0))
        alloc_gpus.add_metric([pool, gpu_type], gpus)
        alloc_cu.add_metric([pool, gpu_type], cu)
    return [cap_gpus, cap_cu, alloc_gpus, alloc_cu]


def _pending(conn: Connection) -> Metric:
    """Pending workloads by the reason the pool's latest recorded Schedule gave them."""
    reasons: dict[str, str] = {}
    for cycle in metrics_repo.latest_cycles(conn):
        reply = scheduler_pb2.ScheduleResponse.FromString(cycle.reply)
        reasons.update({p.uid: p.reason_code for p in reply.pending})
    counts = metrics_repo.pending_counts(conn, reasons, NOT_SCHEDULED_YET)
    family = GaugeMetricFamily(
        "gpufair_pending_workloads",
        "Pending workloads, by the reason code of the pool's latest Schedule",
        labels=["pool", "queue", "reason"],
    )
    for key, n in sorted(counts.items()):
        family.add_metric(list(key), float(n))
    return family


def _budgets(conn: Connection, at: datetime) -> list[Metric]:
    labels = ["queue", "pool", "period"]
    records = metrics_repo.budgets(conn, at)
    families = []
    for name, attribute, doc in _BUDGET_GAUGES:
        family = GaugeMetricFamily(name, doc, labels=labels)
        for b in records:
            family.add_metric([b.queue, b.pool, b.period], float(getattr(b, attribute)))
        families.append(family)
    end = GaugeMetricFamily(
        "gpufair_budget_period_end_timestamp_seconds",
        "When the budget's current period ends",
        labels=labels,
    )
    exhaustion = GaugeMetricFamily(
        "gpufair_budget_projected_exhaustion_timestamp_seconds",
        "When the budget ran out in its current period, or will at its average burn so far "
        "before the period ends; absent when it outlasts the period at that burn",
        labels=labels,
    )
    for b in records:
        end.add_metric([b.queue, b.pool, b.period], b.period_end.timestamp())
        if b.projected_exhaustion is not None:
            exhaustion.add_metric([b.queue, b.pool, b.period], b.projected_exhaustion.timestamp())
    return [*families, end, exhaustion]


def _jobs(conn: Connection) -> list[Metric]:
    labels = ["periodic_job"]
    success = GaugeMetricFamily(
        "gpufair_periodic_job_last_success_timestamp_seconds",
        "When the job last finished successfully (any replica)",
        labels=labels,
    )
    duration = GaugeMetricFamily(
        "gpufair_periodic_job_last_duration_seconds",
        "How long the job's latest finished run took (a run cancelled by a stopping server, "
        "or a recompute deferred by another process's rollup, is left out)",
        labels=labels,
    )
    failed = GaugeMetricFamily(
        "gpufair_periodic_job_last_failed",
        "1 when the job's latest finished run failed (its retries included), else 0 (a run "
        "cancelled by a stopping server, or a recompute deferred, is left out)",
        labels=labels,
    )
    period = GaugeMetricFamily(
        "gpufair_periodic_job_period_seconds",
        "How often the job runs: a pool's recompute interval, else this replica runner's period",
        labels=labels,
    )
    runner = job_periods()
    for job in metrics_repo.jobs(conn):
        if job.configured_period_s is not None:
            period.add_metric([job.job], _as_read(job.configured_period_s))
        elif job.job in runner:
            period.add_metric([job.job], runner[job.job])
        if job.last_success_s is not None:
            success.add_metric([job.job], job.last_success_s)
        if job.last_duration_s is not None:
            duration.add_metric([job.job], job.last_duration_s)
            failed.add_metric([job.job], 1.0 if job.last_failed else 0.0)
    return [success, duration, failed, period]


def _as_read(interval_s: float) -> float:
    """A stored interval as the runner reads it: within the input limits (`domain/stored_limits`),
    one that is not a number as the lower limit."""
    low, high = limits.MIN_DURATION_S, limits.MAX_DURATION_S
    return low if math.isnan(interval_s) else min(max(interval_s, low), high)
