"""A stored config read within today's input limits, for the engine and the cycle.

The API refuses numbers outside `domain/limits.py`; a config stored by an earlier version may
still hold them (a compute_weight of 1e308, a window of 1e308 s, a deserved quota of 1e308 CU)
and would make every fair share and every cycle of its pool fail. Scheduling reads the stored
config through `within_limits`: each such number is clamped to the nearest limit (a value that
is not a number to the lower one), and a warning says which field was read as what, so that the
pool keeps scheduling and the operator knows what to correct. The stored rows stay as they are:
GetConfig shows them, and an apply corrects them.
"""

from __future__ import annotations

import dataclasses
import math

from gpufair.domain import limits
from gpufair.domain.model import ClusterConfig, GpuType, NodePool, Queue, frozen_map


class _Clamp:
    def __init__(self) -> None:
        self.warnings: list[str] = []

    def __call__(self, where: str, value: float, lo: float, hi: float) -> float:
        if lo <= value <= hi:
            return value
        read = lo if math.isnan(value) or value < lo else hi
        self.warnings.append(
            f"stored {where} = {value!r} is outside [{lo:g}, {hi:g}]; read as {read:g} "
            "until corrected"
        )
        return read

    def by_type(self, where: str, values: dict[str, float]) -> dict[str, float]:
        return {t: self(f"{where}[{t!r}]", v, 0.0, limits.MAX_GPUS) for t, v in values.items()}


def within_limits(config: ClusterConfig) -> tuple[ClusterConfig, list[str]]:
    """`config` with every number clamped into the input limits, and what was clamped; the
    same object and no warnings when everything is within them (the common case)."""
    clamp = _Clamp()
    gpu_types = tuple(_gpu_type(g, clamp) for g in config.gpu_types)
    pools = tuple(_pool(p, clamp) for p in config.pools)
    nodes = tuple(
        dataclasses.replace(
            n,
            gpu_count=int(
                clamp(f"node {n.name!r} gpu_count", n.gpu_count, 0, limits.MAX_GPUS_PER_NODE)
            ),
            cpu_millicores=int(
                clamp(
                    f"node {n.name!r} cpu_millicores",
                    n.cpu_millicores,
                    0,
                    limits.MAX_CPU_MILLICORES,
                )
            ),
            memory_mib=int(
                clamp(f"node {n.name!r} memory_mib", n.memory_mib, 0, limits.MAX_MEMORY_MIB)
            ),
        )
        for n in config.nodes
    )
    queues = tuple(_queue(q, clamp) for q in config.queues)
    budgets = tuple(
        dataclasses.replace(
            b,
            cu_hours=clamp(
                f"budget of {b.queue!r} cu_hours", b.cu_hours, 0.0, limits.MAX_BUDGET_CU_HOURS
            ),
        )
        for b in config.budgets
    )
    if not clamp.warnings:
        return config, []
    return ClusterConfig(gpu_types, pools, nodes, queues, budgets), clamp.warnings


def _gpu_type(g: GpuType, clamp: _Clamp) -> GpuType:
    where = f"gpu type {g.name!r}"
    return dataclasses.replace(
        g,
        memory_gib=clamp(
            f"{where} memory_gib",
            g.memory_gib,
            limits.MIN_GPU_MEMORY_GIB,
            limits.MAX_GPU_MEMORY_GIB,
        ),
        compute_weight=clamp(
            f"{where} compute_weight",
            g.compute_weight,
            limits.MIN_COMPUTE_WEIGHT,
            limits.MAX_COMPUTE_WEIGHT,
        ),
    )


def _pool(p: NodePool, clamp: _Clamp) -> NodePool:
    where = f"pool {p.name!r}"
    pol = p.policy
    lo, hi = limits.MIN_DURATION_S, limits.MAX_DURATION_S
    policy = dataclasses.replace(
        pol,
        window_s=clamp(f"{where} window_s", pol.window_s, lo, hi),
        window_anchor_unix_s=clamp(
            f"{where} window_anchor_unix_s",
            pol.window_anchor_unix_s,
            limits.MIN_UNIX_S,
            limits.MAX_UNIX_S,
        ),
        half_life_s=None
        if pol.half_life_s is None
        else clamp(f"{where} half_life_s", pol.half_life_s, lo, hi),
        k=clamp(f"{where} k", pol.k, 0.0, limits.MAX_K),
        recompute_interval_s=clamp(
            f"{where} recompute_interval_s", pol.recompute_interval_s, lo, hi
        ),
    )
    after = p.gang_reservation_after_s
    return dataclasses.replace(
        p,
        policy=policy,
        gang_reservation_after_s=None
        if after is None
        else clamp(f"{where} gang_reservation_after_s", after, 0.0, hi),
    )


def _queue(q: Queue, clamp: _Clamp) -> Queue:
    quotas = {}
    for pool, quota in q.quotas.items():
        where = f"queue {q.name!r} quota in {pool!r}"
        limit = quota.limit_cu
        # `replace`, not a new record: every term not clamped here (priority, the loan limit)
        # carries over as stored.
        quotas[pool] = dataclasses.replace(
            quota,
            deserved_cu=clamp(f"{where} deserved_cu", quota.deserved_cu, 0.0, limits.MAX_CU),
            deserved_gpus_by_type=frozen_map(
                clamp.by_type(f"{where} deserved_gpus_by_type", dict(quota.deserved_gpus_by_type))
            ),
            over_quota_weight=clamp(
                f"{where} over_quota_weight",
                quota.over_quota_weight,
                0.0,
                limits.MAX_OVER_QUOTA_WEIGHT,
            ),
            limit_cu=None
            if limit is None
            else clamp(f"{where} limit_cu", limit, 0.0, limits.MAX_CU),
            limit_gpus_by_type=frozen_map(
                clamp.by_type(f"{where} limit_gpus_by_type", dict(quota.limit_gpus_by_type))
            ),
        )
    return dataclasses.replace(q, quotas=frozen_map(quotas))
