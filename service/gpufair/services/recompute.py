"""Recompute a pool's effective weights and fair shares from the ledger, and keep them as history.

Demand per leaf queue follows `domain.demand`: what runs now (open allocation intervals, per GPU
type) plus what waits (pending and bound workloads, on the cheapest GPU type that serves them, as
placement would choose; not those the pool could never hold). Usage comes from the rollups plus the window's edges, so the cost does
not grow with the number of events in the ledger. The capacity divided is the pool's ready
nodes plus what running work still holds on its drained ones (`capacity_repo.division_capacity`):
a drain changes no share until the work on the node ends. U' is divided by the same rule over
the window (`capacity_repo.usage_capacity`, read by the rollups and the window's edges), so a
long drain under work does not inflate it either.

Runs in the caller's transaction and takes no lock of its own.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

from sqlalchemy import Connection

from gpufair.domain.demand import ServingType, leaf_demand_columns, queue_demands, serving_types
from gpufair.domain.fairshare import (
    FairShareInput,
    FairSharePlan,
    FairShareResult,
    LeafDemands,
    QueueDemand,
    compute_fair_shares,
)
from gpufair.domain.model import ClusterConfig, GpuType, Node, NodePool
from gpufair.domain.stored_limits import within_limits
from gpufair.domain.usage import finite_usage, window_bounds
from gpufair.store import (
    capacity_repo,
    config_repo,
    data_checks,
    fairshare_repo,
    rollup_repo,
    workload_repo,
)

log = logging.getLogger(__name__)

# Each pool's compiled configuration (`FairSharePlan`, issue 17), kept across recomputes of this
# process: the stored configuration is read anew every time, and the plan is reused while that
# configuration equals the one it was compiled from (compared by value, a few ms at 10,000
# queues against tens of ms to compile). Plans of pools the configuration no longer has are
# dropped at the next recompute.
_plans: dict[str, FairSharePlan] = {}

# Each pool's serving-type rule (`domain.demand.serving_types`), kept the same way while the
# pool's nodes and the GPU types are equal by value: building it counts the pool's hardware
# (about 12 ms at 4,000 nodes on a slow machine, against 2 ms to compare them), and its
# answers per kind of work stay good while the hardware is the same.
_serving: dict[str, tuple[tuple[Node, ...], dict[str, GpuType], ServingType]] = {}


@dataclass(frozen=True, slots=True)
class Recomputed:
    result: FairShareResult
    run_id: int
    computed_at_s: float
    # Stored history that is not finite and was skipped (store/data_checks.py); also logged.
    warnings: tuple[str, ...] = ()


def demands(
    conn: Connection, config: ClusterConfig, pool: NodePool, plan: FairSharePlan | None = None
) -> dict[str, QueueDemand] | LeafDemands:
    """Each leaf queue's demand in `pool` now (`domain.demand`): as columns in `plan`'s leaf
    and type order when a plan is given, else as maps by queue name."""
    gpu_types = {t.name: t for t in config.gpu_types}
    nodes = tuple(n for n in config.nodes if n.pool == pool.name)
    kept = _serving.get(pool.name)
    if kept is None or kept[0] != nodes or kept[1] != gpu_types:
        kept = _serving[pool.name] = (nodes, gpu_types, serving_types(gpu_types, nodes))
    cheapest = kept[2]
    held = workload_repo.held_gpus(conn, pool.name)
    waiting = workload_repo.workloads_in_states(conn, pool.name, ("pending", "bound"))
    weights = {name: gpu_type.compute_weight for name, gpu_type in gpu_types.items()}
    if plan is not None:
        return leaf_demand_columns(
            plan.leaf_names, plan.type_names, held, waiting, cheapest, weights
        )
    return queue_demands((q.name for q in config.leaf_queues()), held, waiting, cheapest, weights)


def recompute_pool(conn: Connection, pool_name: str, now_s: float) -> Recomputed:
    """Roll up, compute and store one pool's fair shares as of `now_s`, in the caller's
    transaction. `NotFound` for an unknown pool. The stored config is read within the input
    limits and stored history that is not finite is skipped; `warnings` says what was."""
    # Read before the config, so that what is stamped with it is never newer than what was
    # computed (`rollup_repo.rollup_pool`).
    version = config_repo.config_version(conn)
    config, clamped = within_limits(config_repo.load_config(conn))
    for gone in set(_plans) - {p.name for p in config.pools}:
        _plans.pop(gone, None)
    for gone in set(_serving) - {p.name for p in config.pools}:
        _serving.pop(gone, None)
    pool = config.pool(pool_name)
    rollup_repo.rollup_pool(conn, config, pool, now_s, version)
    usage, dropped = finite_usage(rollup_repo.decayed_usage(conn, config, pool, now_s))
    warnings = [*clamped, *history_warnings(conn, pool, now_s), *dropped]
    for warning in warnings:
        log.warning("recompute of pool %s: %s", pool.name, warning)
    previous = fairshare_repo.latest_run(conn, pool.name)
    # Ready nodes, and what running work still holds on drained ones (`division_capacity`).
    drained = capacity_repo.not_ready_nodes(config, pool.name)
    capacity = capacity_repo.division_capacity(conn, pool.name, drained)
    gpu_types = {t.name: t for t in config.gpu_types}
    plan = _plans.get(pool.name)
    if plan is not None and not plan.fits(pool.name, pool.policy, gpu_types, config.queues):
        plan = None
    result = compute_fair_shares(
        FairShareInput(
            pool=pool.name,
            policy=pool.policy,
            gpu_types=gpu_types,
            capacity_gpus_by_type=capacity[1],
            # The plan's own (equal) queue tuple: the division then knows it by identity.
            queues=config.queues if plan is None else plan.queues,
            # Columns in the plan's leaf order when a plan is kept (issue 17).
            demands=demands(conn, config, pool, plan),
            usage=usage,
            previous_effective_weights=(
                fairshare_repo.previous_weights(conn, previous, config.queues) if previous else {}
            ),
        ),
        plan,
    )
    _plans[pool.name] = result.shares.plan
    run_id = fairshare_repo.store_run(conn, result, now_s, version)
    return Recomputed(result, run_id, now_s, tuple(warnings))


def history_warnings(conn: Connection, pool: NodePool, now_s: float) -> list[str]:
    """What of the pool's stored history in its usage window is not finite (and skipped)."""
    since_s = window_bounds(now_s, pool.policy)[0]
    return data_checks.nonfinite_history(conn, pool.name, since_s if math.isfinite(since_s) else 0)
