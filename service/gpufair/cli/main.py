"""The `gpufair` command: serve | migrate | apply | get (config, workloads) | delete | explain |
report | token | simulate."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import FrameType

import grpc
from google.protobuf import json_format

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
from gpufair.cli.report import add_report_commands
from gpufair.cli.slurm_bridge import add_slurm_bridge_command
from gpufair.client import DEFAULT_ADDRESS, GpufairClient, field_violations
from gpufair.config_file import ConfigFileError, load_config_file, message_to_yaml
from gpufair.domain.config_diff import KINDS
from gpufair.render import table
from gpufair.sim.command import add_simulate_command
from gpufair.v1 import cluster_pb2, scheduler_pb2

log = logging.getLogger("gpufair")

ADDRESS_ENV = "GPUFAIR_ADDRESS"
_ACTIONS = {
    cluster_pb2.CHANGE_ACTION_CREATE: "create",
    cluster_pb2.CHANGE_ACTION_UPDATE: "update",
    cluster_pb2.CHANGE_ACTION_DELETE: "delete",
}


class UserError(Exception):
    """A mistake of the user's: printed as one clear message, exit code 2."""


def _setup_logging(level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    # One line per job tick at INFO would drown the service's own lines.
    logging.getLogger("apscheduler").setLevel(logging.WARNING)


# ---- serve / migrate -------------------------------------------------------------------------


def cmd_serve(args: argparse.Namespace) -> int:
    import prometheus_client

    from gpufair.api.auth import auth_interceptor
    from gpufair.api.server import build_server
    from gpufair.gc_tuning import tune_for_serving
    from gpufair.jobs.runner import JobSettings, PeriodicJobs
    from gpufair.store import database, migrate
    from gpufair.store.retention_repo import Retention

    _setup_logging(args.log_level)
    check_listen(args)
    credentials = server_credentials(args)
    db = database.resolve(args.database_url, Path(args.data_dir) if args.data_dir else None)
    try:
        log.info("database: %s", db.describe())
        migrate.upgrade(db.url)
        engine = database.make_engine(db.url)
        auth = auth_interceptor(engine, args.require_tokens)
        running = build_server(
            engine,
            args.address,
            max_workers=args.workers,
            interceptors_extra=[auth] if auth else [],
            credentials=credentials,
        )
        log.info("gpufair %s serving gRPC on %s (port %d)", __version__, args.address, running.port)
        tune_for_serving()
        if args.metrics_address:
            host, _, port = args.metrics_address.rpartition(":")
            prometheus_client.start_http_server(int(port), addr=host or "127.0.0.1")
            log.info("metrics on http://%s/metrics", args.metrics_address)
        jobs = None
        if not args.no_jobs:
            jobs = PeriodicJobs(
                engine,
                JobSettings(
                    tick_s=args.job_tick_s,
                    sweep_period_s=args.sweep_period_s,
                    stale_after_s=args.stale_after_s,
                    retention=Retention(
                        events_days=args.event_retention_days,
                        rollups_days=args.rollup_retention_days,
                    ),
                ),
            )
            jobs.start()
        stop = threading.Event()

        def on_signal(signum: int, _frame: FrameType | None) -> None:
            log.info("received %s", signal.Signals(signum).name)
            stop.set()

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        stop.wait()
        stopping = time.monotonic()
        log.info(
            "shutting down: health NOT_SERVING, %.0f s grace for in-flight calls", args.grace_s
        )
        if jobs is not None:
            jobs.stop_ticking()  # no new tick while the calls drain
        if not running.stop(args.grace_s):
            log.warning("gRPC calls did not finish within the grace period; exiting without them")
        # A job in progress had the grace period too; past it, its statement is cancelled.
        left_s = max(0.0, stopping + args.grace_s - time.monotonic())
        if jobs is not None and not jobs.stop(left_s):
            log.warning("a periodic job is still running; exiting without it (not committed)")
        engine.dispose()
        log.info("stopped in %.2f s", time.monotonic() - stopping)
    finally:
        db.close()
    # Everything of ours is closed. Exit now rather than let the interpreter join threads that
    # grpc may leave behind (seen after a malformed stream message): shutdown stays bounded.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def cmd_migrate(args: argparse.Namespace) -> int:
    from gpufair.store import database, migrate

    _setup_logging(args.log_level)
    db = database.resolve(args.database_url, Path(args.data_dir) if args.data_dir else None)
    try:
        migrate.upgrade(db.url)
        print(f"{db.describe()}: schema at revision {migrate.current_revision(db.url)}")
        if args.check:
            migrate.check(db.url)
            print("tables and migrations agree")
    finally:
        db.close()
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


def _kinds(value: str) -> list[str]:
    """`--kinds queue,budget` (gpu-type or gpu_type alike)."""
    kinds = [k.strip().replace("-", "_") for k in value.split(",") if k.strip()]
    unknown = [k for k in kinds if k not in KINDS]
    if unknown or not kinds:
        raise argparse.ArgumentTypeError(
            f"{', '.join(unknown) or 'nothing'}: name kinds among {', '.join(KINDS)}"
        )
    return kinds


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
                "WINDOW S",
                "HALF-LIFE S",
                "K",
                "USAGE BASIS",
                "ROUNDING",
                "PLACEMENT",
            ],
            [
                (
                    p.name,
                    cluster_pb2.WindowKind.Name(p.policy.window_kind)
                    .removeprefix("WINDOW_KIND_")
                    .lower(),
                    p.policy.window_s,
                    p.policy.half_life_s if p.policy.HasField("half_life_s") else "-",
                    p.policy.k,
                    cluster_pb2.UsageBasis.Name(p.policy.usage_basis)
                    .removeprefix("USAGE_BASIS_")
                    .lower(),
                    cluster_pb2.Rounding.Name(p.policy.rounding).removeprefix("ROUNDING_").lower(),
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
    return 0


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
            print(message_to_yaml(listing), end="")
        else:
            print(json_format.MessageToJson(listing, preserving_proto_field_name=True))
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
                    w.workload.pods * w.workload.gpus_per_pod,
                    _age(now - w.workload.submit_time.ToNanoseconds() / 1e9),
                )
                for w in found
            ],
        )
    )
    if not found:
        print("no workloads")
    return 0


def cmd_explain(args: argparse.Namespace) -> int:
    with _client(args) as client:
        reply = client.explain(args.uid)
    print(f"{reply.uid}: {reply.state}" + (f" ({reply.reason_code})" if reply.reason_code else ""))
    print(reply.message)
    if reply.state == "pending":
        print(f"needs {reply.needs_cu:g} CU; its queue may take {reply.queue_may_take_cu:g} CU now")
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
                        round(q.deserved_cu, 3),
                        round(q.fair_share_cu, 3),
                        round(q.allocated_cu, 3),
                        round(q.weight_share, 4),
                        round(q.usage_share, 4),
                        round(q.priority_weight, 4),
                    )
                ],
            )
        )
    return 0


def cmd_delete(args: argparse.Namespace) -> int:
    kind = args.kind.replace("-", "_")
    with _client(args) as client:
        reply = client.delete_objects(kind, args.names, dry_run=args.dry_run)
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
    p.add_argument("--timeout-s", type=float, default=30.0, help="deadline per call")
    add_auth_client_options(p)


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
    serve.add_argument("--workers", type=int, default=32, help="RPC worker threads")
    serve.add_argument("--grace-s", type=float, default=10.0, help="shutdown grace period")
    serve.add_argument(
        "--metrics-address",
        default="127.0.0.1:9464",
        help="Prometheus endpoint host:port ('' to disable)",
    )
    serve.add_argument("--no-jobs", action="store_true", help="run no periodic jobs here")
    serve.add_argument("--job-tick-s", type=float, default=10.0, help="how often jobs check")
    serve.add_argument("--sweep-period-s", type=float, default=60.0, help="stale sweep period")
    serve.add_argument(
        "--stale-after-s", type=float, default=600.0, help="close runs silent this long"
    )
    serve.add_argument("--event-retention-days", type=float, default=180.0)
    serve.add_argument("--rollup-retention-days", type=float, default=400.0)
    add_serve_auth_options(serve)
    _add_database_options(serve)
    serve.set_defaults(func=cmd_serve)

    mig = sub.add_parser("migrate", help="create or upgrade the database schema")
    mig.add_argument("--check", action="store_true", help="also check tables against migrations")
    _add_database_options(mig)
    mig.set_defaults(func=cmd_migrate)
    add_token_commands(sub, _add_database_options)

    apply = sub.add_parser("apply", help="make the cluster config equal a YAML file")
    apply.add_argument("-f", "--file", required=True, help="cluster config YAML")
    apply.add_argument("--dry-run", action="store_true", help="show the diff, write nothing")
    apply.add_argument(
        "--kinds",
        type=_kinds,
        default=None,
        help="own only these kinds (comma list of gpu-type, pool, node, queue, budget): "
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
    get_config.add_argument("-o", "--output", choices=["table", "yaml"], default="table")
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
    get_workloads.add_argument("-o", "--output", choices=["table", "yaml", "json"], default="table")
    _add_client_options(get_workloads)
    get_workloads.set_defaults(func=cmd_get_workloads)

    add_report_commands(sub, _add_client_options)

    explain = sub.add_parser("explain", help="why a workload waits (or what became of it)")
    explain.add_argument("uid")
    _add_client_options(explain)
    explain.set_defaults(func=cmd_explain)

    delete = sub.add_parser("delete", help="delete config objects by name")
    delete.add_argument("kind", choices=["gpu-type", "pool", "node", "queue", "budget"])
    delete.add_argument("names", nargs="+")
    delete.add_argument("--dry-run", action="store_true")
    _add_client_options(delete)
    delete.set_defaults(func=cmd_delete)

    add_slurm_bridge_command(sub, _add_client_options)
    return parser


def _describe_rpc_error(exc: grpc.RpcError) -> str:
    code = exc.code() if isinstance(exc, grpc.Call) else None
    details = exc.details() if isinstance(exc, grpc.Call) else str(exc)
    if code == grpc.StatusCode.UNAVAILABLE:
        return f"cannot reach gpufair or its database: {details}"
    lines = [f"{code.name if code else 'error'}: {details}"]
    lines += [f"  - {f}: {d}" for f, d in field_violations(exc)]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    func: Callable[[argparse.Namespace], int] = args.func
    try:
        return func(args)
    except (UserError, ConfigFileError, AuthSetupError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except grpc.RpcError as exc:
        print(f"error: {_describe_rpc_error(exc)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
