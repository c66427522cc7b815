"""Retention changes no fair share and no budget's consumption, in random histories, on PostgreSQL.

Each seed draws three pools with policies of every kind (sliding windows with and without a
half-life, tumbling windows with an anchor and a period, some longer than the rollup retention,
all history with and without a half-life), budgets of a day, a week or a month on a leaf or a
parent queue, in one pool or all, nodes drained and resumed, and two months of runs (some still
open). At three instants, each after the rollups caught up: every configured pool's decayed
usage (the fair share's inputs) and every budget's status, before and after `apply_retention`
with a short rollup retention, agree to 1e-9 relative; so does the exact integral from the raw
runs kept. Then a config change that redoes every pool's rollups its window reads, and a redo of
every pool's rollups whole, write back exactly the rows that were kept: no bucket retention deleted, no gap, nothing of another pool.
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import replace
from datetime import UTC, datetime

import pytest
from sqlalchemy import Connection, Engine, text

from gpufair.domain.ledger import EventKind, EventPod, LedgerEvent
from gpufair.domain.model import (
    Budget,
    BudgetPeriod,
    ClusterConfig,
    Division,
    FairSharePolicy,
    GpuType,
    Node,
    NodePool,
    Queue,
    QueueQuota,
    WindowKind,
    Workload,
    frozen_map,
)
from gpufair.domain.usage import UsageInputs
from gpufair.store import ingest_pipeline, report_repo, rollup_repo, workload_repo
from gpufair.store.retention_repo import Retention, apply_retention
from tests.store.test_rollups import HOUR, NOW, install, snapshot

DAY = 86400.0
SPAN = 60 * DAY  # of history before NOW
REL = 1e-9


@pytest.fixture
def conn(db: Engine) -> Iterator[Connection]:
    with db.connect() as connection:
        yield connection
        connection.rollback()


def random_policy(rng: random.Random) -> FairSharePolicy:
    kind = rng.choice(["sliding", "tumbling", "none-decay", "none"])
    half_life = rng.choice([None, 6 * HOUR, 2 * DAY])
    if kind == "sliding":
        return FairSharePolicy(window_s=rng.choice([1, 3, 7, 20]) * DAY, half_life_s=half_life)
    if kind == "tumbling":
        period = rng.choice([1 * DAY, 7 * DAY, 30 * DAY, 45 * DAY, 5 * HOUR])
        return FairSharePolicy(
            window_kind=WindowKind.TUMBLING,
            window_s=period,
            window_anchor_unix_s=NOW - rng.uniform(0, 100) * DAY + rng.uniform(0, period),
            half_life_s=half_life,
            division=rng.choice([Division.GPUFAIR, Division.KAI]),
        )
    if kind == "none-decay":
        return FairSharePolicy(window_kind=WindowKind.NONE, half_life_s=rng.choice([4, 8]) * HOUR)
    return FairSharePolicy(window_kind=WindowKind.NONE)


def random_config(rng: random.Random) -> ClusterConfig:
    pools = [f"p{i}" for i in range(3)]

    def quotas(deserved: float) -> Mapping[str, QueueQuota]:
        return frozen_map({p: QueueQuota(p, deserved_cu=deserved) for p in pools})

    budgets = []
    for queue, period in {
        (rng.choice(["a", "b", "c", "dept"]), rng.choice(list(BudgetPeriod))) for _ in range(4)
    }:
        budgets.append(Budget(queue, period, 1000.0, rng.choice([None, *pools])))
    return ClusterConfig(
        gpu_types=(GpuType("a100", 80, 10),),
        pools=tuple(NodePool(p, policy=random_policy(rng)) for p in pools),
        nodes=tuple(Node(f"{p}-n{i}", p, "a100", 8, 64000, 512000) for p in pools for i in (0, 1)),
        queues=(
            Queue("dept", None, quotas(30)),
            Queue("a", "dept", quotas(10)),
            Queue("b", "dept", quotas(10)),
            Queue("c", None, quotas(20)),
        ),
        budgets=tuple(sorted(budgets, key=lambda b: (b.queue, b.period, b.pool or ""))),
    )


def random_history(conn: Connection, rng: random.Random, config: ClusterConfig) -> None:
    """The config installed at NOW - SPAN - 1 d; node n1 of each pool drained and resumed at
    random instants; 40 runs a pool on n0 over the span, one in ten still open at NOW."""
    install(conn, config, NOW - SPAN - DAY)
    changes = sorted(
        (rng.uniform(NOW - SPAN, NOW - HOUR), p.name) for p in config.pools for _ in "xx"
    )
    ready = {n.name: True for n in config.nodes}
    for at, name in changes:
        ready[f"{name}-n1"] = not ready[f"{name}-n1"]
        nodes = tuple(replace(n, ready=ready[n.name]) for n in config.nodes)
        install(conn, replace(config, nodes=nodes), at)
    workloads, events = [], []
    for pool in config.pools:
        for i in range(40):
            uid, start = f"{pool.name}-{i}", NOW - rng.uniform(0, SPAN)
            gpus = rng.randint(1, 8)
            workloads.append(Workload(uid, rng.choice("abc"), pool.name, 1, gpus, start - 60))
            pods = (EventPod(f"{pool.name}-n0", tuple(range(gpus))),)
            ids = [str(uuid.UUID(int=rng.getrandbits(128))) for _ in "xx"]
            events.append(LedgerEvent(ids[0], EventKind.STARTED, start, uid, pods))
            if rng.random() < 0.9:
                end = min(NOW - 1, start + rng.expovariate(1 / (20 * HOUR)))
                events.append(LedgerEvent(ids[1], EventKind.STOPPED, end, uid))
    workload_repo.submit(conn, workloads)
    outcomes = ingest_pipeline.ingest(conn, events, NOW)
    assert {o.status for o in outcomes} == {ingest_pipeline.EventStatus.STORED}


def assert_same(got: UsageInputs, want: UsageInputs, what: str) -> None:
    for key in set(got.usage_cu_s) | set(want.usage_cu_s):
        g, w = got.usage_cu_s.get(key, 0.0), want.usage_cu_s.get(key, 0.0)
        assert g == pytest.approx(w, rel=REL, abs=1e-6), f"{what}: usage of {key!r}"
    for group in set(got.group_capacity_cu_s) | set(want.group_capacity_cu_s):
        g, w = got.group_capacity_cu_s.get(group, 0.0), want.group_capacity_cu_s.get(group, 0.0)
        assert g == pytest.approx(w, rel=REL, abs=1e-6), f"{what}: capacity of {group!r}"


def readings(
    conn: Connection, config: ClusterConfig, now_s: float
) -> tuple[dict[str, UsageInputs], list[tuple[str, str, report_repo.Period, float]]]:
    usage = {p.name: rollup_repo.decayed_usage(conn, config, p, now_s) for p in config.pools}
    budgets = [
        (b.queue, b.pool, b.period, b.consumed_cu_hours)
        for b in report_repo.budgets(conn, datetime.fromtimestamp(now_s, UTC))
    ]
    return usage, budgets


@pytest.mark.parametrize("seed", range(8))
def test_retention_changes_no_fair_share_input_and_no_budget(conn: Connection, seed: int) -> None:
    rng = random.Random(seed)
    config = random_config(rng)
    random_history(conn, rng, config)
    keep = Retention(rollups_days=rng.choice([1.0, 2.0, 5.0]))
    nows = [NOW, NOW + rng.uniform(1, 5) * DAY, NOW + rng.uniform(10, 40) * DAY]
    for now_s in nows:
        for pool in config.pools:
            rollup_repo.rollup_pool(conn, config, pool, now_s)
        usage, budgets = readings(conn, config, now_s)
        deleted = apply_retention(conn, now_s, keep)
        usage_after, budgets_after = readings(conn, config, now_s)
        assert now_s > NOW or deleted["usage_hourly"] > 0  # something goes at the first
        where = f"seed {seed} at NOW + {(now_s - NOW) / DAY:.2f} d"
        for pool in config.pools:
            assert_same(usage_after[pool.name], usage[pool.name], f"{where}, pool {pool.name}")
            exact = rollup_repo.exact_usage(conn, config, pool, now_s)
            assert_same(exact, usage[pool.name], f"{where}, pool {pool.name}, exact")
        assert [b[:3] for b in budgets_after] == [b[:3] for b in budgets]
        for b, a in zip(budgets, budgets_after, strict=True):
            assert a[3] == pytest.approx(b[3], rel=REL, abs=1e-9), f"{where}: budget {b[:3]}"
    # A change of k in one pool redoes every pool's rollups from where its window reads; then,
    # without a watermark, each pool's rollups whole, each from its own horizon.
    now_s = nows[-1]
    kept = snapshot(conn)
    usage, budgets = readings(conn, config, now_s)
    first = config.pools[0]
    changed = replace(
        config, pools=(replace(first, policy=replace(first.policy, k=2.0)), *config.pools[1:])
    )
    install(conn, changed, now_s)
    for pool in changed.pools:
        rollup_repo.rollup_pool(conn, changed, pool, now_s)
    assert snapshot(conn) == kept
    conn.execute(text("DELETE FROM rollup_watermarks"))
    for pool in changed.pools:
        rollup_repo.rollup_pool(conn, changed, pool, now_s)
    assert snapshot(conn) == kept
    usage_after, budgets_after = readings(conn, changed, now_s)
    for pool in config.pools:
        assert_same(usage_after[pool.name], usage[pool.name], f"seed {seed} redone {pool.name}")
    assert budgets_after == budgets


def _first_buckets_before_horizons(conn: Connection) -> list[tuple[str, float, float]]:
    """(pool, first bucket, horizon) of every pool with a bucket before its recorded horizon."""
    rows = conn.execute(
        text(
            """
            SELECT b.pool, extract(epoch FROM min(b.bucket_start))::float8,
                   extract(epoch FROM max(h.kept_from))::float8
            FROM (SELECT pool, bucket_start FROM fairness_hourly
                  UNION ALL SELECT pool, bucket_start FROM usage_hourly) AS b
            JOIN retention_horizons h ON h.kind = 'rollups' AND h.pool IN (b.pool, '')
            GROUP BY b.pool
            HAVING min(b.bucket_start) < max(h.kept_from)
            """
        )
    )
    return [(str(p), float(first), float(kept)) for p, first, kept in rows]


@pytest.mark.parametrize("seed", range(8))
def test_a_rollup_left_behind_by_retention_reads_and_writes_as_if_on_time(
    conn: Connection, seed: int
) -> None:
    """One pool's rollups stop at NOW while the others go on and retention runs twice, 5 to
    9 and 10 to 40 days later, each time past that pool's watermark with a rollup retention of 1
    to 5 days; each time the pool's rollups then catch up. Every pool's decayed usage and every
    budget's consumption are what they were with every rollup on time before retention, to 1e-9
    relative, and so is the exact integral from the runs kept; no pool has a bucket before its
    horizon (the pool left behind had, made of what outlived retention, until the next one)."""
    rng = random.Random(1000 + seed)
    config = random_config(rng)
    random_history(conn, rng, config)
    keep = Retention(rollups_days=rng.choice([1.0, 2.0, 5.0]))
    behind = rng.choice(config.pools)
    for pool in config.pools:
        rollup_repo.rollup_pool(conn, config, pool, NOW)
    for now_s in [NOW + rng.uniform(5, 9) * DAY, NOW + rng.uniform(10, 40) * DAY]:
        for pool in config.pools:
            if pool is not behind:
                rollup_repo.rollup_pool(conn, config, pool, now_s)
        # What the readers give with every rollup on time, before retention.
        on_time = conn.begin_nested()
        rollup_repo.rollup_pool(conn, config, behind, now_s)
        usage, budgets = readings(conn, config, now_s)
        on_time.rollback()
        apply_retention(conn, now_s, keep)
        rollup_repo.rollup_pool(conn, config, behind, now_s)
        usage_after, budgets_after = readings(conn, config, now_s)
        where = f"seed {seed} at NOW + {(now_s - NOW) / DAY:.2f} d, {behind.name} behind"
        for pool in config.pools:
            assert_same(usage_after[pool.name], usage[pool.name], f"{where}, pool {pool.name}")
            exact = rollup_repo.exact_usage(conn, config, pool, now_s)
            assert_same(exact, usage[pool.name], f"{where}, pool {pool.name}, exact")
        assert [b[:3] for b in budgets_after] == [b[:3] for b in budgets]
        for b, a in zip(budgets, budgets_after, strict=True):
            assert a[3] == pytest.approx(b[3], rel=REL, abs=1e-9), f"{where}: budget {b[:3]}"
        assert _first_buckets_before_horizons(conn) == [], where
