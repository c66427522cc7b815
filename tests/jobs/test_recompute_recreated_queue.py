"""A queue deleted and created again under the same name starts afresh in the fair share
(`store/queue_history.py`), while the ledger keeps the old queue's usage for reports. On
PostgreSQL, through `recompute_pool` as the periodic job runs it."""

from __future__ import annotations

import dataclasses
import time
import uuid

import pytest
from sqlalchemy import Engine, text

from gpufair.domain.ledger import EventKind, LedgerEvent
from gpufair.domain.model import ClusterConfig, Workload
from gpufair.services.recompute import recompute_pool
from gpufair.store import ingest_pipeline, workload_repo
from tests.jobs.test_recompute import DAY, install, reference_config, run_for
from tests.jobs.test_recompute_dead_band import weighted

HOUR = 3600.0


def without(config: ClusterConfig, queue: str) -> ClusterConfig:
    """`config` with `queue` and its budgets deleted."""
    return dataclasses.replace(
        config,
        queues=tuple(q for q in config.queues if q.name != queue),
        budgets=tuple(b for b in config.budgets if b.queue != queue),
    )


def test_a_recreated_queue_counts_its_usage_from_its_deletion_on(db: Engine) -> None:
    """The reference pool (100 GPUs at 1 CU; llm deserves 30, vision 20, 50 CU shared; k = 1,
    7-day window). vision held 70 GPUs (50 over quota) from 7 days ago to 1 day ago; llm runs
    10. Then vision is deleted and created again, and the new vision runs 30 GPUs (10 over
    quota) for the 2 hours up to the recompute; it waits for 70 more, llm for a 60-GPU gang.

    Its U' is its 10 CU over quota for 7,199 s against the 50 CU shared for the week,
    0.00238, not 0.848 with the old queue's 6 days of the whole shared pool. So the two split the
    50 shared CU almost evenly (P = 0.998 : 1): vision 44.97 CU, llm 55.03, where the old
    history gave vision 30 and llm its whole 70."""
    start_s = time.time()
    config = reference_config(1.0)
    with db.connect() as conn:
        install(conn, config, start_s - 8 * DAY)
        inference, start_inference = run_for("llm-inference", "llm", 10, 0, start_s - 7 * DAY)
        old, start_old = run_for("vision-old", "vision", 70, 3, start_s - 7 * DAY)
        stop_old = LedgerEvent(str(uuid.uuid4()), EventKind.STOPPED, start_s - DAY, "vision-old")
        workload_repo.submit(conn, [inference, old])
        ingest_pipeline.ingest(conn, [start_inference, start_old, stop_old], start_s)
        install(conn, without(config, "vision"), start_s)
        conn.commit()
    with db.connect() as conn:
        install(conn, config, start_s)  # vision again, in another change set
        deleted_s = float(
            conn.execute(
                text(
                    "SELECT extract(epoch FROM applied_at)::float8 FROM config_versions "
                    "ORDER BY version DESC OFFSET 1 LIMIT 1"
                )
            ).scalar_one()
        )
        new, start_new = run_for("vision-new", "vision", 30, 3, deleted_s + 1)
        waiting = [
            Workload("llm-gang", "llm", "default", pods=60, gpus_per_pod=1, submit_time_s=start_s),
            Workload(
                "vision-more", "vision", "default", pods=70, gpus_per_pod=1, submit_time_s=start_s
            ),
        ]
        workload_repo.submit(conn, [new, *waiting])
        now_s = deleted_s + 2 * HOUR
        ingest_pipeline.ingest(conn, [start_new], now_s)
        shares = recompute_pool(conn, "default", now_s).result.shares
        # The ledger keeps the old vision's usage for reports: 70 GPUs for 6 days.
        reported_cu_s = conn.execute(
            text(
                "SELECT sum(cu_seconds) FROM usage_hourly "
                "WHERE queue = 'vision' AND bucket_start < to_timestamp(:deleted)"
            ),
            {"deleted": deleted_s - 2 * HOUR},
        ).scalar_one()
        conn.commit()
    assert reported_cu_s == pytest.approx(70 * 6 * DAY)
    vision, llm = shares["vision"], shares["llm"]
    assert vision.usage_share == pytest.approx(10 * (2 * HOUR - 1) / (50 * 7 * DAY), rel=1e-6)
    assert llm.usage_share == 0.0
    p_vision = 1 - vision.usage_share  # W' = 0.5: P = 0.5 + (0.5 - U')
    assert vision.priority_weight == pytest.approx(p_vision)
    assert vision.fair_share_cu == pytest.approx(20 + 50 * p_vision / (1 + p_vision))  # 44.97
    assert llm.fair_share_cu == pytest.approx(30 + 50 / (1 + p_vision))  # 55.03


def test_a_recreated_queue_is_not_held_at_the_old_queue_s_weight(db: Engine) -> None:
    """The reference pool with vision's over-quota weight 1 against llm's 300, dead band 0.01.
    The old vision held 50 CU over quota for 6 of the last 7 days (U' = 0.857 > 2/301): at the
    first recompute it competes and gives way entirely (P = 0, weight 0). Deleted and created
    again, the new vision has no usage: its weight 1/301 = 0.0033 is within the band of the old
    queue's 0, which held it at its 20 CU quota. It gets 20 + 50/302 = 20.166 CU."""
    start_s = time.time()
    config = weighted(reference_config(1.0), {"llm": 300.0, "vision": 1.0})
    with db.connect() as conn:
        install(conn, config, start_s - 8 * DAY)
        inference, start_inference = run_for("llm-inference", "llm", 10, 0, start_s - 7 * DAY)
        old, start_old = run_for("vision-old", "vision", 70, 3, start_s - 7 * DAY)
        stop_old = LedgerEvent(str(uuid.uuid4()), EventKind.STOPPED, start_s - DAY, "vision-old")
        waiting = [
            Workload("llm-gang", "llm", "default", pods=90, gpus_per_pod=1, submit_time_s=start_s),
            Workload(
                "vision-more", "vision", "default", pods=30, gpus_per_pod=1, submit_time_s=start_s
            ),
        ]
        workload_repo.submit(conn, [inference, old, *waiting])
        ingest_pipeline.ingest(conn, [start_inference, start_old, stop_old], start_s)
        first = recompute_pool(conn, "default", start_s).result.shares
        install(conn, without(config, "vision"), start_s)
        conn.commit()
    with db.connect() as conn:
        install(conn, config, start_s)  # vision again; its pending work waited for it
        second = recompute_pool(conn, "default", start_s + 60).result.shares
        conn.commit()
    assert first["vision"].competes_over_quota
    assert (first["vision"].priority_weight, first["vision"].effective_weight) == (0.0, 0.0)
    assert first["vision"].fair_share_cu == pytest.approx(20.0)
    assert second["vision"].usage_share == 0.0
    assert second["vision"].effective_weight == pytest.approx(1 / 301)
    assert second["llm"].effective_weight == 1.0  # 300/301 is within the band of its 1.0
    assert second["vision"].fair_share_cu == pytest.approx(20 + 50 / 302)  # 20.166
    assert second["llm"].fair_share_cu == pytest.approx(30 + 50 * 301 / 302)  # 79.834
