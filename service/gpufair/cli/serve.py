"""`gpufair serve`: the gRPC server with its periodic jobs and metrics endpoint, on the database
its options name (the embedded one without a URL), until SIGTERM or SIGINT; with `--processes`
above 1, a group of such servers on one port (`cli/serve_group.py`). Each option `--foo-bar`
may come from `$GPUFAIR_FOO_BAR` instead (`cli/options.py`)."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
import time
from types import FrameType
from typing import TYPE_CHECKING

from gpufair import __version__
from gpufair.cli.arg_types import days, int_in, positive_int, seconds_in
from gpufair.cli.auth import add_serve_auth_options, check_listen, server_credentials
from gpufair.cli.database_commands import add_database_options, quiet_setup_logs
from gpufair.cli.database_errors import resolve
from gpufair.cli.logs import LOG_FORMATS, setup_logging, stop_logging
from gpufair.cli.options import SubCommands
from gpufair.config_file import format_duration_s

if TYPE_CHECKING:  # the store is imported by the commands that use it
    from gpufair.jobs.runner import JobSettings
    from gpufair.store.retention_repo import Retention

log = logging.getLogger("gpufair")

# Retention (`store/retention_repo.py`), days: serve's --<flag>-retention-days, `Retention` field.
_RETENTION_FLAGS = (
    ("event", 180.0, "finished workloads' events (their runs stay)"),
    ("heartbeat", 7.0, "heartbeats but each workload's latest"),
    (
        "rollup",
        400.0,
        "hourly rollups, the ended runs they are made of and capacity changes, pool by pool; "
        "a pool's kept longer while its usage window or the period of a budget on it reads "
        "them (logged once)",
    ),
    ("history", 90.0, "fair-share history (GetFairShare, report.fair_share_history)"),
    ("reply", 7.0, "stored replies of requests with a request id (replays)"),
    ("cycle", 7.0, "recorded Schedule cycles (each pool's newest stays)"),
)

# serve's bounds. A binding held a day is capacity lost for a day if its batch system never
# starts it; a retry's backoff past a day (retention's period) is a retry that never comes.
_MAX_BIND_TIMEOUT_S = 86400.0
_MAX_RETRY_BACKOFF_S = 86400.0
MAX_JOB_ATTEMPTS = 10
# Each recompute thread holds one of the server's database connections (10, and 10 more at
# need, `store/database.py`) for its run: beside the RPCs', the maintenance jobs' and the tick's.
MAX_RECOMPUTE_THREADS = 8


def cmd_serve(args: argparse.Namespace) -> int:
    import prometheus_client

    from gpufair.api.auth import auth_interceptor
    from gpufair.api.server import build_server
    from gpufair.cli.serve_group import run_group, worker_index
    from gpufair.gc_tuning import tune_for_serving
    from gpufair.jobs.runner import JobSettings, PeriodicJobs
    from gpufair.store import database, migrate

    setup_logging(args.log_level, args.log_format, queued=True)
    quiet_setup_logs(args.log_level)
    check_listen(args)
    credentials = server_credentials(args)
    if args.processes > 1:
        try:
            return run_group(args, args.argv)
        finally:
            stop_logging()
    index = worker_index()
    # A worker of a group says its start and stop at DEBUG: the group's parent says them once.
    say = log.info if index is None else log.debug
    try:
        db = resolve(args)
    except BaseException:
        stop_logging()
        raise
    try:
        say("database: %s", db.describe())
        migrate.upgrade(db.url)
        say("schema at revision %s", migrate.current_revision(db.url))
        engine = database.make_engine(db.url)
        auth = auth_interceptor(engine, args.require_tokens)
        running = build_server(
            engine,
            args.address,
            max_workers=args.workers,
            schedule_waiters=args.schedule_waiters,
            interceptors_extra=[auth] if auth else [],
            credentials=credentials,
            # The state gauges are read from the database only where they are exported: in a
            # group (`cli/serve_group.py`), by worker 0 alone.
            metrics_registry=(
                prometheus_client.REGISTRY if args.metrics_address and not index else None
            ),
            health_interval_s=args.health_interval_s,
            reuse_port=index is not None,
            bind_timeout_s=args.bind_timeout_s,
        )
        say("gpufair %s serving gRPC on %s (port %d)", __version__, args.address, running.port)
        tune_for_serving()
        if args.metrics_address:
            host, _, port = args.metrics_address.rpartition(":")
            http, _ = prometheus_client.start_http_server(int(port), addr=host or "127.0.0.1")
            log.info("metrics on http://%s:%d/metrics", host or "127.0.0.1", http.server_port)
        jobs = None
        if not args.no_jobs:
            jobs = PeriodicJobs(engine, job_settings(args, JobSettings))
            jobs.start()
        stop = threading.Event()

        def on_signal(signum: int, _frame: FrameType | None) -> None:
            say("received %s", signal.Signals(signum).name)
            stop.set()

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        # Wake every second: a signal the kernel hands to one of grpc's threads only marks the
        # handler pending, and the main thread runs it when it next wakes, not while it sleeps.
        parent = os.getppid()
        while not stop.wait(timeout=1.0):
            if index is not None and os.getppid() != parent:
                # The group's parent is gone (killed outright): a worker does not serve alone.
                log.error("the serve group's parent %d is gone: stopping", parent)
                break
        stopping = time.monotonic()
        say("shutting down: health NOT_SERVING, %.0f s grace for in-flight calls", args.grace_s)
        if jobs is not None:
            jobs.stop_ticking()  # no new tick while the calls drain
        if not running.stop(args.grace_s):
            log.warning("gRPC calls did not finish within the grace period; exiting without them")
        # A job in progress had the grace period too; past it, its statement is cancelled.
        left_s = max(0.0, stopping + args.grace_s - time.monotonic())
        if jobs is not None and not jobs.stop(left_s):
            log.warning("a periodic job is still running; exiting without it (not committed)")
        engine.dispose()
        say("stopped in %.2f s", time.monotonic() - stopping)
    except BaseException:
        stop_logging()  # the error is main()'s to say, after what was logged
        raise
    finally:
        db.close()
    # Everything of ours is closed. Exit now rather than let the interpreter join threads that
    # grpc may leave behind (seen after a malformed stream message): shutdown stays bounded.
    stop_logging()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def retention_settings(args: argparse.Namespace) -> Retention:
    """The periodic retention's ages, from serve's --*-retention-days options."""
    from gpufair.store.retention_repo import Retention

    return Retention(
        events_days=args.event_retention_days,
        heartbeats_days=args.heartbeat_retention_days,
        rollups_days=args.rollup_retention_days,
        history_days=args.history_retention_days,
        replies_days=args.reply_retention_days,
        cycles_days=args.cycle_retention_days,
    )


def job_settings(args: argparse.Namespace, settings: type[JobSettings]) -> JobSettings:
    """The periodic jobs' settings, from serve's options (`settings` is `JobSettings`, passed
    in: the store is imported by the commands that use it)."""
    return settings(
        tick_s=args.job_tick_s,
        sweep_period_s=args.sweep_period_s,
        stale_after_s=args.stale_after_s,
        retention=retention_settings(args),
        attempts=args.job_attempts,
        retry_backoff_s=args.job_retry_backoff_s,
        recompute_workers=args.recompute_threads,
    )


def add_serve_command(sub: SubCommands) -> argparse.ArgumentParser:
    """Register `serve` on the subcommands of `gpufair`; its parser is returned, for the
    environment's defaults to be added once every option is there."""
    serve = sub.add_parser("serve", help="run the gRPC server")
    serve.add_argument("--address", default="127.0.0.1:50051", help="listen address")
    serve.add_argument(
        "--processes",
        type=positive_int,
        default=os.cpu_count() or 1,
        help="server processes on the one port, the number of cores by default "
        "(cli/serve_group.py)",
    )
    serve.add_argument(
        "--workers", type=int, default=32, help="RPCs that work at once, per process"
    )
    serve.add_argument(
        "--schedule-waiters",
        type=int,
        default=256,  # api/work_slots.py DEFAULT_WAITERS (not imported: the CLI starts lean)
        help="more threads per process, for Schedule callers waiting for a shared cycle "
        "(they hold no work slot and no database connection; api/work_slots.py)",
    )
    serve.add_argument("--grace-s", type=float, default=10.0, help="shutdown grace period")
    serve.add_argument(
        "--metrics-address",
        default="127.0.0.1:9464",
        help="Prometheus endpoint host:port ('' to disable)",
    )
    serve.add_argument(
        "--health-interval-s",
        type=float,
        default=5.0,
        help="how often health probes the database (NOT_SERVING while it does not answer)",
    )
    serve.add_argument(
        "--log-format", choices=LOG_FORMATS, default="text", help="text, or JSON (one per line)"
    )
    serve.add_argument("--no-jobs", action="store_true", help="run no periodic jobs here")
    serve.add_argument("--job-tick-s", type=float, default=10.0, help="how often jobs check")
    serve.add_argument("--sweep-period-s", type=float, default=60.0, help="stale sweep period")
    serve.add_argument(
        "--stale-after-s", type=float, default=600.0, help="close runs silent this long"
    )
    serve.add_argument(
        "--bind-timeout-s",
        "--bind-timeout",
        type=seconds_in(0.0, _MAX_BIND_TIMEOUT_S, low_open=True),
        default=300.0,  # store/schedule_repo.py DEFAULT_BIND_TIMEOUT_S (the CLI starts lean)
        metavar="SECONDS",
        help="a placement Schedule handed out and no started event confirmed is released "
        "this long after (the workload pending again, its GPUs free); seconds or a duration "
        f"(90s, 5m), above 0 and at most {format_duration_s(_MAX_BIND_TIMEOUT_S)}",
    )
    serve.add_argument(
        "--job-attempts",
        type=int_in(1, MAX_JOB_ATTEMPTS),
        default=3,  # jobs/runner.py JobSettings.attempts
        metavar="N",
        help="runs of a periodic job per period at most: the first and N-1 retries of a "
        f"failed run, 1 to {MAX_JOB_ATTEMPTS} (1: no retry)",
    )
    serve.add_argument(
        "--job-retry-backoff-s",
        type=seconds_in(0.0, _MAX_RETRY_BACKOFF_S, low_open=False),
        default=15.0,  # jobs/runner.py JobSettings.retry_backoff_s
        metavar="SECONDS",
        help="wait after a periodic job's failed run before its first retry; each later retry "
        "waits 4 times longer (15 s, then 60 s by default); 0 retries at the next tick; at "
        f"most {format_duration_s(_MAX_RETRY_BACKOFF_S)}",
    )
    serve.add_argument(
        "--recompute-threads",
        type=int_in(1, MAX_RECOMPUTE_THREADS),
        default=2,  # jobs/runner.py JobSettings.recompute_workers
        metavar="N",
        help="threads the pools' periodic recomputes share (the maintenance jobs have their "
        f"own), 1 to {MAX_RECOMPUTE_THREADS}: each holds a database connection while it runs",
    )
    for flag, default, what in _RETENTION_FLAGS:
        serve.add_argument(f"--{flag}-retention-days", type=days, default=default, help=what)
    add_serve_auth_options(serve)
    add_database_options(serve)
    serve.set_defaults(func=cmd_serve)
    return serve
