"""report.pool_utilisation_daily on a day a node was drained under work (migration 0032).

Two pools alike, `p` and `q`: four nodes of 8 `unit` GPUs (1 CU) each, w, x, y and z, configured
from the day before. The view read the capacity rows, which count ready nodes only: a drained
node left the capacity at once while the work running there still counted as used, and a day
read above 1. It now counts, while a node is not ready, the GPUs the pool's runs hold there (at
most what the node counts for), as the fair share's division and U''s capacity do
(`capacity_repo.usage_capacity`, which the tests compare it with).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime

import pytest
from sqlalchemy import Connection, Engine, text

from gpufair.api.config_write import write
from gpufair.domain.config_diff import diff_configs
from gpufair.domain.ledger import EventKind, EventPod, LedgerEvent
from gpufair.domain.model import (
    ClusterConfig,
    GpuType,
    Node,
    NodePool,
    Queue,
    QueueQuota,
    Workload,
    frozen_map,
)
from gpufair.services.recompute import recompute_pool
from gpufair.store import capacity_repo, config_repo, ingest_pipeline, workload_repo

DAY_START = 1_767_225_600.0  # 2026-01-01 00:00 UTC, long closed by any clock running the tests
HOUR = 3600.0
DAY = 86400.0
NOW = DAY_START + DAY + 1234.5  # the recompute that rolls the day up
STORED = ingest_pipeline.EventStatus.STORED

CONFIG = ClusterConfig(
    gpu_types=(GpuType("unit", 40, 1),),
    pools=(NodePool("p"), NodePool("q")),
    nodes=tuple(
        Node(f"{pool}-{n}", pool, "unit", 8, 64000, 512000) for pool in ("p", "q") for n in "wxyz"
    ),
    queues=(Queue("a", None, frozen_map({pool: QueueQuota(pool, 16) for pool in ("p", "q")})),),
)


def _apply(conn: Connection, config: ClusterConfig, at_s: float) -> None:
    write(
        conn, config, diff_configs(config_repo.load_config(conn), config), dry_run=False, now_s=at_s
    )


def _ready(conn: Connection, node: str, ready: bool, at_s: float) -> None:
    config = config_repo.load_config(conn)
    nodes = tuple(replace(n, ready=ready) if n.name == node else n for n in config.nodes)
    _apply(conn, replace(config, nodes=nodes), at_s)


def _run(
    conn: Connection,
    uid: str,
    pool: str,
    pod: EventPod,
    start_s: float,
    end_s: float | None = None,
) -> None:
    workload_repo.submit(conn, [Workload(uid, "a", pool, 1, pod.gpus, submit_time_s=start_s)])
    events = [LedgerEvent(str(uuid.uuid4()), EventKind.STARTED, start_s, uid, (pod,))]
    if end_s is not None:
        events.append(LedgerEvent(str(uuid.uuid4()), EventKind.STOPPED, end_s, uid))
    assert {o.status for o in ingest_pipeline.ingest(conn, events, NOW)} == {STORED}


def _day(conn: Connection, pool: str) -> tuple[float, float, float, float]:
    """The day's (capacity GPU-hours, used, idle, utilisation) of `pool`, after the recompute
    at NOW rolled the day's hours up."""
    recompute_pool(conn, pool, NOW)
    row = conn.execute(
        text(
            "SELECT capacity_gpu_hours, used_gpu_hours, idle_gpu_hours, utilisation "
            "FROM report.pool_utilisation_daily WHERE pool = :pool AND day = :day"
        ),
        {"pool": pool, "day": datetime.fromtimestamp(DAY_START, UTC)},
    ).one()
    return (row.capacity_gpu_hours, row.used_gpu_hours, row.idle_gpu_hours, row.utilisation)


def _window_gpu_hours(conn: Connection, pool: str) -> float:
    """The day's capacity as U' divides by it (`usage_capacity`), in GPU-hours (1 CU a GPU)."""
    not_ready = capacity_repo.not_ready_nodes(config_repo.load_config(conn), pool)
    segments = capacity_repo.usage_capacity(
        conn, pool, NOW, [(DAY_START, DAY_START + DAY)], not_ready
    )
    return (
        sum(
            s.value * (min(s.end_s, DAY_START + DAY) - max(s.start_s, DAY_START))
            for s in segments
            if s.end_s > DAY_START and s.start_s < DAY_START + DAY
        )
        / HOUR
    )


@pytest.fixture
def conn(db: Engine) -> Iterator[Connection]:
    with db.connect() as connection:
        _apply(connection, CONFIG, DAY_START - 2 * HOUR)
        yield connection
        connection.rollback()


def test_a_six_hour_drain_under_work_reads_as_a_full_pool_not_above_it(conn: Connection) -> None:
    """Each pool is full all day: four 8-GPU jobs, one on each node. In p, x is drained from
    06:00 to 12:00 while its job keeps running. Before: p's day read 720 capacity GPU-hours
    (768 less x's 8 GPUs for 6 h) against 768 used, utilisation 1.067, idle -48. Now it reads
    what q reads: 768, 768, 0 idle, utilisation 1."""
    for pool in ("p", "q"):
        for node in "wxyz":
            pod = EventPod(f"{pool}-{node}", tuple(range(8)))
            _run(conn, f"{pool}-{node}", pool, pod, DAY_START - HOUR)
    _ready(conn, "p-x", False, DAY_START + 6 * HOUR)
    _ready(conn, "p-x", True, DAY_START + 12 * HOUR)
    assert _day(conn, "q") == (768.0, 768.0, 0.0, 1.0)
    assert _day(conn, "p") == (768.0, 768.0, 0.0, 1.0)
    assert _window_gpu_hours(conn, "p") == pytest.approx(768.0, rel=1e-12)


def test_the_drained_node_counts_what_its_runs_hold_at_most_what_it_counts_for(
    conn: Connection,
) -> None:
    """p's w, y and z are full all day (576 GPU-hours). x is drained from 06:00 on, under a
    4-GPU job that stops at 10:00 and a half of a shared GPU held all day; at 08:00 x reports
    only 4 usable GPUs. x counts 8 GPUs until 06:00 (48), then what its work holds: 4.5 for 2 h
    (9), at most the 4 it counts for from 08:00 (8), 0.5 from 10:00 (7). Capacity 648, used
    576 + 40 + 12 = 628, utilisation 0.969. Before: 624 capacity (x out from 06:00), 1.006.
    Free GPUs of the drained node never count."""
    for node in "wyz":
        _run(conn, f"p-{node}", "p", EventPod(f"p-{node}", tuple(range(8))), DAY_START - HOUR)
    _run(conn, "p-x4", "p", EventPod("p-x", (0, 1, 2, 3)), DAY_START - HOUR, DAY_START + 10 * HOUR)
    _run(conn, "p-half", "p", EventPod("p-x", (4,), 0.5), DAY_START - HOUR)
    _ready(conn, "p-x", False, DAY_START + 6 * HOUR)
    report = LedgerEvent(
        str(uuid.uuid4()), EventKind.NODE_CAPACITY, DAY_START + 8 * HOUR, node="p-x", gpu_count=4
    )
    assert [o.status for o in ingest_pipeline.ingest(conn, [report], NOW)] == [STORED]
    capacity, used, idle, utilisation = _day(conn, "p")
    assert (capacity, used) == (pytest.approx(648.0), pytest.approx(628.0))
    assert idle == pytest.approx(20.0)
    assert utilisation == pytest.approx(628 / 648)
    assert _window_gpu_hours(conn, "p") == pytest.approx(648.0, rel=1e-12)


def test_a_drained_node_without_work_leaves_the_capacity(conn: Connection) -> None:
    """x drained from 06:00 with nothing on it: 24 GPUs all day and x's 8 until 06:00, 624
    GPU-hours, as before. A run of another pool on a node name alike counts nowhere here."""
    _ready(conn, "p-x", False, DAY_START + 6 * HOUR)
    _run(conn, "q-w", "q", EventPod("q-w", tuple(range(8))), DAY_START - HOUR)
    capacity, used, _idle, utilisation = _day(conn, "p")
    assert (capacity, used, utilisation) == (624.0, 0.0, 0.0)
    assert _window_gpu_hours(conn, "p") == pytest.approx(624.0, rel=1e-12)
