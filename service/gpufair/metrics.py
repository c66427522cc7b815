"""Prometheus metrics counted by this process: RPCs, ingestion, scheduling decisions, periodic
jobs, and the build. Exposed over HTTP by `gpufair serve --metrics-address` (default
127.0.0.1:9464).

Two kinds of metric, by where their truth lives:

- **Counters and histograms of what this replica did** (this module): RPCs, ingested events and
  their lag, `Schedule` cycles with their binds, evictions and the waits they ended, job failures.
  Each replica counts its own; Prometheus sums them across replicas.
- **Gauges of the cluster's state** (fair shares, demand, capacity, pending work, budgets, job
  health) are read from the database at scrape time by `api/state_metrics.py`, so every replica
  exports the same, current values, and the gauges of a deleted queue or pool go with it.

Names carry their unit (`_seconds`, `_cu`, `_gpus`, `_cu_hours`, `_total`); labels are `pool`,
`queue`, `gpu_type` where they apply. The `_created` series prometheus_client adds to counters and
histograms by default are turned off: they double the series and no dashboard reads them.
"""

from __future__ import annotations

import bisect
import itertools
import platform
import threading
from collections.abc import Iterator, Mapping, Sequence

import prometheus_client
from prometheus_client import REGISTRY, Counter, Histogram, Info
from prometheus_client.core import HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

import gpufair
from gpufair.domain.model import Workload
from gpufair.domain.snapshot import CycleResult, EvictReason

prometheus_client.disable_created_metrics()  # type: ignore[no-untyped-call]

BUILD_INFO = Info("gpufair_build", "The running gpufair: version and Python")
BUILD_INFO.info({"version": gpufair.__version__, "python": platform.python_version()})

RPCS = Counter("gpufair_rpcs_total", "RPCs handled", ["method", "code"])
RPC_SECONDS = Histogram(
    "gpufair_rpc_seconds",
    "RPC latency",
    ["method"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)

# From seconds to days: a small job binds within a cycle, a large gang may wait for a week.
WAIT_BUCKETS_S = (
    1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 7200, 14400, 28800, 86400, 172800, 345600, 604800,
)  # fmt: skip
WAIT_SECONDS = Histogram(
    "gpufair_wait_seconds",
    "From submission to bind, per queue (every bind a Schedule made)",
    ["pool", "queue"],
    buckets=WAIT_BUCKETS_S,
)
WAIT_BY_TYPE_SECONDS = Histogram(
    "gpufair_wait_by_gpu_type_seconds",
    "From submission to bind, per GPU type it was bound to",
    ["pool", "gpu_type"],
    buckets=WAIT_BUCKETS_S,
)
FIRST_BIND_SECONDS = Histogram(
    "gpufair_gang_first_bind_seconds",
    "From submission to a workload's first bind (it never ran before), by gang size in pods",
    ["pool", "gang_size"],
    buckets=WAIT_BUCKETS_S,
)
# Gang sizes in pods, as bucket labels: "1", "2-3", "4-7", …, "64+".
GANG_SIZES = ((1, "1"), (3, "2-3"), (7, "4-7"), (15, "8-15"), (63, "16-63"))
BINDS = Counter("gpufair_binds_total", "Workloads bound by Schedule", ["pool", "queue", "gpu_type"])
EVICTIONS = Counter(
    "gpufair_evictions_total", "Workloads evicted by Schedule, by reason", ["pool", "reason"]
)
SCHEDULE_SECONDS = Histogram(
    "gpufair_schedule_cycle_seconds",
    "Duration of a recorded Schedule cycle (snapshot, decisions, commit)",
    ["pool"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
SCHEDULE_JOINED_RUNNING = Counter(
    "gpufair_schedule_joined_running_total",
    "Schedule callers that took the decisions of the cycle running when they arrived",
    ["pool"],
)
SCHEDULE_DECISIONS = Counter(
    "gpufair_schedule_decisions_total",
    "Decisions of recorded Schedule cycles: bind or evict",
    ["pool", "decision"],
)
JOB_FAILURES = Counter(
    "gpufair_periodic_job_failures_total",
    "Periodic job runs of this replica that failed",
    ["periodic_job"],
)


def _go_float(bound: float) -> str:
    """A bucket bound as prometheus_client's own histograms label it (1.0, 0.5, 86400.0)."""
    return repr(float(bound))


class BatchHistogram(Collector):
    """A histogram observed a batch at a time. Ingestion stores tens of thousands of events a
    second; prometheus_client's Histogram takes a lock and a Python loop per observation, which
    was a measurable share of the ingest path. This one sorts a batch into buckets locally and
    takes the lock once."""

    def __init__(self, name: str, documentation: str, buckets: Sequence[float]) -> None:
        self._name = name
        self._documentation = documentation
        self._bounds = sorted(float(b) for b in buckets)
        self._counts = [0] * (len(self._bounds) + 1)  # the last one is +Inf
        self._sum = 0.0
        self._lock = threading.Lock()
        REGISTRY.register(self)

    def observe_many(self, values: Sequence[float]) -> None:
        """Count `values` (none below zero): sorted once in C, each bucket's count is then one
        binary search away, instead of a search per value. The sum adds them in their given
        order, as observing them one by one does."""
        ordered = sorted(values)
        within = [bisect.bisect_right(ordered, bound) for bound in self._bounds]  # value <= bound
        within.append(len(ordered))
        counts = [b - a for a, b in zip([0, *within], within, strict=False)]
        total = sum(values)
        with self._lock:
            self._counts = [a + b for a, b in zip(self._counts, counts, strict=True)]
            self._sum += total

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            counts, total = self._counts, self._sum
        cumulative = list(itertools.accumulate(counts))
        labels = [_go_float(b) for b in self._bounds] + ["+Inf"]
        yield HistogramMetricFamily(
            self._name,
            self._documentation,
            buckets=list(zip(labels, cumulative, strict=True)),
            sum_value=total,
        )


INGEST_LAG = BatchHistogram(
    "gpufair_ingest_lag_seconds",
    "How long after it happened an event was stored",
    buckets=(0.1, 0.5, 1, 5, 15, 60, 300, 900, 3600, 86400),
)
EVENTS = Counter("gpufair_events_total", "Ledger events by outcome", ["status"])


def gang_size_label(pods: int) -> str:
    for upper, label in GANG_SIZES:
        if pods <= upper:
            return label
    return "64+"


def observe_cycle(
    pool: str,
    result: CycleResult,
    workloads: Mapping[str, Workload],
    ran_until: Mapping[str, float | None],
    now_s: float,
    duration_s: float,
) -> None:
    """Count a committed Schedule cycle: its decisions, the waits its binds ended (`workloads`
    by uid, from its snapshot) and the first binds among them. `ran_until` holds the bound
    workloads that ran before, with the end of their latest run (`metrics_repo.latest_run_ends`):
    one the batch system preempted and requeued under its uid has waited since then, not since
    its submission, and its bind is not a first one."""
    SCHEDULE_SECONDS.labels(pool).observe(duration_s)
    SCHEDULE_DECISIONS.labels(pool, "bind").inc(len(result.binds))
    SCHEDULE_DECISIONS.labels(pool, "evict").inc(len(result.evicts))
    for reason in EvictReason:  # every reason exported from the first cycle on, at 0 if none
        EVICTIONS.labels(pool, reason.value)
    for evict in result.evicts:
        EVICTIONS.labels(pool, evict.reason.value).inc()
    for bind in result.binds:
        BINDS.labels(pool, bind.queue, bind.gpu_type).inc()
        workload = workloads.get(bind.workload_uid)
        if workload is None:
            continue
        waiting_since_s = max(workload.submit_time_s, ran_until.get(bind.workload_uid) or 0.0)
        wait_s = max(0.0, now_s - waiting_since_s)
        WAIT_SECONDS.labels(pool, bind.queue).observe(wait_s)
        WAIT_BY_TYPE_SECONDS.labels(pool, bind.gpu_type).observe(wait_s)
        if bind.workload_uid not in ran_until:
            FIRST_BIND_SECONDS.labels(pool, gang_size_label(workload.pods)).observe(wait_s)


def observe_job(job: str, failed: bool) -> None:
    """A periodic job's run on this replica; the failures series exists from its first run."""
    counter = JOB_FAILURES.labels(job)
    if failed:
        counter.inc()


# The period of each periodic job in this process's runner (jobs/runner.py says it on every
# tick), exported with the jobs' state gauges (api/state_metrics.py) for the overdue alert.
_JOB_PERIODS: dict[str, float] = {}
_JOB_PERIODS_LOCK = threading.Lock()


def observe_job_period(job: str, period_s: float) -> None:
    """The period this process's job runner gives `job` now."""
    with _JOB_PERIODS_LOCK:
        _JOB_PERIODS[job] = float(period_s)


def job_periods() -> dict[str, float]:
    """Each job's period in this process's runner, by job; empty where no runner runs."""
    with _JOB_PERIODS_LOCK:
        return dict(_JOB_PERIODS)


def observe_events(lags_s: Sequence[float], counts: Mapping[str, int]) -> None:
    """Count a batch of ingested events: the lag of each stored one (one that happened after
    it was stored, within the clock skew allowed, as 0), and outcomes by status."""
    if lags_s and min(lags_s) < 0.0:
        lags_s = [max(0.0, lag) for lag in lags_s]
    INGEST_LAG.observe_many(lags_s)
    for status, n in counts.items():
        EVENTS.labels(status).inc(n)
