"""`gpufair get workloads` and `gpufair explain`: workloads with their state, reason and place in
their queue, and why one waits (or what became of it)."""

from __future__ import annotations

import argparse
import time

from gpufair.cli.client_options import add_client_options, connect
from gpufair.cli.options import SubCommands, add_output_option, emit, message_json, message_yaml
from gpufair.render import fmt_number, table
from gpufair.v1 import scheduler_pb2


def _age(seconds: float) -> str:
    """A duration as people read it at a glance: 45s, 12m, 3h, 5d."""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit}"
    return f"{max(0, int(seconds))}s"


def cmd_get_workloads(args: argparse.Namespace) -> int:
    states = [s for value in args.state or () for s in value.split(",") if s]
    with connect(args) as client:
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
    with connect(args) as client:
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


def add_workload_commands(
    sub: SubCommands,
    get_sub: SubCommands,
) -> None:
    """Register `get workloads` (on `get`'s subcommands) and `explain`."""
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
    add_client_options(get_workloads)
    get_workloads.set_defaults(func=cmd_get_workloads)

    explain = sub.add_parser("explain", help="why a workload waits (or what became of it)")
    explain.add_argument("uid")
    add_output_option(explain)
    add_client_options(explain)
    explain.set_defaults(func=cmd_explain)
