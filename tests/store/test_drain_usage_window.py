"""U' while a node is drained under work: the usage window's capacity counts what the work still
holds there (`capacity_repo.usage_capacity`), as the division does now (`division_capacity`).

Two pools alike, `p` and `q`: four nodes of 8 `unit` GPUs (1 CU) each, w, x, y and z. In each,
for the last 8 days: a (deserved 20) runs 8 GPUs on x, 8 on w and 4 on y, in quota; b (deserved
0) 4 on y and 4 on z; d (deserved 0) 4 on z. The pool is full; b is 8 CU over quota, d 4, of the
12 CU over quota (32 - 20), and both wait for 8 more GPUs. A 7-day sliding window, no half-life,
equal weights, k = 1: U' is 8/12 and 4/12, P = 1/3 and 2/3, shares 4 and 8 CU of the 12.

In `p`, x is drained (a config apply, ready=false) some hours before now while a's work keeps
running there. The rows of `p`'s capacity say 24 CU from the drain on. Dividing U' by them
(ready nodes only) while b's and d's usage stayed counted inflated U': b's 0.677 after 4 h,
0.737 after 24 h (shares 3.53 and 8.47 CU instead of 4 and 8), 0.933 after 72 h (1.33 and
10.67). `q` is never drained.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import replace

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
from gpufair.store import capacity_repo, config_repo, ingest_pipeline, rollup_repo, workload_repo

NOW = 1_767_225_600.0 + 1234.5  # 2026-01-01 00:20:34.5 UTC: mid-hour on purpose
HOUR = 3600.0
DAY = 86400.0
STORED = ingest_pipeline.EventStatus.STORED


def _quota(deserved: float) -> dict[str, QueueQuota]:
    return {pool: QueueQuota(pool, deserved_cu=deserved) for pool in ("p", "q")}


CONFIG = ClusterConfig(
    gpu_types=(GpuType("unit", 40, 1),),
    pools=(NodePool("p"), NodePool("q")),
    nodes=tuple(
        Node(f"{pool}-{n}", pool, "unit", 8, 64000, 512000) for pool in ("p", "q") for n in "wxyz"
    ),
    queues=tuple(
        Queue(name, None, frozen_map(_quota(deserved)))
        for name, deserved in (("a", 20), ("b", 0), ("d", 0))
    ),
)

# uid suffix: (queue, node, GPU indices)
RUNNING = {
    "a-x": ("a", "x", range(8)),
    "a-w": ("a", "w", range(8)),
    "a-y": ("a", "y", range(4)),
    "b-y": ("b", "y", range(4, 8)),
    "b-z": ("b", "z", range(4)),
    "d-z": ("d", "z", range(4, 8)),
}


def _apply(conn: Connection, config: ClusterConfig, at_s: float) -> None:
    write(
        conn, config, diff_configs(config_repo.load_config(conn), config), dry_run=False, now_s=at_s
    )


def _set_up(conn: Connection, drained_hours: float) -> None:
    start_s = NOW - 8 * DAY
    _apply(conn, CONFIG, start_s - HOUR)
    workloads, events = [], []
    for pool in ("p", "q"):
        for suffix, (queue, node, gpus) in RUNNING.items():
            uid = f"{pool}-{suffix}"
            workloads.append(Workload(uid, queue, pool, 1, len(gpus), submit_time_s=start_s))
            pods = (EventPod(f"{pool}-{node}", tuple(gpus)),)
            events.append(LedgerEvent(str(uuid.uuid4()), EventKind.STARTED, start_s, uid, pods))
        for queue in ("b", "d"):
            workloads.append(Workload(f"{pool}-{queue}-more", queue, pool, 1, 8, NOW - HOUR))
    workload_repo.submit(conn, workloads)
    assert {o.status for o in ingest_pipeline.ingest(conn, events, NOW)} == {STORED}
    drained = replace(
        CONFIG,
        nodes=tuple(replace(n, ready=n.name != "p-x") for n in CONFIG.nodes),
    )
    _apply(conn, drained, NOW - drained_hours * HOUR)


def _standing(conn: Connection, pool: str) -> tuple[dict[str, float], dict[str, float], float]:
    """U' and fair share (CU) of b and d, and the capacity divided, after a recompute at NOW."""
    result = recompute_pool(conn, pool, NOW).result
    usage = {q: result.standing[q].usage_share for q in ("b", "d")}
    shares = {q: result.fair_share_cu[q] for q in ("b", "d")}
    return usage, shares, result.capacity_cu


@pytest.fixture
def conn(db: Engine) -> Iterator[Connection]:
    with db.connect() as connection:
        yield connection
        connection.rollback()


@pytest.mark.parametrize("drained_hours", [24.0, 72.0])
def test_a_drain_under_work_leaves_usage_shares_and_shares_as_they_were(
    conn: Connection, drained_hours: float
) -> None:
    _set_up(conn, drained_hours)
    usage, shares, capacity = _standing(conn, "q")
    assert usage == pytest.approx({"b": 2 / 3, "d": 1 / 3}, rel=1e-12)
    assert shares == pytest.approx({"b": 4.0, "d": 8.0}, rel=1e-12)
    assert capacity == 32.0
    # The rows of p count its ready nodes: 24 CU since the drain. The division counts x's 8
    # GPUs a's work holds (32 CU), and U' counts them over the window as well: p reads what q
    # reads, to the bit, though it was drained 24 h (b's U' 0.737 before, share 3.53) or 72 h
    # (0.933, 1.33).
    assert capacity_repo.capacity_now(conn)["p"] == (24.0, {"unit": 24.0})
    assert _standing(conn, "p") == (usage, shares, capacity)


def test_the_window_counts_the_drained_work_until_it_ends(conn: Connection) -> None:
    """a's job on x stops 12 h after a 24 h drain began: from then on x counts nothing, and the
    window's capacity over quota is 12 CU for 156 h and 4 CU for the last 12: b's U' is
    8 x 168 / (12 x 156 + 4 x 12) = 1344 / 1920 = 0.7, d's 0.35. a no longer holds 20 CU:
    a's 8 GPUs freed are capacity no more (x is drained), so the pool divides 24 CU."""
    _set_up(conn, 24.0)
    stop = LedgerEvent(str(uuid.uuid4()), EventKind.STOPPED, NOW - 12 * HOUR, "p-a-x")
    assert [o.status for o in ingest_pipeline.ingest(conn, [stop], NOW)] == [STORED]
    usage, _shares, capacity = _standing(conn, "p")
    assert usage == pytest.approx({"b": 0.7, "d": 0.35}, rel=1e-12)
    assert capacity == 24.0
    # The hourly rows and the window's edges give what the raw runs give.
    config = config_repo.load_config(conn)
    pool = config.pool("p")
    exact = rollup_repo.exact_usage(conn, config, pool, NOW)
    rolled = rollup_repo.decayed_usage(conn, config, pool, NOW)
    assert rolled.group_capacity_cu_s[None] == pytest.approx(
        exact.group_capacity_cu_s[None], rel=1e-12
    )
    assert exact.group_capacity_cu_s[None] == pytest.approx((12 * 156 + 4 * 12) * HOUR)


def test_a_late_stop_on_the_drained_node_redoes_the_window(conn: Connection) -> None:
    """The recompute rolls the hours up first; a's stop on x comes after, 12 h late. Its mark
    redoes the hours from the stop: U' is the one of the stop in time (0.7), not 2/3."""
    _set_up(conn, 24.0)
    assert _standing(conn, "p")[0] == pytest.approx({"b": 2 / 3, "d": 1 / 3}, rel=1e-12)
    stop = LedgerEvent(str(uuid.uuid4()), EventKind.STOPPED, NOW - 12 * HOUR, "p-a-x")
    assert [o.status for o in ingest_pipeline.ingest(conn, [stop], NOW)] == [STORED]
    assert _standing(conn, "p")[0] == pytest.approx({"b": 0.7, "d": 0.35}, rel=1e-12)


def test_a_late_report_of_the_drained_node_redoes_the_window(conn: Connection) -> None:
    """x, drained 24 h ago under a's 8 GPUs, reported 12 h ago (late, after the hours were
    rolled up) that only 2 of them are usable: from then on it counts 2, never more than it
    counts for. Over quota: 12 CU for 156 h, 6 for 12 h: b's U' 1344 / 1944 = 0.691. The
    report changes no capacity row (x counts in none while drained); the rollups redo all the
    same."""
    _set_up(conn, 24.0)
    _standing(conn, "p")
    rows = conn.execute(text("SELECT count(*) FROM pool_capacity_changes")).scalar_one()
    report = LedgerEvent(
        str(uuid.uuid4()), EventKind.NODE_CAPACITY, NOW - 12 * HOUR, node="p-x", gpu_count=2
    )
    assert [o.status for o in ingest_pipeline.ingest(conn, [report], NOW)] == [STORED]
    assert conn.execute(text("SELECT count(*) FROM pool_capacity_changes")).scalar_one() == rows
    usage, _shares, capacity = _standing(conn, "p")
    assert usage == pytest.approx({"b": 1344 / 1944, "d": 672 / 1944}, rel=1e-12)
    assert capacity == 26.0
