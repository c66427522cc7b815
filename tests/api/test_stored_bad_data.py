"""Stored data that is already bad never makes a pool unschedulable.

A GPU type stored with compute_weight 1e308 (accepted before the input limits) gives the pool an
infinite capacity for as long as that stretch stays in the usage window, and runs on it an
infinite usage. Once the weight is corrected, Schedule and GetFairShare of the pool must still
answer: the fair-share reads skip what is not finite, log it and say so in the reply.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterator

import pytest
from sqlalchemy import Engine, text

from gpufair.api.server import build_server
from gpufair.client import GpufairClient
from gpufair.v1 import cluster_pb2, ledger_pb2, scheduler_pb2

HOUR = 3600.0


class Clock:
    def __init__(self, now_s: float) -> None:
        self.now_s = now_s

    def __call__(self) -> float:
        return self.now_s


@pytest.fixture
def clock() -> Clock:
    return Clock(time.time())


@pytest.fixture
def gpufair(db: Engine, clock: Clock) -> Iterator[GpufairClient]:
    running = build_server(db, "127.0.0.1:0", max_workers=4, clock=clock)
    try:
        with GpufairClient(f"127.0.0.1:{running.port}", attempts=1, timeout_s=60) as c:
            yield c
    finally:
        running.stop(0.5)


def cluster(compute_weight: float) -> cluster_pb2.ClusterConfig:
    config = cluster_pb2.ClusterConfig()
    config.gpu_types.add(name="a100", memory_gib=80, compute_weight=compute_weight)
    pool = config.pools.add(name="default")
    pool.policy.window_s = 7 * 86400.0
    config.nodes.add(name="n1", pool="default", gpu_type="a100", gpu_count=8)
    for name in ("alpha", "beta"):
        queue = config.queues.add(name=name)
        queue.quotas.add(pool="default", deserved_cu=20)
    return config


def test_an_infinite_capacity_once_stored_leaves_the_pool_schedulable(
    gpufair: GpufairClient, db: Engine, clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    gpufair.apply_config(cluster(10.0))
    start = clock.now_s - 30 * HOUR
    with db.begin() as conn:
        # What an older gpufair stored: the weight accepted as sent, and the capacity row
        # it gave the pool 30 hours ago.
        conn.execute(text("UPDATE gpu_types SET compute_weight = 1e308"))
        conn.execute(text("DELETE FROM pool_capacity_changes"))
        conn.execute(
            text(
                "INSERT INTO pool_capacity_changes "
                "(pool, changed_at, capacity_cu, capacity_gpus_by_type, source) VALUES "
                "('default', to_timestamp(:at), 'Infinity', '{\"a100\": 8}'::jsonb, 'config')"
            ),
            {"at": start},
        )
    with db.connect() as conn:  # closed: an open read would hold up the truncation after
        capacity = conn.execute(text("SELECT capacity_cu FROM pool_capacity_changes"))
        assert capacity.scalar_one() == float("inf")

    # The weight is corrected through the API; the infinite stretch stays in the 7-day window.
    corrected = gpufair.apply_config(cluster(10.0))
    assert [(c.kind, c.name) for c in corrected.changes] == [("gpu_type", "a100")]

    gpufair.submit_workloads(
        [
            scheduler_pb2.Workload(uid="a1", queue="alpha", pool="default", pods=1, gpus_per_pod=4),
            scheduler_pb2.Workload(uid="b1", queue="beta", pool="default", pods=1, gpus_per_pod=4),
        ]
    )
    with caplog.at_level(logging.WARNING, logger="gpufair"):
        decided = gpufair.schedule("default")
    assert sorted(b.uid for b in decided.binds) == ["a1", "b1"]
    assert any("not finite" in w for w in decided.warnings), decided.warnings
    assert any("not finite" in r.getMessage() for r in caplog.records)

    share = gpufair.get_fair_share("default")
    assert share.capacity_cu == pytest.approx(80.0)
    assert {q.queue: q.fair_share_cu for q in share.queues} == pytest.approx(
        {"alpha": 40.0, "beta": 40.0}
    )
    assert any("not finite" in w for w in share.warnings), share.warnings


@pytest.mark.parametrize(
    ("stored", "warning"),
    [
        (
            "UPDATE gpu_types SET compute_weight = 1e308",
            "stored gpu type 'a100' compute_weight = 1e+308 is outside [0.001, 10000]; "
            "read as 10000 until corrected",
        ),
        (
            "UPDATE queue_quotas SET deserved_cu = 1e308, limit_cu = NULL",
            "stored queue 'alpha' quota in 'default' deserved_cu = 1e+308 is outside [0, 1e+09]; "
            "read as 1e+09 until corrected",
        ),
        (
            "UPDATE queue_quotas SET over_quota_weight = 1e308",
            "stored queue 'alpha' quota in 'default' over_quota_weight = 1e+308 is outside "
            "[0, 1e+06]; read as 1e+06 until corrected",
        ),
        (
            "UPDATE node_pools SET window_s = 1e308",
            "stored pool 'default' window_s = 1e+308 is outside [0.001, 3.16224e+08]; "
            "read as 3.16224e+08 until corrected",
        ),
        (
            "UPDATE node_pools SET k = 1e308",
            "stored pool 'default' k = 1e+308 is outside [0, 1000]; read as 1000 until corrected",
        ),
        (
            "UPDATE node_pools SET half_life_s = 1e-300",
            "stored pool 'default' half_life_s = 1e-300 is outside [0.001, 3.16224e+08]; "
            "read as 0.001 until corrected",
        ),
    ],
)
def test_a_config_number_stored_before_the_limits_is_read_within_them(
    gpufair: GpufairClient, db: Engine, stored: str, warning: str
) -> None:
    """Values an earlier version accepted (finite, but absurd): the pool schedules, explains
    and answers GetFairShare, with the clamped reading in the warnings; GetConfig shows what
    is stored, so the operator can correct it."""
    config = cluster(10.0)
    config.pools[0].policy.half_life_s = 3600.0
    gpufair.apply_config(config)
    gpufair.submit_workloads(
        [scheduler_pb2.Workload(uid="a1", queue="alpha", pool="default", pods=1, gpus_per_pod=4)]
    )
    with db.begin() as conn:
        conn.execute(text(stored))

    decided = gpufair.schedule("default")
    assert [b.uid for b in decided.binds] == ["a1"]
    assert warning in decided.warnings
    started = ledger_pb2.LedgerEvent(
        event_id=str(uuid.uuid4()), workload_uid="a1", kind=ledger_pb2.EVENT_KIND_STARTED
    )
    started.occurred_at.FromNanoseconds(time.time_ns())
    for pod in decided.binds[0].pods:
        started.pods.add(node=pod.node, gpu_indices=list(pod.gpu_indices), gpu_fraction=1.0)
    reported = gpufair.report_events([started])
    assert [r.status for r in reported.results] == [ledger_pb2.EVENT_STATUS_STORED]
    share = gpufair.get_fair_share("default")
    assert share.capacity_cu == pytest.approx(
        8 * (10_000.0 if "compute_weight" in stored else 10.0)
    )
    assert warning in share.warnings
    gpufair.submit_workloads(
        [scheduler_pb2.Workload(uid="b1", queue="beta", pool="default", pods=1, gpus_per_pod=8)]
    )
    assert gpufair.explain("b1").state == "pending"
    stored_value = gpufair.get_config().config
    assert (
        1e308
        in (
            stored_value.gpu_types[0].compute_weight,
            stored_value.queues[0].quotas[0].deserved_cu,
            stored_value.queues[0].quotas[0].over_quota_weight,
            stored_value.pools[0].policy.window_s,
            stored_value.pools[0].policy.k,
        )
        or stored_value.pools[0].policy.half_life_s == 1e-300
    )
