"""Prometheus metrics: fair shares per queue, RPC counts and latencies, ingest lag.

Exposed over HTTP by `gpufair serve --metrics-address` (default 127.0.0.1:9464).
"""

from __future__ import annotations

import bisect
import itertools
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence

from prometheus_client import REGISTRY, Counter, Gauge, Histogram
from prometheus_client.core import HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from gpufair.domain.fairshare import FairShareResult

FAIR_SHARE = Gauge("gpufair_fair_share_cu", "Fair share of a queue", ["pool", "queue"])
ALLOCATED = Gauge("gpufair_allocated_cu", "CU a queue holds now", ["pool", "queue"])
DECAYED_USAGE = Gauge(
    "gpufair_decayed_usage_cu_seconds", "Decayed usage under the pool's basis", ["pool", "queue"]
)
EFFECTIVE_WEIGHT = Gauge(
    "gpufair_effective_weight", "Effective over-quota weight after history", ["pool", "queue"]
)
RPCS = Counter("gpufair_rpcs_total", "RPCs handled", ["method", "code"])
RPC_SECONDS = Histogram(
    "gpufair_rpc_seconds",
    "RPC latency",
    ["method"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
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

    def observe_many(self, values: Iterable[float]) -> None:
        counts = [0] * len(self._counts)
        total = 0.0
        bounds = self._bounds
        for value in values:
            counts[bisect.bisect_left(bounds, value)] += 1  # bucket `le` bound: value <= bound
            total += value
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


def observe_fair_shares(result: FairShareResult) -> None:
    for share in result.shares.values():
        labels = (result.pool, share.queue)
        FAIR_SHARE.labels(*labels).set(share.fair_share_cu)
        ALLOCATED.labels(*labels).set(share.allocated_cu)
        DECAYED_USAGE.labels(*labels).set(share.decayed_usage_cu_s)
        EFFECTIVE_WEIGHT.labels(*labels).set(share.effective_weight)


def observe_events(lags_s: Iterable[float], counts: Mapping[str, int]) -> None:
    """Count a batch of ingested events: the lag of each stored one, and outcomes by status."""
    INGEST_LAG.observe_many(max(0.0, lag) for lag in lags_s)
    for status, n in counts.items():
        EVENTS.labels(status).inc(n)
