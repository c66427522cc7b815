"""A stored config read within the input limits keeps every term it did not have to clamp."""

from __future__ import annotations

from gpufair.domain.model import (
    ClusterConfig,
    GpuType,
    NodePool,
    Queue,
    QueueQuota,
    frozen_map,
)
from gpufair.domain.stored_limits import within_limits


def test_clamping_one_number_of_a_quota_keeps_its_priority_and_loan_limit() -> None:
    quota = QueueQuota(
        pool="default",
        deserved_cu=1e308,  # stored before the limits existed
        over_quota_weight=2.0,
        limit_cu=40.0,
        priority=3,
        max_borrow_s=1_800.0,
    )
    config = ClusterConfig(
        gpu_types=(GpuType("a100", compute_weight=10.0, memory_gib=80.0),),
        pools=(NodePool("default"),),
        queues=(Queue("alpha", quotas=frozen_map({"default": quota})),),
    )

    read, warnings = within_limits(config)

    got = read.queues[0].quota("default")
    assert got.deserved_cu == 1e9
    assert (got.priority, got.max_borrow_s, got.limit_cu, got.over_quota_weight) == (
        3,
        1_800.0,
        40.0,
        2.0,
    )
    assert warnings == [
        "stored queue 'alpha' quota in 'default' deserved_cu = 1e+308 is outside [0, 1e+09]; "
        "read as 1e+09 until corrected"
    ]
