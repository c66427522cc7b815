"""Work the pool could never run, e.g. after a config change took nodes away, is no demand in
the fair share (`domain.demand.serving_types`): it would hold a share that no one could use.
On PostgreSQL, through `recompute_pool` as the periodic job runs it."""

from __future__ import annotations

import dataclasses
import time

import pytest
from sqlalchemy import Engine

from gpufair.domain.ledger import EventKind
from gpufair.domain.model import Workload
from gpufair.services import recompute
from gpufair.services.recompute import recompute_pool
from gpufair.store import ingest_pipeline, workload_repo
from tests.jobs.test_recompute import DAY, install, reference_config, run_for


def test_a_gang_wider_than_any_node_is_no_demand(db: Engine) -> None:
    """The reference pool (25 nodes x 4 H100, classic fair share, k = 0): llm runs 10 GPUs and
    waits for a gang of two 8-GPU pods, which no 4-GPU node holds; vision runs 70 and waits for
    30. llm's demand is its 10 GPUs, so vision gets the other 90 (not 74 = 100 - 26)."""
    now_s = time.time()
    with db.connect() as conn:
        install(conn, reference_config(0.0), now_s - 8 * DAY)
        inference, start_inference = run_for("llm-inference", "llm", 10, 0, now_s - DAY)
        vision, start_vision = run_for("vision-train", "vision", 70, 3, now_s - DAY)
        wide = Workload("llm-wide", "llm", "default", pods=2, gpus_per_pod=8, submit_time_s=now_s)
        more = Workload(
            "vision-more", "vision", "default", pods=30, gpus_per_pod=1, submit_time_s=now_s
        )
        workload_repo.submit(conn, [inference, vision, wide, more])
        outcomes = ingest_pipeline.ingest(conn, [start_inference, start_vision], now_s)
        assert {o.status for o in outcomes} == {ingest_pipeline.EventStatus.STORED}
        assert start_inference.kind is EventKind.STARTED
        shares = recompute_pool(conn, "default", now_s).result.shares
        conn.commit()
    assert shares["llm"].demand_cu == pytest.approx(10.0)
    assert shares["vision"].demand_cu == pytest.approx(100.0)
    assert shares["llm"].fair_share_cu == pytest.approx(10.0)
    assert shares["vision"].fair_share_cu == pytest.approx(90.0)


def test_the_serving_rule_is_kept_while_the_pool_s_nodes_are_the_same(db: Engine) -> None:
    """The rule is reused by the next recompute (the nodes read anew equal the kept ones), and
    counted anew once a node changes: a 60-GPU gang of llm (one GPU a pod) fits the 100-GPU pool,
    and is no demand once 11 of its 25 nodes are gone (56 GPUs left)."""
    now_s = time.time()
    config = reference_config(0.0)
    with db.connect() as conn:
        install(conn, config, now_s - DAY)
        gang = Workload("llm-gang", "llm", "default", pods=60, gpus_per_pod=1, submit_time_s=now_s)
        workload_repo.submit(conn, [gang])
        first = recompute_pool(conn, "default", now_s).result.shares
        rule = recompute._serving["default"][2]
        recompute._serving["deleted-pool"] = recompute._serving["default"]
        again = recompute_pool(conn, "default", now_s + 60).result.shares
        assert recompute._serving["default"][2] is rule
        assert set(recompute._serving) == {"default"}  # a pool not in the config: dropped
        smaller = dataclasses.replace(config, nodes=config.nodes[:14])
        install(conn, smaller, now_s + 61)
        after = recompute_pool(conn, "default", now_s + 120).result.shares
        conn.commit()
    assert recompute._serving["default"][2] is not rule
    assert first["llm"].demand_cu == again["llm"].demand_cu == pytest.approx(60.0)
    assert after["llm"].demand_cu == pytest.approx(0.0)
