"""Periodic jobs: once per period across replicas, the stale sweeper, retention, metrics."""

from __future__ import annotations

import logging
import os
import time
import uuid
from collections import Counter
from pathlib import Path

import pytest
from prometheus_client import REGISTRY, CollectorRegistry
from serve_support import ServeProcess
from sqlalchemy import Engine, create_engine, text

from gpufair.api.state_metrics import StateCollector
from gpufair.client import GpufairClient
from gpufair.config_file import load_config_file
from gpufair.domain.ledger import EventKind, EventPod, LedgerEvent
from gpufair.domain.model import Workload
from gpufair.jobs.runner import JobSettings, PeriodicJobs
from gpufair.metrics import observe_events
from gpufair.services.sweep import sweep
from gpufair.store import claims_repo as claims
from gpufair.store import ingest_pipeline, workload_repo
from gpufair.store.database import Database, normalise_url
from gpufair.store.retention_repo import Retention, apply_retention
from gpufair.store.scratch import scratch_database

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "clusters" / "llm-vs-vision.yaml"


def started(uid: str, at_s: float, node: str = "gpu-01") -> LedgerEvent:
    return LedgerEvent(str(uuid.uuid4()), EventKind.STARTED, at_s, uid, (EventPod(node, (0,)),))


@pytest.fixture
def cluster(client: GpufairClient) -> GpufairClient:
    config = load_config_file(EXAMPLE)
    config.pools[0].policy.recompute_interval_s = 1
    client.apply_config(config)
    return client


def test_claim_is_won_once() -> None:
    assert claims.period_start(125.5, 60) == 120.0


def test_two_replicas_run_each_job_once_per_period(pg_server: Database, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "GPUFAIR_DATABASE_URL"}
    with scratch_database(pg_server.url) as url:
        args = ["--database-url", url, "--grace-s", "1", "--job-tick-s", "0.25"]
        args += ["--sweep-period-s", "1"]
        replicas = [ServeProcess(args, env, tmp_path / f"replica-{i}.log") for i in range(2)]
        try:
            for r in replicas:
                r.wait_serving()
            config = load_config_file(EXAMPLE)
            config.pools[0].policy.recompute_interval_s = 1
            with GpufairClient(replicas[0].address, attempts=1) as c:
                c.apply_config(config)
            time.sleep(6)
        finally:
            codes = [r.terminate() for r in replicas]
        assert codes == [0, 0]
        engine = create_engine(normalise_url(url))
        try:
            with engine.connect() as conn:
                rows = conn.execute(
                    text(
                        "SELECT job, extract(epoch FROM period_start)::float8, claimed_by, "
                        "outcome FROM job_claims ORDER BY job, period_start"
                    )
                ).all()
                runs = conn.execute(text("SELECT count(*) FROM fair_share_runs")).scalar_one()
        finally:
            engine.dispose()
    by_job = Counter(r[0] for r in rows)
    sweeps = sorted(r[1] for r in rows if r[0] == "sweep")
    recomputes = sorted(r[1] for r in rows if r[0] == "recompute:default")
    # At most one claim per period (the primary key), and the periods kept being claimed while
    # both replicas ticked (a period may go unclaimed on a loaded machine: a tick came late).
    assert len(sweeps) == len(set(sweeps)) >= 4
    assert len(recomputes) == len(set(recomputes)) >= 3
    # Each recompute claim did its work exactly once: one stored run per claim.
    assert runs == by_job["recompute:default"]
    assert by_job["rollup"] == 1 and by_job["retention"] == 1
    assert all(r[3] is not None and r[3].startswith("ok") for r in rows if r[0] != "sweep" or r[3])
    # Whichever replica won a period, it was one of the two.
    assert 1 <= len({r[2] for r in rows}) <= 2


def test_sweeper_closes_silent_runs_at_their_last_heartbeat(
    cluster: GpufairClient, db: Engine
) -> None:
    now = time.time()
    with db.connect() as conn:
        workload_repo.submit(conn, [Workload("quiet", "llm", "default", 1, 1, now - 7200)])
        workload_repo.submit(conn, [Workload("alive", "llm", "default", 1, 1, now - 7200)])
        beat = LedgerEvent(str(uuid.uuid4()), EventKind.HEARTBEAT, now - 3000, "quiet")
        fresh = LedgerEvent(str(uuid.uuid4()), EventKind.HEARTBEAT, now - 10, "alive")
        ingest_pipeline.ingest(
            conn,
            [started("quiet", now - 7200), beat, started("alive", now - 7200, "gpu-02"), fresh],
            now,
        )
        assert sweep(conn, now, stale_after_s=600) == (1, 0)
        assert sweep(conn, now, stale_after_s=600) == (0, 0)  # idempotent
        rows = conn.execute(
            text(
                "SELECT workload_uid, end_kind, extract(epoch FROM ended_at)::float8 "
                "FROM allocation_intervals ORDER BY workload_uid"
            )
        ).all()
        conn.commit()
    assert rows[0][:2] == ("alive", None)
    assert rows[1][:2] == ("quiet", "stale")
    assert rows[1][2] == pytest.approx(now - 3000, abs=1e-3)


def test_retention_keeps_what_runs_need(cluster: GpufairClient, db: Engine) -> None:
    now = time.time()
    old = now - 200 * 86400
    with db.connect() as conn:
        workload_repo.submit(
            conn,
            [
                Workload("done", "llm", "default", 1, 1, old),
                Workload("running", "llm", "default", 1, 1, old),
            ],
        )
        events = [
            started("done", old),
            LedgerEvent(str(uuid.uuid4()), EventKind.STOPPED, old + 3600, "done"),
            started("running", old, "gpu-02"),
            LedgerEvent(str(uuid.uuid4()), EventKind.HEARTBEAT, now - 9 * 86400, "running"),
            LedgerEvent(str(uuid.uuid4()), EventKind.HEARTBEAT, now - 8 * 86400, "running"),
        ]
        ingest_pipeline.ingest(conn, events, now)
        deleted = apply_retention(conn, now, Retention(events_days=180, heartbeats_days=7))
        kinds = conn.execute(
            text(
                "SELECT workload_uid, kind, extract(epoch FROM occurred_at)::float8 "
                "FROM ledger_events ORDER BY workload_uid, kind"
            )
        ).all()
        # The latest heartbeat stays, however old: the sweeper closes the run there.
        assert sweep(conn, now, stale_after_s=600) == (1, 0)
        ended = conn.execute(
            text(
                "SELECT extract(epoch FROM ended_at)::float8 FROM allocation_intervals "
                "WHERE workload_uid = 'running'"
            )
        ).scalar_one()
        conn.commit()
    assert deleted["events"] == 2 and deleted["heartbeats"] == 1
    assert deleted["workloads_purged"] == 1
    assert [k[:2] for k in kinds] == [("running", "heartbeat"), ("running", "started")]
    assert kinds[0][2] == pytest.approx(now - 8 * 86400, abs=1e-3)
    assert ended == pytest.approx(now - 8 * 86400, abs=1e-3)


def test_a_late_run_event_of_a_purged_workload_is_refused(
    cluster: GpufairClient, db: Engine
) -> None:
    """Once retention removed a workload's events, its runs stay as they are: a late stop would
    otherwise rebuild them from itself alone, and the run it ended would vanish."""
    now = time.time()
    old = now - 200 * 86400
    with db.connect() as conn:
        workload_repo.submit(conn, [Workload("done", "llm", "default", 1, 1, old)])
        stop = LedgerEvent(str(uuid.uuid4()), EventKind.STOPPED, old + 3600, "done")
        ingest_pipeline.ingest(conn, [started("done", old), stop], now)
        apply_retention(conn, now, Retention(events_days=180))

        def runs() -> list[tuple[float, float]]:
            rows = conn.execute(
                text(
                    "SELECT extract(epoch FROM started_at)::float8, "
                    "extract(epoch FROM ended_at)::float8 FROM allocation_intervals "
                    "WHERE workload_uid = 'done'"
                )
            ).all()
            return [(r[0], r[1]) for r in rows]

        before = runs()
        late = LedgerEvent(str(uuid.uuid4()), EventKind.STOPPED, old + 7200, "done")
        beat = LedgerEvent(str(uuid.uuid4()), EventKind.HEARTBEAT, old + 7000, "done")
        outcomes = ingest_pipeline.ingest(conn, [late, beat], now)
        after = runs()
        conn.commit()
    assert len(before) == 1 and before[0][1] == pytest.approx(old + 3600, abs=1e-3)
    assert [(o.status, o.error) for o in outcomes] == [
        (ingest_pipeline.EventStatus.REJECTED, ingest_pipeline.PURGED),
        (ingest_pipeline.EventStatus.STORED, ""),  # a heartbeat changes no run
    ]
    assert after == before


def test_recompute_job_updates_metrics(cluster: GpufairClient, db: Engine) -> None:
    now = time.time()
    with db.connect() as conn:
        workload_repo.submit(conn, [Workload("inference", "llm", "default", 1, 1, now - 60)])
        ingest_pipeline.ingest(conn, [started("inference", now - 60)], now)
        conn.commit()
    jobs = PeriodicJobs(db, JobSettings(), clock=lambda: now, replica="test")
    jobs.tick()
    with db.connect() as conn:
        outcomes = dict(conn.execute(text("SELECT job, outcome FROM job_claims")).all())
    assert outcomes["recompute:default"].startswith("ok: run ")
    assert outcomes["sweep"] == "ok: 0 stale runs closed, 0 reopened"
    registry = CollectorRegistry()
    registry.register(StateCollector(db, cache_s=0.0))
    labels = {"pool": "default", "queue": "llm"}
    assert registry.get_sample_value("gpufair_allocated_cu", labels) == 1.0
    assert registry.get_sample_value("gpufair_fair_share_cu", labels) == pytest.approx(1.0)
    job = {"periodic_job": "recompute:default"}
    assert registry.get_sample_value("gpufair_periodic_job_last_failed", job) == 0.0
    success = registry.get_sample_value("gpufair_periodic_job_last_success_timestamp_seconds", job)
    assert success == pytest.approx(time.time(), abs=60)
    assert REGISTRY.get_sample_value("gpufair_periodic_job_failures_total", job) == 0.0
    jobs.tick()  # same period: nothing runs twice
    with db.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM fair_share_runs")).scalar_one() == 1


def test_rpc_metrics_count_calls_by_status(cluster: GpufairClient) -> None:
    labels = {"method": "GetConfig", "code": "OK"}
    before = REGISTRY.get_sample_value("gpufair_rpcs_total", labels) or 0.0
    cluster.get_config()
    assert REGISTRY.get_sample_value("gpufair_rpcs_total", labels) == before + 1


def test_ingest_metrics_count_events_and_their_lag() -> None:
    def sample(name: str, **labels: str) -> float:
        return REGISTRY.get_sample_value(name, labels) or 0.0

    lag, events = "gpufair_ingest_lag_seconds", "gpufair_events_total"
    before = {
        "le_1": sample(f"{lag}_bucket", le="1.0"),
        "le_60": sample(f"{lag}_bucket", le="60.0"),
        "inf": sample(f"{lag}_bucket", le="+Inf"),
        "count": sample(f"{lag}_count"),
        "sum": sample(f"{lag}_sum"),
        "stored": sample(events, status="stored"),
        "rejected": sample(events, status="rejected"),
    }
    observe_events([0.5, 1.0, 30.0, 1e6, -2.0], {"stored": 5, "rejected": 2})
    assert sample(f"{lag}_bucket", le="1.0") == before["le_1"] + 3  # 0.5, 1.0 and -2 as 0
    assert sample(f"{lag}_bucket", le="60.0") == before["le_60"] + 4
    assert sample(f"{lag}_bucket", le="+Inf") == before["inf"] + 5
    assert sample(f"{lag}_count") == before["count"] + 5
    assert sample(f"{lag}_sum") == pytest.approx(before["sum"] + 0.5 + 1.0 + 30.0 + 1e6)
    assert sample(events, status="stored") == before["stored"] + 5
    assert sample(events, status="rejected") == before["rejected"] + 2


def test_a_skipped_tick_is_not_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    """A tick that overruns its interval makes APScheduler skip the next one (one tick at a time,
    by design): that is not logged; APScheduler's other warnings still are."""
    scheduler_log = logging.getLogger("apscheduler.scheduler")
    with caplog.at_level(logging.WARNING, logger="apscheduler.scheduler"):
        scheduler_log.warning(
            'Execution of job "%s" skipped: maximum number of running instances reached (%d)',
            "PeriodicJobs.tick (trigger: interval[0:00:00.500000])",
            1,
        )
        scheduler_log.warning("Run time of job %s was missed by %s", "tick", "0:00:02")
    assert [r.getMessage() for r in caplog.records] == [
        "Run time of job tick was missed by 0:00:02"
    ]
