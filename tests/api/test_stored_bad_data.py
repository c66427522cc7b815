"""Stored data that is already bad never makes a pool unschedulable.

A GPU type stored with compute_weight 1e308 (accepted before the input limits) gives the pool an
infinite capacity for as long as that stretch stays in the usage window, and runs on it an
infinite usage. Once the weight is corrected, Schedule and GetFairShare of the pool must still
answer: the fair-share reads skip what is not finite, log it and say so in the reply.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator

import pytest
from sqlalchemy import Engine, text

from gpufair.api.server import build_server
from gpufair.client import GpufairClient
from gpufair.store import capacity_repo
from gpufair.v1 import cluster_pb2, scheduler_pb2

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
        capacity_repo.record_if_changed(conn, start, "config")
    assert db.connect().execute(
        text("SELECT capacity_cu FROM pool_capacity_changes")
    ).scalar_one() == float("inf")

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
