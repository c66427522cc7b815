"""Prometheus metrics of `gpufair slurm-bridge`, served by `--metrics-address HOST:PORT` (off by
default): whether its cycles run, how long they take, and what they did.

- `gpufair_slurm_bridge_cycles_total{outcome}`: `ok`; `partial`, the cycle ran to its end but a
  step of it failed (a Slurm command on one job, an event gpufair refused); `failed`, the cycle
  stopped (gpufair unreachable, `squeue` or `sinfo` failing).
- `gpufair_slurm_bridge_cycle_duration_seconds`: every cycle, failed ones too.
- `gpufair_slurm_bridge_last_success_timestamp_seconds`: the end of the latest cycle that ran to
  its end (ok or partial: one job's error repeated every cycle is not a stalled bridge, and
  counts in `errors_total`); 0 until one has. What the stall alert reads.
- `gpufair_slurm_bridge_jobs_total{action}`: jobs per cycle that reported them, so a job left
  unmappable counts once per cycle it is seen.
- `gpufair_slurm_bridge_events_total{status}`: ledger events sent, by gpufair's answer
  (`stored`, `duplicate`, `rejected`).
- `gpufair_slurm_bridge_errors_total`: what the loop logs as a warning or an error: each failed
  step of a cycle, and each failed cycle.

The bridge's own registry (not the process-wide one `gpufair serve` exports), with process
metrics beside it, and no `_created` series, as `gpufair.metrics` has it.
"""

from __future__ import annotations

from wsgiref.simple_server import WSGIServer

import prometheus_client
from prometheus_client import (
    PROCESS_COLLECTOR,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
)

from gpufair.integrations.slurm.bridge import CycleReport

prometheus_client.disable_created_metrics()  # type: ignore[no-untyped-call]

ACTIONS = ("submitted", "placed", "requeued", "cancelled", "withdrawn", "unmappable")


class BridgeMetrics:
    """One bridge's metrics in a registry of their own (a test makes one per bridge)."""

    def __init__(self, *, process: bool = True) -> None:
        self.registry = CollectorRegistry()
        if process and PROCESS_COLLECTOR is not None:
            ProcessCollector(registry=self.registry)
        r = self.registry
        self.cycles = Counter(
            "gpufair_slurm_bridge_cycles", "Bridge cycles, by outcome", ["outcome"], registry=r
        )
        self.duration = Histogram(
            "gpufair_slurm_bridge_cycle_duration_seconds",
            "Duration of a bridge cycle (failed ones too)",
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120),
            registry=r,
        )
        self.last_success = Gauge(
            "gpufair_slurm_bridge_last_success_timestamp_seconds",
            "When the latest bridge cycle that ran to its end (ok or partial) ended",
            registry=r,
        )
        self.jobs = Counter(
            "gpufair_slurm_bridge_jobs",
            "Jobs acted on by bridge cycles, by action",
            ["action"],
            registry=r,
        )
        self.events = Counter(
            "gpufair_slurm_bridge_events",
            "Ledger events the bridge sent, by gpufair's answer",
            ["status"],
            registry=r,
        )
        self.errors = Counter(
            "gpufair_slurm_bridge_errors",
            "Failed steps of bridge cycles, and failed cycles",
            registry=r,
        )
        # Every series from the start, so a rate over them is 0, not absent.
        for outcome in ("ok", "partial", "failed"):
            self.cycles.labels(outcome)
        for action in ACTIONS:
            self.jobs.labels(action)

    def cycle_ran(self, report: CycleReport, duration_s: float, ended_s: float) -> None:
        self.cycles.labels("partial" if report.errors else "ok").inc()
        self.duration.observe(duration_s)
        self.last_success.set(ended_s)
        counts = {
            "submitted": len(report.submitted),
            "placed": len(report.placed),
            "requeued": len(report.requeued),
            "cancelled": len(report.cancelled),
            "withdrawn": len(report.withdrawn),
            "unmappable": len(report.unmappable),
        }
        for action, count in counts.items():
            self.jobs.labels(action).inc(count)
        for status, count in report.events.items():
            self.events.labels(status.lower()).inc(count)
        self.errors.inc(len(report.errors))

    def cycle_failed(self, duration_s: float) -> None:
        self.cycles.labels("failed").inc()
        self.duration.observe(duration_s)
        self.errors.inc()

    def serve(self, address: str) -> WSGIServer:
        """Serve the registry over HTTP at `HOST:PORT` (an empty host is 127.0.0.1; port 0 picks
        a free one: the server's `server_port`). Shut it down with `.shutdown()`."""
        host, _, port = address.rpartition(":")
        server, _ = prometheus_client.start_http_server(
            int(port), addr=host or "127.0.0.1", registry=self.registry
        )
        return server
