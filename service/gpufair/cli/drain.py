"""`gpufair drain` and `gpufair undrain`: take nodes out of placement for maintenance, and back.

    gpufair drain a1 a2 --dry-run
    update node a1
             ready: true -> false
    a2: already drained
    a1: still there: running train-7, bound eval-2 (they keep their GPUs until the batch system stops them)
    dry run: nothing written (config version stays 7)

A drained node (ready false, ClusterAdmin.SetNodesReady) takes no new binds from the next
`Schedule`; what runs on it keeps running until the batch system stops it. Like `apply`: a
`--dry-run` shows the diff, `--expected-version N` writes only at that config version (else a
conflict, exit 1). Every name must be a stored node, or nothing is written and the unknown ones
are named (exit 1). In the table output, a drain names the work still bound or running on each
node (`ListWorkloads`): what the operator waits for, or stops in the batch system. Registered by
cli/main.py through `add_drain_commands`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

import grpc

from gpufair.cli.client_options import connect
from gpufair.cli.options import SubCommands, add_output_option, emit
from gpufair.client import GpufairClient
from gpufair.v1 import cluster_pb2

_ACTIONS = {
    cluster_pb2.CHANGE_ACTION_CREATE: "create",
    cluster_pb2.CHANGE_ACTION_UPDATE: "update",
    cluster_pb2.CHANGE_ACTION_DELETE: "delete",
}


def unknown_nodes(client: GpufairClient, names: Sequence[str]) -> list[str]:
    """The names that are no stored node (the server's NOT_FOUND names only the first)."""
    known = {node.name for node in client.get_config().config.nodes}
    return [name for name in names if name not in known]


def work_on(client: GpufairClient, names: Sequence[str]) -> dict[str, list[tuple[str, str]]]:
    """(state, uid) of the bound and running workloads with a pod on each of `names`, by node,
    in the order the nodes were named."""
    wanted = set(names)
    found: dict[str, list[tuple[str, str]]] = {}
    for status in client.list_workloads(states=["running", "bound"]):
        for node in dict.fromkeys(pod.node for pod in status.pods):
            if node in wanted:
                found.setdefault(node, []).append((status.state, status.workload.uid))
    return {name: found[name] for name in names if name in found}


def print_outcome(
    reply: cluster_pb2.SetNodesReadyResponse,
    names: Sequence[str],
    ready: bool,
    still_there: dict[str, list[tuple[str, str]]],
) -> None:
    changed = {change.name for change in reply.changes}
    for change in reply.changes:
        print(f"{_ACTIONS.get(change.action, '?'):>6} {change.kind} {change.name}")
        for f in change.fields:
            print(f"         {f.field}: {f.before or '(unset)'} -> {f.after or '(unset)'}")
    for name in names:
        if name not in changed:
            print(f"{name}: already {'ready' if ready else 'drained'}")
    for name, held in still_there.items():
        listed = ", ".join(f"{state} {uid}" for state, uid in held)
        print(
            f"{name}: still there: {listed} (they keep their GPUs until the batch system stops them)"
        )
    if reply.applied:
        print(f"applied: config version {reply.config_version}")
    else:
        print(f"dry run: nothing written (config version stays {reply.config_version})")


def cmd_set_ready(args: argparse.Namespace) -> int:
    ready = args.command == "undrain"
    names = list(dict.fromkeys(args.nodes))
    with connect(args) as client:
        try:
            reply = client.set_nodes_ready(
                names, ready, dry_run=args.dry_run, expected_version=args.expected_version
            )
        except grpc.RpcError as exc:
            code = exc.code() if isinstance(exc, grpc.Call) else None
            details = (exc.details() if isinstance(exc, grpc.Call) else "") or ""
            if code == grpc.StatusCode.NOT_FOUND:
                unknown = unknown_nodes(client, names) or [details]
                print(
                    f"error: no node named {', '.join(unknown)}: nothing was changed "
                    "(gpufair get config lists the nodes)",
                    file=sys.stderr,
                )
                return 1
            if code == grpc.StatusCode.FAILED_PRECONDITION and details.startswith(
                "config version is"
            ):
                print(f"error: conflict: {details}", file=sys.stderr)
                return 1
            raise
        still_there = work_on(client, names) if not ready and args.output == "table" else {}
    emit(args.output, reply, lambda: print_outcome(reply, names, ready, still_there))
    return 0


def add_drain_commands(
    sub: SubCommands, add_client_options: Callable[[argparse.ArgumentParser], None]
) -> None:
    """Register `drain` and `undrain` on the subcommands of `gpufair`."""
    for command, summary, description in (
        (
            "drain",
            "take nodes out of placement (maintenance): no new work goes there",
            "Mark nodes not ready: the next Schedule binds nothing there. Work running there "
            "keeps running until the batch system stops it.",
        ),
        (
            "undrain",
            "make drained nodes take work again",
            "Mark nodes ready: the next Schedule may bind work there.",
        ),
    ):
        p = sub.add_parser(command, help=summary, description=description)
        p.add_argument("nodes", nargs="+", metavar="NODE", help="a node's name")
        p.add_argument("--dry-run", action="store_true", help="show the diff, write nothing")
        p.add_argument(
            "--expected-version",
            type=int,
            default=None,
            metavar="N",
            help="write only if the stored config version is N (else a conflict, exit 1)",
        )
        add_output_option(p)
        add_client_options(p)
        p.set_defaults(func=cmd_set_ready)
