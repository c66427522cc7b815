"""`gpufair apply`, `gpufair get config` and `gpufair delete`: the cluster config as a YAML file
people keep in version control (`config_file.py`), and the changes each call made or would make.
`apply --kinds` and `delete` take a kind in the same spellings: singular or plural, with - or _,
any case (gpu-types, gpu_type, Pools, ...)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import grpc

from gpufair.cli.client_options import add_client_options, connect
from gpufair.cli.options import SubCommands, add_output_option, emit
from gpufair.config_file import format_duration_s, load_config_file, message_to_yaml
from gpufair.domain.config_diff import KINDS
from gpufair.render import table
from gpufair.v1 import cluster_pb2

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


def _print_changes(changes: Sequence[cluster_pb2.ConfigChange]) -> None:
    if not changes:
        print("no changes")
        return
    for change in changes:
        print(f"{_ACTIONS.get(change.action, '?'):>6} {change.kind} {change.name}")
        for f in change.fields:
            print(f"         {f.field}: {f.before or '(unset)'} -> {f.after or '(unset)'}")


def _kinds(value: str) -> list[str]:
    """`--kinds queues,budgets` in `delete`'s spellings, each kind once (queue,queues is one)."""
    named = [k.strip() for k in value.split(",") if k.strip()]
    unknown = [k for k in named if k.lower() not in _KIND_SPELLINGS]
    if unknown or not named:
        raise argparse.ArgumentTypeError(
            f"{', '.join(unknown) or 'nothing'}: name kinds among {_KINDS_HELP}"
        )
    return list(dict.fromkeys(_KIND_SPELLINGS[k.lower()] for k in named))


def _delete_kind(value: str) -> str:
    kind = _KIND_SPELLINGS.get(value.lower())
    if kind is None:
        raise argparse.ArgumentTypeError(f"{value!r} is not a kind; name one of {_KINDS_HELP}")
    return kind


def cmd_apply(args: argparse.Namespace) -> int:
    config = load_config_file(Path(args.file))
    with connect(args) as client:
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
    with connect(args) as client:
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


def cmd_delete(args: argparse.Namespace) -> int:
    kind = args.kind
    # Each name once, as `drain` sends them: the server refuses a name listed twice.
    names = list(dict.fromkeys(args.names))
    with connect(args) as client:
        reply = client.delete_objects(kind, names, dry_run=args.dry_run)
    _print_changes(reply.changes)
    print(
        "dry run: nothing deleted"
        if args.dry_run
        else f"applied: config version {reply.config_version}"
    )
    return 0


def add_config_commands(
    sub: SubCommands,
    get_sub: SubCommands,
) -> None:
    """Register `apply`, `get config` (on `get`'s subcommands) and `delete`."""
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
    add_client_options(apply)
    apply.set_defaults(func=cmd_apply)

    get_config = get_sub.add_parser("config", help="the cluster config")
    add_output_option(get_config)
    add_client_options(get_config)
    get_config.set_defaults(func=cmd_get_config)

    delete = sub.add_parser("delete", help="delete config objects by name")
    delete.add_argument(
        "kind",
        type=_delete_kind,
        metavar="KIND",
        help=f"one of {_KINDS_HELP}, as `apply --kinds` takes them",
    )
    delete.add_argument("names", nargs="+")
    delete.add_argument("--dry-run", action="store_true")
    add_client_options(delete)
    delete.set_defaults(func=cmd_delete)
