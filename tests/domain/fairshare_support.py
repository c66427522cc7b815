"""Small builders for fair-share tests: one pool named `pool`, GPU type `a100` at 10 CU."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from gpufair.domain.fairshare import (
    FairShareInput,
    QueueDemand,
    QueueShare,
    compute_fair_shares,
)
from gpufair.domain.model import FairSharePolicy, GpuType, Queue, QueueQuota, frozen_map
from gpufair.domain.usage import UsageInputs

POOL = "pool"
A100 = GpuType("a100", memory_gib=80.0, compute_weight=10.0)
V100 = GpuType("v100", memory_gib=16.0, compute_weight=4.0)
RTX4090 = GpuType("rtx4090", memory_gib=24.0, compute_weight=2.0)
ALL_TYPES = {t.name: t for t in (A100, V100, RTX4090)}


def queue(
    name: str,
    *,
    deserved_cu: float = 0.0,
    weight: float = 1.0,
    parent: str | None = None,
    priority: int = 0,
    limit_cu: float | None = None,
    created_at_s: float = 0.0,
    deserved_gpus_by_type: Mapping[str, float] | None = None,
    limit_gpus_by_type: Mapping[str, float] | None = None,
) -> Queue:
    quota = QueueQuota(
        pool=POOL,
        deserved_cu=deserved_cu,
        over_quota_weight=weight,
        limit_cu=limit_cu,
        priority=priority,
        deserved_gpus_by_type=frozen_map(deserved_gpus_by_type),
        limit_gpus_by_type=frozen_map(limit_gpus_by_type),
    )
    return Queue(
        name=name, parent=parent, quotas=frozen_map({POOL: quota}), created_at_s=created_at_s
    )


def wants(gpus: float, *, allocated: float = 0.0, gpu_type: str = "a100") -> QueueDemand:
    """A leaf holding `allocated` GPUs of one type and wanting `gpus` in total."""
    return QueueDemand(
        allocated_gpus_by_type={gpu_type: allocated} if allocated else {},
        pending_gpus_by_type={gpu_type: gpus - allocated} if gpus > allocated else {},
    )


def divide(
    queues: Sequence[Queue],
    demands: Mapping[str, QueueDemand],
    *,
    capacity_gpus: Mapping[str, float] | float,
    policy: FairSharePolicy | None = None,
    usage: UsageInputs | None = None,
    previous: Mapping[str, float] | None = None,
) -> dict[str, QueueShare]:
    capacity = {"a100": capacity_gpus} if isinstance(capacity_gpus, int | float) else capacity_gpus
    result = compute_fair_shares(
        FairShareInput(
            pool=POOL,
            policy=policy or FairSharePolicy(),
            gpu_types=ALL_TYPES,
            capacity_gpus_by_type=capacity,
            queues=queues,
            demands=demands,
            usage=usage or UsageInputs(),
            previous_effective_weights=previous or {},
        )
    )
    return dict(result.shares)


def gpus(share: QueueShare) -> float:
    """An a100-pool share in GPUs."""
    return share.fair_share_cu / A100.compute_weight
