"""Prometheus metrics: fair shares per queue, RPC counts and latencies, ingest lag.

Exposed over HTTP by `gpufair serve --metrics-address` (default 127.0.0.1:9464).
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

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
INGEST_LAG = Histogram(
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
        DECAYED_USAGE.labels(*labels).set(share.usage_cu_s)
        EFFECTIVE_WEIGHT.labels(*labels).set(share.effective_weight)


def observe_events(now_s: float, stored_at_s: list[float], statuses: list[str]) -> None:
    for at in stored_at_s:
        INGEST_LAG.observe(max(0.0, now_s - at))
    for status in statuses:
        EVENTS.labels(status).inc()
