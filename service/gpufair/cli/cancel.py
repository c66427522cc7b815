"""`gpufair cancel`: withdraw workloads by uid, saying per uid what the call found.

    gpufair cancel demo-1 demo-2
    demo-1: cancelled (was pending)
    demo-2: running: it keeps its GPUs until the batch system stops it

Only pending or bound work changes (CancelWorkload); running work is the batch system's to stop,
and its usage counts until that system reports it stopped. Exit 0 when every uid was known, 1
when one was not (or the server refused it), 2 on a usage error. Each uid is its own call with
its own request id, so a retried call cancels once. Registered by cli/main.py through
`add_cancel_command`.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

import grpc

from gpufair.cli.client_options import connect
from gpufair.cli.options import SubCommands, add_output_option, emit_rows
from gpufair.client import GpufairClient, field_violations
from gpufair.v1 import scheduler_pb2

_NOT_CHANGED = {
    "running": "running: it keeps its GPUs until the batch system stops it",
    "finished": "already finished",
    "cancelled": "already cancelled",
}


def outcome(reply: scheduler_pb2.CancelWorkloadResponse) -> str:
    """What a CancelWorkload reply says, in words."""
    before = reply.previous_state
    if reply.was_pending:
        return f"cancelled (was {before})" if before else "cancelled"
    # An empty previous state: the replay of a reply stored before the field existed.
    return _NOT_CHANGED.get(before, f"not cancelled (was {before or 'not pending'})")


def _refused(exc: grpc.RpcError) -> str:
    """A refusal of one uid (INVALID_ARGUMENT) as words for its line."""
    violations = "; ".join(f"{f}: {d}" for f, d in field_violations(exc))
    details = exc.details() if isinstance(exc, grpc.Call) else ""
    return f"refused: {violations or details}"


def cancel_one(client: GpufairClient, uid: str) -> dict[str, Any]:
    """Cancel `uid`: its row of the output. NOT_FOUND and INVALID_ARGUMENT are this uid's
    answer; any other error (the server unreachable, a role that may not cancel) ends the
    command."""
    row: dict[str, Any] = {"uid": uid, "found": True, "was_pending": False, "previous_state": ""}
    try:
        reply = client.cancel_workload(uid)
    except grpc.RpcError as exc:
        code = exc.code() if isinstance(exc, grpc.Call) else None
        if code == grpc.StatusCode.NOT_FOUND:
            return {**row, "found": False, "result": "not found"}
        if code == grpc.StatusCode.INVALID_ARGUMENT:
            return {**row, "found": False, "result": _refused(exc)}
        raise
    row.update(was_pending=reply.was_pending, previous_state=reply.previous_state)
    return {**row, "result": outcome(reply)}


def cmd_cancel(args: argparse.Namespace) -> int:
    uids = list(dict.fromkeys(args.uids))  # a uid given twice is cancelled once
    rows = []
    with connect(args) as client:
        for uid in uids:
            row = cancel_one(client, uid)
            rows.append(row)
            if args.output == "table":
                shown = uid if uid.isprintable() else repr(uid)  # one line per uid
                print(f"{shown}: {row['result']}", flush=True)
    emit_rows(args.output, rows, lambda: None)
    return 0 if all(row["found"] for row in rows) else 1


def add_cancel_command(
    sub: SubCommands, add_client_options: Callable[[argparse.ArgumentParser], None]
) -> None:
    """Register `cancel` on the subcommands of `gpufair`."""
    cancel = sub.add_parser(
        "cancel",
        help="cancel workloads by uid (pending or bound ones; running ones are the batch "
        "system's to stop)",
        description="Cancel each workload and say what was found: cancelled (was pending or "
        "bound), running (it keeps its GPUs until the batch system stops it), already "
        "finished or cancelled, or not found. Exit 1 when any uid was not found.",
    )
    cancel.add_argument("uids", nargs="+", metavar="UID", help="a workload's uid")
    add_output_option(cancel)
    add_client_options(cancel)
    cancel.set_defaults(func=cmd_cancel)
