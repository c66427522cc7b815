"""The metrics endpoint's gauges come from the database: two replicas export the same values after
a recompute made by one of them, a deleted queue's gauges disappear, and a Schedule is counted
with the waits it ended."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from prometheus_client import REGISTRY, CollectorRegistry, generate_latest
from sqlalchemy import Engine

from gpufair.api.state_metrics import StateCollector
from gpufair.client import GpufairClient
from gpufair.config_file import load_config_file
from gpufair.domain.ledger import EventKind, EventPod, LedgerEvent
from gpufair.domain.model import Workload
from gpufair.jobs.runner import JobSettings, PeriodicJobs
from gpufair.store import ingest_pipeline, workload_repo
from gpufair.store.database import make_engine
from gpufair.v1 import cluster_pb2

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "clusters" / "llm-vs-vision.yaml"
POOL = {"pool": "default"}
# The budget tests' runs send no heartbeat: the sweeper, which runs beside the rollups
# (jobs/runner.py), would close them at their start.
NO_SWEEP = JobSettings(stale_after_s=86400.0)


def _config(with_audio: bool) -> cluster_pb2.ClusterConfig:
    config = load_config_file(EXAMPLE)
    if with_audio:
        audio = config.queues.add(name="audio")
        audio.quotas.add(pool="default", deserved_cu=0, over_quota_weight=1)
    return config


@pytest.fixture
def replicas(engine: Engine, database_url: str) -> Iterator[tuple[CollectorRegistry, ...]]:
    """Two replicas' metrics registries, each reading through its own engine."""
    other = make_engine(database_url, pool_size=2)
    registries = (CollectorRegistry(), CollectorRegistry())
    registries[0].register(StateCollector(engine, cache_s=0.0))
    registries[1].register(StateCollector(other, cache_s=0.0))
    yield registries
    other.dispose()


def _state_lines(registry: CollectorRegistry, prefix: str) -> list[str]:
    text = generate_latest(registry).decode()
    return sorted(line for line in text.splitlines() if line.startswith(prefix))


def _run_vision(db: Engine, now: float, since_s: float | None = None) -> None:
    """The vision team runs 40 GPUs (10 nodes x 4), since a minute ago unless `since_s`."""
    start = now - 60 if since_s is None else since_s
    pods = tuple(EventPod(f"gpu-{n:02d}", (0, 1, 2, 3)) for n in range(1, 11))
    with db.connect() as conn:
        workload_repo.submit(conn, [Workload("vision-train", "vision", "default", 10, 4, start)])
        event = LedgerEvent(str(uuid.uuid4()), EventKind.STARTED, start, "vision-train", pods)
        ingest_pipeline.ingest(conn, [event], now)
        conn.commit()


def test_two_replicas_export_the_same_fair_shares_and_forget_deleted_queues(
    client: GpufairClient, db: Engine, replicas: tuple[CollectorRegistry, ...]
) -> None:
    client.apply_config(_config(with_audio=True))
    now = time.time()
    _run_vision(db, now)
    with db.connect() as conn:  # the LLM team waits with a 60-GPU gang
        workload_repo.submit(conn, [Workload("llm-post", "llm", "default", 15, 4, now - 30)])
        conn.commit()
    # Replica "a" runs the recompute; the other replica computed nothing.
    PeriodicJobs(db, JobSettings(), clock=lambda: now, replica="a").tick()

    first, second = replicas
    assert _state_lines(first, "gpufair_") == _state_lines(second, "gpufair_")
    for registry in replicas:
        llm, vision = ({**POOL, "queue": q} for q in ("llm", "vision"))
        # 100 GPUs: deserved 30 + 20, the other 50 split by demand (llm 60, vision 40).
        assert registry.get_sample_value("gpufair_fair_share_cu", llm) == pytest.approx(60.0)
        assert registry.get_sample_value("gpufair_fair_share_cu", vision) == pytest.approx(40.0)
        assert registry.get_sample_value("gpufair_allocated_cu", vision) == 40.0
        assert registry.get_sample_value("gpufair_demand_cu", llm) == 60.0
        assert registry.get_sample_value("gpufair_deserved_cu", llm) == 30.0
        assert registry.get_sample_value("gpufair_limit_cu", llm) is None  # unlimited
        capacity = {**POOL, "gpu_type": "h100-80gb"}
        assert registry.get_sample_value("gpufair_pool_capacity_gpus", capacity) == 100.0
        assert registry.get_sample_value("gpufair_pool_allocated_gpus", capacity) == 40.0
        assert (
            registry.get_sample_value(
                "gpufair_pending_workloads", {**llm, "reason": "not_scheduled_yet"}
            )
            == 1.0
        )
        audio = {**POOL, "queue": "audio"}
        assert registry.get_sample_value("gpufair_fair_share_cu", audio) == 0.0
        assert registry.get_sample_value("gpufair_database_up", {}) == 1.0

    client.apply_config(_config(with_audio=False))  # audio deleted; no recompute since
    for registry in replicas:
        assert "audio" not in "".join(_state_lines(registry, "gpufair_"))
        assert registry.get_sample_value("gpufair_fair_share_cu", {**POOL, "queue": "llm"}) == 60.0


def test_budgets_export_consumption_and_projected_exhaustion(
    client: GpufairClient, db: Engine
) -> None:
    config = _config(with_audio=False)
    config.budgets[1].cu_hours = 100.0  # vision: 100 CU-hours a week
    client.apply_config(config)
    # Wednesday 2026-11-25 12:30 UTC; the vision team has run 40 GPUs since 10:00.
    now = datetime(2026, 11, 25, 12, 30, tzinfo=UTC).timestamp()
    _run_vision(db, now, since_s=now - 2.5 * 3600)
    PeriodicJobs(db, NO_SWEEP, clock=lambda: now, replica="a").tick()  # rollups to 12:00
    registry = CollectorRegistry()
    registry.register(StateCollector(db, clock=lambda: now, cache_s=0.0))
    labels = {"queue": "vision", "pool": "", "period": "week"}

    def value(name: str) -> float | None:
        return registry.get_sample_value(f"gpufair_budget_{name}", labels)

    # Two whole hours (10:00-12:00) count: 80 CU-hours over 2.5 days since Monday 00:00.
    assert value("cu_hours") == 100.0
    assert value("consumed_cu_hours") == pytest.approx(80.0)
    assert value("remaining_cu_hours") == pytest.approx(20.0)
    assert value("burn_cu_hours_per_day") == pytest.approx(32.0)
    week_end = datetime(2026, 11, 30, tzinfo=UTC).timestamp()
    assert value("period_end_timestamp_seconds") == week_end
    # 20 CU-hours left at 32 a day: 15 hours after 12:00, well before the week ends.
    noon = datetime(2026, 11, 25, 12, tzinfo=UTC).timestamp()
    assert value("projected_exhaustion_timestamp_seconds") == pytest.approx(noon + 15 * 3600)


@pytest.mark.parametrize(
    ("budget_cu_hours", "exhaustion"),
    [
        # 40 CU-hours in 10:00-11:00, 40 more in 11:00-12:00: 50 were reached at 11:15, an
        # instant already past, and the gauge says it.
        (50.0, datetime(2026, 11, 25, 11, 15, tzinfo=UTC).timestamp()),
        # 920 CU-hours left at 32 a day last 28.75 days, past the week's end: no sample.
        (1000.0, None),
    ],
)
def test_projected_exhaustion_is_a_past_instant_once_spent_and_absent_past_the_period(
    client: GpufairClient, db: Engine, budget_cu_hours: float, exhaustion: float | None
) -> None:
    config = _config(with_audio=False)
    config.budgets[1].cu_hours = budget_cu_hours  # vision, a week
    client.apply_config(config)
    now = datetime(2026, 11, 25, 12, 30, tzinfo=UTC).timestamp()
    _run_vision(db, now, since_s=now - 2.5 * 3600)
    PeriodicJobs(db, NO_SWEEP, clock=lambda: now, replica="a").tick()
    registry = CollectorRegistry()
    registry.register(StateCollector(db, clock=lambda: now, cache_s=0.0))
    name = "gpufair_budget_projected_exhaustion_timestamp_seconds"
    labels = {"queue": "vision", "pool": "", "period": "week"}
    assert registry.get_sample_value(name, labels) == (
        None if exhaustion is None else pytest.approx(exhaustion)
    )
    assert registry.get_sample_value("gpufair_budget_remaining_cu_hours", labels) == (
        pytest.approx(budget_cu_hours - 80.0)
    )
    # The help says both cases, not only "at its current burn rate".
    helps = [line for line in _state_lines(registry, "# HELP ") if f" {name} " in line]
    assert helps == [
        f"# HELP {name} When the budget ran out in its current period, or will at its average "
        "burn so far before the period ends; absent when it outlasts the period at that burn"
    ]


def test_schedule_counts_binds_waits_and_pending_reasons(
    client: GpufairClient, db: Engine, replicas: tuple[CollectorRegistry, ...]
) -> None:
    client.apply_config(_config(with_audio=False))
    now = time.time()
    _run_vision(db, now)
    with db.connect() as conn:
        workload_repo.submit(
            conn,
            [
                Workload("llm-gang", "llm", "default", 15, 4, now - 600),  # a 15-pod gang
                Workload("llm-extra", "llm", "default", 1, 4, now - 5),  # no room after it
            ],
        )
        conn.commit()

    def sample(name: str, **labels: str) -> float:
        return REGISTRY.get_sample_value(name, labels) or 0.0

    wait = ("gpufair_wait_seconds_bucket", {"pool": "default", "queue": "llm"})
    before = {
        "le_300": sample(wait[0], **wait[1], le="300.0"),
        "le_1800": sample(wait[0], **wait[1], le="1800.0"),
        "gang": sample("gpufair_gang_first_bind_seconds_count", pool="default", gang_size="8-15"),
        "binds": sample("gpufair_binds_total", pool="default", queue="llm", gpu_type="h100-80gb"),
        "cycles": sample("gpufair_schedule_cycle_seconds_count", pool="default"),
    }
    reply = client.schedule("default", request_id="cycle-1")
    assert [b.uid for b in reply.binds] == ["llm-gang"]
    reasons = {p.uid: p.reason_code for p in reply.pending}
    assert set(reasons) == {"llm-extra"}

    # The gang waited 600 s: counted above the 300 s bucket, within the 1800 s one.
    assert sample(wait[0], **wait[1], le="300.0") == before["le_300"]
    assert sample(wait[0], **wait[1], le="1800.0") == before["le_1800"] + 1
    gang = sample("gpufair_gang_first_bind_seconds_count", pool="default", gang_size="8-15")
    assert gang == before["gang"] + 1
    binds = sample("gpufair_binds_total", pool="default", queue="llm", gpu_type="h100-80gb")
    assert binds == before["binds"] + 1
    assert sample("gpufair_schedule_cycle_seconds_count", pool="default") == before["cycles"] + 1
    assert (
        REGISTRY.get_sample_value(
            "gpufair_evictions_total", {"pool": "default", "reason": "reclaim"}
        )
        is not None
    )  # every reason exported from the first cycle on

    # A dry run and a replay of the same request id count nothing more.
    client.schedule("default", dry_run=True)
    assert client.schedule("default", request_id="cycle-1") == reply
    assert sample("gpufair_schedule_cycle_seconds_count", pool="default") == before["cycles"] + 1

    for registry in replicas:
        pending = {"pool": "default", "queue": "llm", "reason": reasons["llm-extra"]}
        assert registry.get_sample_value("gpufair_pending_workloads", pending) == 1.0


def test_each_periodic_job_exports_its_period(client: GpufairClient, db: Engine) -> None:
    """The period a job is overdue against: a pool's recompute interval as configured now, the
    other jobs' as this process's runner runs them."""
    config = _config(with_audio=False)
    config.pools[0].policy.recompute_interval_s = 21600.0
    client.apply_config(config)
    settings = JobSettings(rollup_period_s=1800.0, sweep_period_s=45.0)
    now = time.time()
    PeriodicJobs(db, settings, clock=lambda: now, replica="a").tick()
    registry = CollectorRegistry()
    registry.register(StateCollector(db, cache_s=0.0))
    name = "gpufair_periodic_job_period_seconds"
    assert _state_lines(registry, name + "{") == [
        f'{name}{{periodic_job="recompute:default"}} 21600.0',
        f'{name}{{periodic_job="retention"}} 86400.0',
        f'{name}{{periodic_job="rollup"}} 1800.0',
        f'{name}{{periodic_job="sweep"}} 45.0',
    ]
    # A new interval counts from the apply on, before the runner's next tick.
    config.pools[0].policy.recompute_interval_s = 300.0
    client.apply_config(config)
    assert registry.get_sample_value(name, {"periodic_job": "recompute:default"}) == 300.0
