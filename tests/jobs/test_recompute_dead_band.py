"""The dead band across stored recomputes, on PostgreSQL: what a stored run hands the next one
(`fairshare_repo.competed_weights`) tells a queue that did not compete from one that gave way."""

from __future__ import annotations

import dataclasses
import time

import pytest
from sqlalchemy import Engine

from gpufair.domain.model import ClusterConfig, Workload, frozen_map
from gpufair.services.recompute import recompute_pool
from gpufair.store import fairshare_repo, workload_repo
from tests.jobs.test_recompute import DAY, install, reference_config


def weighted(config: ClusterConfig, weights: dict[str, float]) -> ClusterConfig:
    """The reference config with the queues' over-quota weights in its pool replaced."""
    queues = tuple(
        dataclasses.replace(
            q,
            quotas=frozen_map(
                {
                    pool: dataclasses.replace(quota, over_quota_weight=weights[q.name])
                    for pool, quota in q.quotas.items()
                }
            ),
        )
        for q in config.queues
    )
    return dataclasses.replace(config, queues=queues)


def waiting(uid: str, queue: str, gpus: int, at_s: float) -> Workload:
    return Workload(uid, queue, "default", pods=gpus, gpus_per_pod=1, submit_time_s=at_s)


def test_a_queue_back_in_the_running_gets_its_weight_at_the_next_recompute(db: Engine) -> None:
    """The reference pool (100 GPUs at 1 CU, llm deserves 30, vision 20, so 50 CU are shared),
    llm's over-quota weight 1 against vision's 300, no usage yet, dead band 0.01. At the first
    recompute llm waits for 10 GPUs, within its quota: it does not compete and is stored with
    weight 0. Then it waits for 60 more: its weight 1/301 = 0.0033 is within the band of that
    stored 0, which held it at 30 CU while vision wanted more. It now gets 30 + 50/302 CU."""
    now_s = time.time()
    config = weighted(reference_config(1.0), {"llm": 1.0, "vision": 300.0})
    with db.connect() as conn:
        install(conn, config, now_s - DAY)
        workload_repo.submit(
            conn,
            [
                waiting("llm-small", "llm", 10, now_s - 60),
                waiting("vision-big", "vision", 100, now_s - 60),
            ],
        )
        first = recompute_pool(conn, "default", now_s).result.shares
        stored = fairshare_repo.latest_run(conn, "default")
        assert stored is not None
        workload_repo.submit(conn, [waiting("llm-gang", "llm", 60, now_s + 30)])
        second = recompute_pool(conn, "default", now_s + 60).result.shares
        conn.commit()
    assert not first["llm"].competes_over_quota
    assert (first["llm"].effective_weight, first["vision"].effective_weight) == (0.0, 1.0)
    assert first["llm"].fair_share_cu == pytest.approx(10.0)
    assert first["vision"].fair_share_cu == pytest.approx(90.0)
    # The stored run keeps llm's record (weight 0) for reports, but hands on vision's alone.
    assert {s.queue: s.effective_weight for s in stored.shares} == {"llm": 0.0, "vision": 1.0}
    assert fairshare_repo.competed_weights(stored) == {"vision": 1.0}
    assert second["llm"].effective_weight == pytest.approx(1 / 301)
    assert second["vision"].effective_weight == 1.0  # 300/301 is within the band of 1.0: kept
    assert second["llm"].fair_share_cu == pytest.approx(30 + 50 / 302)  # 30.166
    assert second["vision"].fair_share_cu == pytest.approx(20 + 50 * 301 / 302)  # 69.834
