"""`gpufair report`: usage per period with budgets, and fair shares with their explanation.

    gpufair report usage --period week --by queue,gpu-type
    gpufair report usage --period month --by pool --queue research --since 2026-01-01

    gpufair report fairshare [--pool main]     # the only pool when there is one

`report usage` counts closed UTC hours from the rollups, then the open hour so far from the raw
runs in a table of its own marked partial (`--no-open-hour` leaves it out). Every report takes
`-o table|json|yaml`.

Registered by cli/main.py through `add_report_commands`.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from datetime import UTC, datetime

from google.protobuf.timestamp_pb2 import Timestamp

from gpufair.cli.client_options import connect
from gpufair.cli.options import SubCommands, add_output_option, emit
from gpufair.client import GpufairClient
from gpufair.render import fmt_number, table
from gpufair.v1 import ledger_pb2

DIMENSIONS = ("pool", "queue", "gpu-type")
_HEADERS = {"pool": "POOL", "queue": "QUEUE", "gpu-type": "GPU TYPE"}
_PERIODS = {
    "day": ledger_pb2.USAGE_PERIOD_DAY,
    "week": ledger_pb2.USAGE_PERIOD_WEEK,
    "month": ledger_pb2.USAGE_PERIOD_MONTH,
}
_PERIOD_HEADERS = {"day": "DAY", "week": "WEEK OF", "month": "MONTH"}


def parse_by(value: str) -> tuple[str, ...]:
    """`queue,gpu-type` -> ("queue", "gpu-type"); '' = totals per period only."""
    dims = tuple(d.strip() for d in value.split(",") if d.strip())
    unknown = [d for d in dims if d not in DIMENSIONS]
    if unknown:
        raise argparse.ArgumentTypeError(
            f"unknown dimension {unknown[0]!r}; choose from {', '.join(DIMENSIONS)}"
        )
    if len(set(dims)) != len(dims):
        raise argparse.ArgumentTypeError("a dimension is named twice")
    return dims


def parse_instant(value: str) -> datetime:
    """A date (midnight UTC) or an ISO 8601 date and time; without an offset it is UTC."""
    try:
        at = datetime.fromisoformat(value)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{value!r} is not a date (2026-03-02) or date and time (2026-03-02T12:00:00Z)"
        ) from None
    return at if at.tzinfo is not None else at.replace(tzinfo=UTC)


def _utc(ts: Timestamp) -> datetime:
    return ts.ToDatetime(tzinfo=UTC)


def _period_label(start: datetime, period: str) -> str:
    return start.strftime("%Y-%m") if period == "month" else start.strftime("%Y-%m-%d")


def _hours(value: float) -> float:
    # Two decimals: hundredths of an hour are below what anyone budgets by, and longer numbers
    # make the columns hard to read.
    return round(value, 2)


def usage_table(rows: Sequence[ledger_pb2.UsageRow], period: str, by: Sequence[str]) -> str:
    """Rows summed by period and the `by` dimensions, in that order."""
    sums: dict[tuple[str, ...], list[float]] = {}
    for r in rows:
        values = {"pool": r.pool, "queue": r.queue, "gpu-type": r.gpu_type}
        key = (_period_label(_utc(r.period_start), period), *(values[d] for d in by))
        acc = sums.setdefault(key, [0.0, 0.0, 0.0])
        acc[0] += r.gpu_hours
        acc[1] += r.cu_hours
        acc[2] += r.over_quota_cu_hours
    return table(
        [
            _PERIOD_HEADERS[period],
            *(_HEADERS[d] for d in by),
            "GPU-HOURS",
            "CU-HOURS",
            "OVER-QUOTA CU-HOURS",
        ],
        [(*key, *(_hours(v) for v in acc)) for key, acc in sorted(sums.items())],
    )


def budget_table(budgets: Sequence[ledger_pb2.BudgetRow]) -> str:
    def exhaustion(b: ledger_pb2.BudgetRow) -> str:
        if not b.HasField("projected_exhaustion"):
            return "-"
        return _utc(b.projected_exhaustion).strftime("%Y-%m-%d %H:%M UTC")

    return table(
        [
            "BUDGET QUEUE",
            "POOL",
            "PERIOD",
            "FROM",
            "BUDGET CU-H",
            "CONSUMED CU-H",
            "REMAINING CU-H",
            "USED %",
            "BURN CU-H/DAY",
            "PROJECTED EXHAUSTION",
        ],
        [
            (
                b.queue,
                b.pool or "*",
                b.period,
                _utc(b.period_start).strftime("%Y-%m-%d"),
                _hours(b.budget_cu_hours),
                _hours(b.consumed_cu_hours),
                _hours(b.remaining_cu_hours),
                round(100 * b.consumed_cu_hours / b.budget_cu_hours, 1)
                if b.budget_cu_hours
                else "-",
                _hours(b.burn_cu_hours_per_day),
                exhaustion(b),
            )
            for b in budgets
        ],
    )


def cmd_report_usage(args: argparse.Namespace) -> int:
    with connect(args) as client:
        reply = client.get_usage(
            pool=args.pool,
            queue=args.queue,
            period=_PERIODS[args.period],
            since=args.since,
            until=args.until,
            include_open_hour=args.open_hour,
        )
    emit(getattr(args, "output", "table"), reply, lambda: print_usage(reply, args))
    return 0


def print_usage(reply: ledger_pb2.GetUsageResponse, args: argparse.Namespace) -> None:
    closed = [r for r in reply.rows if not r.partial]
    partial = [r for r in reply.rows if r.partial]
    if closed:
        print(usage_table(closed, args.period, args.by))
    else:
        print(
            "no usage recorded in closed hours in this range "
            "(an hour counts once it is over and rolled up)"
        )
    if partial:
        as_of = _utc(reply.as_of)
        print()
        print(
            f"open hour {as_of:%Y-%m-%d %H}:00-{as_of:%H:%M} UTC so far "
            "(partial: not yet in the totals above, budgets or report views)"
        )
        print(usage_table(partial, args.period, args.by))
    print()
    print(budget_table(reply.budgets) if reply.budgets else "no budgets")


def add_report_commands(
    sub: SubCommands,
    add_client_options: Callable[[argparse.ArgumentParser], None],
) -> None:
    """Register `report usage` and `report fairshare` on the subcommands of `gpufair`."""
    reports = sub.add_parser("report", help="usage, budget and fair-share reports").add_subparsers(
        dest="report", required=True, metavar="REPORT"
    )
    fairshare = reports.add_parser(
        "fairshare",
        help="the latest fair shares of a pool, with how each was reached",
        description=(
            "Per queue: deserved, demand, allocated, W' (weight share), U' (usage share), "
            "P = max(0, W' + k (W' - U')), the effective weight and the fair share, in CU."
        ),
    )
    fairshare.add_argument("--pool", default="", help="node pool (default: the only pool)")
    add_output_option(fairshare)
    add_client_options(fairshare)
    fairshare.set_defaults(func=cmd_report_fairshare)

    usage = reports.add_parser(
        "usage",
        help="GPU-hours and CU-hours per day, week or month, and budgets",
        description=(
            "GPU-hours, CU-hours and over-quota CU-hours per period (UTC days, weeks from "
            "Monday, calendar months), summed by the chosen dimensions, then every budget that "
            "applies with its consumption, burn and projected exhaustion."
        ),
    )
    usage.add_argument("--period", choices=list(_PERIODS), default="day")
    usage.add_argument(
        "--by",
        type=parse_by,
        default=("queue", "gpu-type"),
        metavar="DIMS",
        help="comma-separated: pool, queue, gpu-type (default queue,gpu-type; '' = totals)",
    )
    usage.add_argument("--pool", default="", help="one pool (default all)")
    usage.add_argument("--queue", default="", help="one queue; a parent includes those below it")
    usage.add_argument(
        "--since",
        type=parse_instant,
        default=None,
        metavar="DATE",
        help="from the period containing DATE (UTC date or ISO date and time)",
    )
    usage.add_argument(
        "--until",
        type=parse_instant,
        default=None,
        metavar="DATE",
        help="periods starting before DATE (exclusive: --until 2026-04-01 ends with March)",
    )
    usage.add_argument(
        "--open-hour",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also show the open UTC hour so far, marked partial",
    )
    add_output_option(usage)
    add_client_options(usage)
    usage.set_defaults(func=cmd_report_usage)


def fairshare_table(reply: ledger_pb2.GetFairShareResponse) -> str:
    return table(
        [
            "QUEUE",
            "PARENT",
            "PRIO",
            "DESERVED CU",
            "LIMIT CU",
            "DEMAND CU",
            "ALLOCATED CU",
            "W'",
            "U'",
            "P",
            "EFF WEIGHT",
            "FAIR SHARE CU",
        ],
        [
            (
                q.queue,
                q.parent or "-",
                q.priority,
                q.deserved_cu,
                q.limit_cu if q.HasField("limit_cu") else "-",
                q.demand_cu,
                q.allocated_cu,
                q.weight_share,
                q.usage_share,
                q.priority_weight,
                q.effective_weight,
                q.fair_share_cu,
            )
            for q in reply.queues
        ],
    )


class NoDefaultPool(Exception):
    """No --pool and not exactly one pool to default to: one message, exit code 2."""


def default_pool(client: GpufairClient, pool: str) -> str:
    """`pool`, or the only pool configured; with several (or none) the user must name one."""
    if pool:
        return pool
    pools = [p.name for p in client.get_config().config.pools]
    if len(pools) == 1:
        return pools[0]
    if not pools:
        raise NoDefaultPool("no pool is configured: apply a cluster config first")
    raise NoDefaultPool(f"there are {len(pools)} pools; name one with --pool: {', '.join(pools)}")


def cmd_report_fairshare(args: argparse.Namespace) -> int:
    with connect(args) as client:
        reply = client.get_fair_share(default_pool(client, args.pool))

    def show() -> None:
        computed = _utc(reply.computed_at).strftime("%Y-%m-%d %H:%M:%S UTC")
        print(f"pool {reply.pool}: {fmt_number(reply.capacity_cu)} CU, computed {computed}\n")
        print(fairshare_table(reply))

    emit(getattr(args, "output", "table"), reply, show)
    return 0
