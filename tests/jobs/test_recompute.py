"""Recomputing fair shares from the ledger: the reference case of DESIGN §1 end to end, on
PostgreSQL, read back over gRPC."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import grpc
import pytest
from sqlalchemy import Connection, Engine, text

from gpufair.api.convert_cluster import config_from_proto
from gpufair.client import GpufairClient
from gpufair.config_file import load_config_file
from gpufair.domain.config_diff import diff_configs
from gpufair.domain.ledger import EventKind, EventPod, LedgerEvent
from gpufair.domain.model import ClusterConfig, Workload
from gpufair.services import recompute
from gpufair.services.recompute import recompute_pool
from gpufair.store import capacity_repo, config_repo, ingest_pipeline, workload_repo
from gpufair.v1 import ledger_pb2

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "clusters" / "llm-vs-vision.yaml"
DAY = 86400.0


def reference_config(k: float) -> ClusterConfig:
    msg = load_config_file(EXAMPLE)
    msg.pools[0].policy.k = k
    config, problems = config_from_proto(msg)
    assert problems == []
    return config


def install(conn: Connection, config: ClusterConfig, at_s: float) -> None:
    changes = diff_configs(config_repo.load_config(conn), config)
    config_repo.apply_changes(conn, config, changes)
    config_repo.record_version(conn, changes)
    capacity_repo.record_if_changed(conn, at_s, "config")


def run_for(
    uid: str, queue: str, gpus: int, first_node: int, start_s: float
) -> tuple[Workload, LedgerEvent]:
    """A workload holding `gpus` whole GPUs on 4-GPU nodes from `first_node` on, since `start_s`."""
    pods = tuple(EventPod(f"gpu-{first_node + i // 4 + 1:02d}", (i % 4,)) for i in range(gpus))
    workload = Workload(uid, queue, "default", pods=gpus, gpus_per_pod=1, submit_time_s=start_s)
    return workload, LedgerEvent(str(uuid.uuid4()), EventKind.STARTED, start_s, uid, pods)


def build_history(conn: Connection, config: ClusterConfig, now_s: float) -> None:
    """A week in which the vision team held the whole 50-GPU shared pool (70 GPUs: 20 of its own
    and 50 over quota) and the LLM team ran 10 GPUs of inference; now the LLM team asks for a
    60-GPU gang and vision for more."""
    install(conn, config, now_s - 8 * DAY)
    inference, start_inference = run_for("llm-inference", "llm", 10, 0, now_s - 7 * DAY)
    vision, start_vision = run_for("vision-train", "vision", 70, 3, now_s - 7 * DAY)
    gang = Workload(
        "llm-post-training", "llm", "default", pods=60, gpus_per_pod=1, submit_time_s=now_s - 3600
    )
    more_vision = Workload(
        "vision-more", "vision", "default", pods=30, gpus_per_pod=1, submit_time_s=now_s - 3600
    )
    workload_repo.submit(conn, [inference, vision, gang, more_vision])
    outcomes = ingest_pipeline.ingest(conn, [start_inference, start_vision], now_s)
    assert [o.status for o in outcomes] == [ingest_pipeline.EventStatus.STORED] * 2


@pytest.mark.parametrize(("k", "llm_share", "vision_share"), [(1.0, 70.0, 30.0), (0.0, 55.0, 45.0)])
def test_reference_case_llm_gang_fits_only_with_time_based_share(
    db: Engine, k: float, llm_share: float, vision_share: float
) -> None:
    now_s = time.time()
    config = reference_config(k)
    with db.connect() as conn:
        build_history(conn, config, now_s)
        recomputed = recompute_pool(conn, "default", now_s)
        conn.commit()
    shares = recomputed.result.shares
    assert shares["llm"].fair_share_cu == pytest.approx(llm_share)
    assert shares["vision"].fair_share_cu == pytest.approx(vision_share)
    # The explain record says why: vision used the whole over-quota pool for the week.
    assert shares["vision"].usage_share == pytest.approx(1.0, rel=1e-6)
    assert shares["llm"].usage_share == pytest.approx(0.0, abs=1e-9)
    assert shares["llm"].demand_cu == 70 and shares["vision"].demand_cu == 100
    assert shares["llm"].allocated_cu == 10 and shares["vision"].allocated_cu == 70
    # The 60-GPU gang needs llm's share >= 10 + 60.
    assert (shares["llm"].fair_share_cu >= 70) == (k > 0)


def test_recompute_keeps_the_pool_plan_while_the_configuration_is_equal(db: Engine) -> None:
    """Issue 17: the compiled configuration is reused by the next recompute (the stored
    configuration read anew equals it), and replaced, with the new numbers, once it changes."""
    now_s = time.time()
    config = reference_config(1.0)
    with db.connect() as conn:
        build_history(conn, config, now_s)
        first = recompute_pool(conn, "default", now_s)
        recompute._plans["deleted-pool"] = first.result.shares.plan
        again = recompute_pool(conn, "default", now_s + 60)
        assert again.result.shares.plan is first.result.shares.plan
        assert set(recompute._plans) == {"default"}  # a pool not in the config: plan dropped
        assert again.result.fair_share_cu == first.result.fair_share_cu
        changed = reference_config(0.0)  # k = 0: classic fair share, 55 / 45
        install(conn, changed, now_s + 61)
        after = recompute_pool(conn, "default", now_s + 120)
        conn.commit()
    assert after.result.shares.plan is not first.result.shares.plan
    assert after.result.shares["llm"].fair_share_cu == pytest.approx(55.0)
    assert after.result.shares["vision"].fair_share_cu == pytest.approx(45.0)


def test_get_fair_share_reads_the_latest_run_and_history(client: GpufairClient, db: Engine) -> None:
    now_s = time.time()
    with db.connect() as conn:
        build_history(conn, reference_config(1.0), now_s)
        conn.commit()
    # No run stored yet: the first GetFairShare computes one.
    reply = client.ledger.GetFairShare(ledger_pb2.GetFairShareRequest(pool="default"), timeout=30)
    by_queue = {q.queue: q for q in reply.queues}
    assert reply.capacity_cu == 100
    assert by_queue["llm"].fair_share_cu == pytest.approx(70)
    assert by_queue["llm"].weight_share == pytest.approx(0.5)
    assert by_queue["vision"].usage_share == pytest.approx(1.0, rel=1e-6)
    assert by_queue["vision"].priority_weight == pytest.approx(0.0, abs=1e-9)
    assert by_queue["llm"].priority_weight == pytest.approx(1.0)
    assert by_queue["vision"].decayed_usage_cu_s == pytest.approx(50 * 7 * DAY, rel=1e-6)
    assert not by_queue["llm"].HasField("limit_cu")
    assert abs(reply.computed_at.seconds - now_s) < 120

    history = client.ledger.GetFairShareHistory(
        ledger_pb2.GetFairShareHistoryRequest(pool="default", queue="llm"), timeout=10
    )
    assert [p.share.fair_share_cu for p in history.points] == [pytest.approx(70)]

    with pytest.raises(grpc.RpcError) as err:
        client.ledger.GetFairShare(ledger_pb2.GetFairShareRequest(pool="nope"), timeout=10)
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
    with db.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM fair_share_runs")).scalar_one() == 1
