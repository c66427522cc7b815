"""Recompute a pool's effective weights and fair shares from the ledger, and keep them as history.

Demand per leaf queue = what runs now (open allocation intervals, per GPU type) + what waits
(pending and bound workloads, counted on the cheapest GPU type that serves them, as placement
would choose). Usage comes from the rollups plus the window's edges, so the cost does not grow
with the number of events in the ledger.
"""

from __future__ import annotations

import logging
import math
from collections import defaultdict
from dataclasses import dataclass

from sqlalchemy import Connection, text

from gpufair.domain.errors import NotFound
from gpufair.domain.fairshare import (
    FairShareInput,
    FairShareResult,
    QueueDemand,
    compute_fair_shares,
)
from gpufair.domain.model import ClusterConfig, NodePool
from gpufair.domain.placement import adequate_types
from gpufair.domain.stored_limits import within_limits
from gpufair.domain.usage import finite_usage, window_bounds
from gpufair.store import capacity_repo, config_repo, data_checks, fairshare_repo, rollup_repo
from gpufair.store.workload_repo import workloads_in_states

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Recomputed:
    result: FairShareResult
    run_id: int
    computed_at_s: float
    # Stored history that is not finite and was skipped (store/data_checks.py); also logged.
    warnings: tuple[str, ...] = ()


def pool_of(config: ClusterConfig, name: str) -> NodePool:
    for pool in config.pools:
        if pool.name == name:
            return pool
    raise NotFound("pool", name)


def demands(conn: Connection, config: ClusterConfig, pool: NodePool) -> dict[str, QueueDemand]:
    allocated: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for r in conn.execute(
        text(
            "SELECT queue, gpu_type, sum(gpus) AS gpus FROM allocation_intervals "
            "WHERE pool = :pool AND ended_at IS NULL GROUP BY queue, gpu_type"
        ),
        {"pool": pool.name},
    ):
        allocated[r.queue][r.gpu_type] += float(r.gpus)

    gpu_types = {t.name: t for t in config.gpu_types}
    present = {n.gpu_type for n in config.nodes if n.pool == pool.name and n.ready}
    pending: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for workload in workloads_in_states(conn, pool.name, ("pending", "bound")):
        types = adequate_types(workload, gpu_types, present)
        if types:
            pending[workload.queue][types[0]] += workload.total_gpus

    leaves = {q.name for q in config.queues} - {q.parent for q in config.queues if q.parent}
    return {
        queue: QueueDemand(
            allocated_gpus_by_type=dict(allocated.get(queue, {})),
            pending_gpus_by_type=dict(pending.get(queue, {})),
        )
        for queue in sorted(leaves)
        if queue in allocated or queue in pending
    }


def recompute_pool(conn: Connection, pool_name: str, now_s: float) -> Recomputed:
    """Roll up, compute and store one pool's fair shares as of `now_s`, in the caller's
    transaction."""
    config, clamped = within_limits(config_repo.load_config(conn))
    pool = pool_of(config, pool_name)
    rollup_repo.rollup_pool(conn, config, pool, now_s)
    usage, dropped = finite_usage(rollup_repo.decayed_usage(conn, config, pool, now_s))
    warnings = [*clamped, *history_warnings(conn, pool, now_s), *dropped]
    for warning in warnings:
        log.warning("recompute of pool %s: %s", pool.name, warning)
    previous = fairshare_repo.latest_run(conn, pool.name)
    capacity = capacity_repo.capacity_now(conn).get(pool.name, (0.0, {}))
    result = compute_fair_shares(
        FairShareInput(
            pool=pool.name,
            policy=pool.policy,
            gpu_types={t.name: t for t in config.gpu_types},
            capacity_gpus_by_type=capacity[1],
            queues=config.queues,
            demands=demands(conn, config, pool),
            usage=usage,
            previous_effective_weights=(
                {
                    s.queue: s.effective_weight
                    for s in previous.shares
                    if math.isfinite(s.effective_weight) and s.effective_weight >= 0.0
                }
                if previous
                else {}
            ),
        )
    )
    run_id = fairshare_repo.store_run(conn, result, now_s, config_repo.config_version(conn))
    return Recomputed(result, run_id, now_s, tuple(warnings))


def history_warnings(conn: Connection, pool: NodePool, now_s: float) -> list[str]:
    """What of the pool's stored history in its usage window is not finite (and skipped)."""
    since_s = window_bounds(now_s, pool.policy)[0]
    return data_checks.nonfinite_history(conn, pool.name, since_s if math.isfinite(since_s) else 0)
