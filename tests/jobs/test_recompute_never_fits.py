"""Work the pool could never run, e.g. after a config change took nodes away, is no demand in
the fair share (`domain.demand.serving_types`): it would hold a share that no one could use.
On PostgreSQL, through `recompute_pool` as the periodic job runs it."""

from __future__ import annotations

import time

import pytest
from sqlalchemy import Engine

from gpufair.domain.ledger import EventKind
from gpufair.domain.model import Workload
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
