"""`gpufair slurm-bridge --config FILE [--address A] [--once] [--metrics-address HOST:PORT]`: the
bridge as a long-running loop.

One cycle per `cycle_s` of the mapping file. A cycle that fails (gpufair unreachable, a Slurm
command failing) is logged and the next one starts on time: the bridge keeps no state, so a failed
cycle leaves nothing half-remembered. SIGTERM or SIGINT ends the loop after the current cycle.
`--once` runs one cycle and exits 0, or 1 if it failed or any step of it did (a Slurm command, an
event gpufair refused, a node it could not prune yet): each is logged as a warning.
`--metrics-address` serves Prometheus metrics of the cycles (integrations/slurm/bridge_metrics.py).
"""

from __future__ import annotations

import argparse
import logging
import signal
import threading
import time
from collections.abc import Callable
from types import FrameType

import grpc

from gpufair.cli.client_options import connect
from gpufair.cli.options import SubCommands
from gpufair.integrations.slurm.bridge import Bridge, CycleReport
from gpufair.integrations.slurm.bridge_metrics import BridgeMetrics
from gpufair.integrations.slurm.config import load_config
from gpufair.integrations.slurm.slurmctl import SlurmCommandError, SlurmCtl

log = logging.getLogger("gpufair.slurm_bridge")


def _summary(report: CycleReport) -> str:
    parts = [
        f"submitted {len(report.submitted)}",
        f"placed {len(report.placed)}",
        f"requeued {len(report.requeued)}",
        f"cancelled {len(report.cancelled)}",
        f"unmappable {len(report.unmappable)}",
        "events "
        + (", ".join(f"{k.lower()} {v}" for k, v in sorted(report.events.items())) or "0"),
    ]
    return "; ".join(parts)


def run_bridge(
    bridge: Bridge,
    *,
    once: bool,
    stop: threading.Event,
    metrics: BridgeMetrics | None = None,
) -> int:
    while True:
        started = time.monotonic()
        ok = True
        try:
            report = bridge.cycle()
            ok = not report.errors
            if metrics is not None:
                metrics.cycle_ran(report, time.monotonic() - started, time.time())
            if report.busy():
                log.info("cycle: %s", _summary(report))
            for error in report.errors:
                log.warning("%s", error)
        except (grpc.RpcError, SlurmCommandError) as exc:
            ok = False
            if metrics is not None:
                metrics.cycle_failed(time.monotonic() - started)
            details = exc.details() if isinstance(exc, grpc.Call) else str(exc)
            log.error("cycle failed: %s", details)
        if once:
            return 0 if ok else 1
        if stop.wait(max(0.0, bridge.config.cycle_s - (time.monotonic() - started))):
            return 0


def cmd_slurm_bridge(args: argparse.Namespace) -> int:
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(message)s")
    config = load_config(args.config)
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    metrics = None
    if args.metrics_address:
        metrics = BridgeMetrics()
        http = metrics.serve(args.metrics_address)
        log.info("metrics on http://%s:%d/metrics", http.server_address[0], http.server_port)
    with connect(args) as client:
        bridge = Bridge(config, client, SlurmCtl(config.slurm_bin))
        return run_bridge(bridge, once=args.once, stop=stop, metrics=metrics)


def add_slurm_bridge_command(
    sub: SubCommands, add_client_options: Callable[[argparse.ArgumentParser], None]
) -> None:
    bridge = sub.add_parser(
        "slurm-bridge", help="make gpufair place the jobs of a Slurm cluster (see docs/slurm.md)"
    )
    bridge.add_argument("--config", required=True, help="the bridge's mapping file (YAML)")
    bridge.add_argument(
        "--once", action="store_true", help="run one cycle and exit (1 if any step of it failed)"
    )
    bridge.add_argument(
        "--metrics-address",
        default="",
        metavar="HOST:PORT",
        help="serve Prometheus metrics of the cycles at http://HOST:PORT/metrics (default: off)",
    )
    bridge.add_argument("--log-level", default="info", choices=["debug", "info", "warning"])
    add_client_options(bridge)
    bridge.set_defaults(func=cmd_slurm_bridge)
