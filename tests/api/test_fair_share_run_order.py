"""The latest fair-share run is the last one stored, whatever its date: a replica whose clock
runs a day ahead recomputes through the API (GetFairShare) and stores a run dated tomorrow; the
periodic job of an honest replica then stores one dated now. Every reader of runs takes that
honest run as the latest: GetFairShare on both replicas (their cached replies included), the
metrics' gauges, and GetFairShareHistory, whose points come in the order the runs were stored.

Pool `default` of the example (100 H100): vision runs 40 GPUs; before the honest run, the LLM
team submits a 60-GPU gang, so the two runs differ (LLM's share 0, then 60).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from prometheus_client import CollectorRegistry
from sqlalchemy import Engine, text

from gpufair.api.convert_workload import workload_to_proto
from gpufair.api.server import build_server
from gpufair.api.state_metrics import StateCollector
from gpufair.client import GpufairClient
from gpufair.domain.model import Workload
from gpufair.jobs.runner import JobSettings, PeriodicJobs
from gpufair.store import fairshare_repo, read_versions, workload_repo
from tests.api.test_state_metrics import _config, _run_vision

DAY = 86400.0


@pytest.fixture
def now_s() -> float:
    return float(int(time.time()))  # whole seconds: the replies' timestamps compare exactly


@pytest.fixture
def ahead(db: Engine, now_s: float) -> Iterator[GpufairClient]:
    """A client of a replica whose clock is a day ahead."""
    running = build_server(db, "127.0.0.1:0", max_workers=4, clock=lambda: now_s + DAY)
    try:
        with GpufairClient(f"127.0.0.1:{running.port}", timeout_s=20, attempts=1) as c:
            yield c
    finally:
        running.stop(1.0)


def _shares(reply: object) -> dict[str, float]:
    return {q.queue: q.fair_share_cu for q in reply.queues}  # type: ignore[attr-defined]


def test_a_run_dated_ahead_does_not_hide_later_runs(
    client: GpufairClient, ahead: GpufairClient, db: Engine, now_s: float
) -> None:
    client.apply_config(_config(with_audio=False))
    _run_vision(db, now_s)
    future = ahead.get_fair_share("default")  # no run yet: computed now, by a clock a day ahead
    assert future.computed_at.seconds == now_s + DAY
    assert _shares(future) == {"llm": 0.0, "vision": 40.0}

    with db.connect() as conn:
        workload_repo.submit(conn, [Workload("llm-post", "llm", "default", 15, 4, now_s - 30)])
        conn.commit()
    PeriodicJobs(db, JobSettings(), clock=lambda: now_s, replica="honest").tick()
    with db.connect() as conn:
        runs = conn.execute(
            text("SELECT id, extract(epoch FROM computed_at) FROM fair_share_runs ORDER BY id")
        ).all()
        assert [at for _, at in runs] == [now_s + DAY, now_s]
        honest_id = runs[1][0]
        latest = fairshare_repo.latest_run(conn, "default")
        key = read_versions.fair_share_run_key(conn, "default")
    assert latest is not None and (latest.run_id, latest.computed_at_s) == (honest_id, now_s)
    assert key is not None and key.startswith(f"{honest_id}@")

    for replica in (client, ahead):  # the ahead one had cached the run dated tomorrow
        reply = replica.get_fair_share("default")
        assert reply.computed_at.seconds == now_s
        assert _shares(reply) == {"llm": 60.0, "vision": 40.0}

    registry = CollectorRegistry()
    registry.register(StateCollector(db, cache_s=0.0))
    pool = {"pool": "default"}
    assert registry.get_sample_value("gpufair_fair_share_computed_timestamp_seconds", pool) == now_s
    llm = {**pool, "queue": "llm"}
    assert registry.get_sample_value("gpufair_fair_share_cu", llm) == 60.0

    history = client.get_fair_share_history(
        "default",
        queue="llm",
        since=datetime.fromtimestamp(now_s - 3600, UTC),
        until=datetime.fromtimestamp(now_s + 2 * DAY, UTC),
    )
    points = [(p.computed_at.seconds, p.share.fair_share_cu) for p in history.points]
    assert points == [(now_s + DAY, 0.0), (now_s, 60.0)]  # as stored; the last is the latest


def test_schedule_recomputes_over_a_run_dated_ahead(
    client: GpufairClient, ahead: GpufairClient, db: Engine, now_s: float
) -> None:
    """Its age (negative) says nothing of a run dated tomorrow: an honest replica's Schedule
    recomputes at once, so the LLM team's new gang counts as demand without waiting for the
    periodic job."""
    client.apply_config(_config(with_audio=False))
    _run_vision(db, now_s)
    assert _shares(ahead.get_fair_share("default")) == {"llm": 0.0, "vision": 40.0}
    client.submit_workloads(
        [workload_to_proto(Workload("llm-post", "llm", "default", 15, 4, now_s))]
    )
    client.schedule("default")
    with db.connect() as conn:
        runs = (
            conn.execute(
                text("SELECT extract(epoch FROM computed_at) FROM fair_share_runs ORDER BY id")
            )
            .scalars()
            .all()
        )
        latest = fairshare_repo.latest_run(conn, "default")
    assert len(runs) == 2 and runs[0] == now_s + DAY
    assert now_s <= runs[1] < now_s + 60  # this replica's clock
    assert latest is not None
    assert {s.queue: s.fair_share_cu for s in latest.shares} == {"llm": 60.0, "vision": 40.0}
