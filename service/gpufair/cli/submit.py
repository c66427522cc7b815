"""`gpufair submit`: one workload by hand, for a first look or a test of a queue.

    gpufair submit demo-1 --queue vision --pods 8 --gpus-per-pod 4
    gpufair submit big-1 --queue llm --pool main --gpu-type a100-80gb --min-runtime 1h30m
    gpufair submit nb-1 --queue research --partition-profile 1g.10gb
    gpufair submit sweep-1 --queue research --compute-units 20 --gpu-type a100-80gb

The workload waits for a `Schedule` cycle of its pool, which a batch system's adapter asks for
(examples/batch_adapter.py); `gpufair get workloads` and `gpufair explain` show where it stands.
Registered by cli/main.py through `add_submit_command`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from gpufair.cli.client_options import connect
from gpufair.cli.options import SubCommands
from gpufair.cli.report import default_pool
from gpufair.config_file import duration_seconds
from gpufair.render import fmt_number
from gpufair.v1 import scheduler_pb2


def cmd_submit(args: argparse.Namespace) -> int:
    with connect(args) as client:
        pool = default_pool(client, args.pool)
        by_cu = args.compute_units > 0
        shared = by_cu or bool(args.partition_profile)  # the share or the count comes later
        workload = scheduler_pb2.Workload(
            uid=args.uid,
            queue=args.queue,
            pool=pool,
            pods=0 if by_cu else args.pods,
            gpus_per_pod=0.0 if shared and args.gpus_per_pod is None else args.gpus_per_pod or 1.0,
            partition_profile=args.partition_profile,
            compute_units=args.compute_units,
            allowed_gpu_types=args.gpu_type or [],
            priority_class=args.priority_class,
            min_runtime_s=args.min_runtime,
        )
        if args.min_pods is not None:
            workload.min_pods = args.min_pods
        reply = client.submit_workloads([workload])
    (result,) = reply.results
    if not result.accepted:
        print(f"error: {result.uid} not accepted: {result.error}", file=sys.stderr)
        return 1
    if args.compute_units > 0:
        asked = f"{fmt_number(args.compute_units)} CU"
    elif args.partition_profile:
        asked = f"{args.pods} × {args.partition_profile} partition"
    else:
        asked = f"{fmt_number(args.pods * (args.gpus_per_pod or 1.0))} GPUs"
    print(f"submitted {result.uid}: {asked} in queue {args.queue}, pool {pool}")
    return 0


def _duration(value: str) -> float:
    seconds = duration_seconds(value)
    if seconds is None:
        raise argparse.ArgumentTypeError(f"{value!r} is not a duration (e.g. 90s, 30m, 1h30m)")
    return seconds


def add_submit_command(
    sub: SubCommands, add_client_options: Callable[[argparse.ArgumentParser], None]
) -> None:
    """Register `submit` on the subcommands of `gpufair`."""
    submit = sub.add_parser(
        "submit",
        help="submit one workload by hand (batch systems use the API)",
        description="Submit one workload; it waits for a Schedule cycle of its pool, which a "
        "batch system's adapter asks for (examples/batch_adapter.py).",
    )
    submit.add_argument("uid", help="a unique id, e.g. demo-1")
    submit.add_argument("--queue", required=True, help="a leaf queue")
    submit.add_argument("--pool", default="", help="node pool (default: the only pool)")
    submit.add_argument("--pods", type=int, default=1, help="pods of the gang")
    submit.add_argument(
        "--gpus-per-pod", type=float, default=None, help="GPUs of each pod (default 1)"
    )
    submit.add_argument(
        "--partition-profile",
        default="",
        help="each pod takes one partition of this profile, e.g. 1g.10gb",
    )
    submit.add_argument(
        "--compute-units",
        type=float,
        default=0.0,
        help="an amount of CU instead of --pods: gpufair picks the GPU type and count",
    )
    submit.add_argument("--min-pods", type=int, default=None, help="gang minimum (default all)")
    submit.add_argument(
        "--gpu-type", action="append", help="allowed GPU type (repeat; default any)"
    )
    submit.add_argument("--priority-class", type=int, default=0, help="higher first in a queue")
    submit.add_argument(
        "--min-runtime",
        type=_duration,
        default=0.0,
        help="not reclaimed before running this long (90s, 30m, 1h30m)",
    )
    add_client_options(submit)
    submit.set_defaults(func=cmd_submit)
