"""The window-only redo of rollups keeps every fair share's inputs exact, in random sequences.

A change of queues, GPU types or pools redoes only the buckets the pool's usage window reads
(`rollup_repo`, `rollup_watermarks.current_from`). Whatever happens before a recompute, the
decayed usage and group capacities it reads (`rollup_repo.decayed_usage`) must equal the exact
integral of the raw runs under the CURRENT config (`rollup_repo.exact_usage`, which integrates
every run in the window with `domain.usage.usage_inputs`), to 1e-9 relative.

Each seed runs a random sequence of: runs ingested (some late, before the watermark: dirty
marks), quota and weight changes, a queue added under a parent, a queue moved to another parent,
policy changes (sliding windows lengthened and shortened, tumbling anchors and periods, all
history with and without a half-life, half-life and usage-basis changes), nodes drained and
resumed, retention runs, and `now` moving forward or a recompute at an earlier `now` than the
last (clocks disagree). After each step the pool is rolled up at that instant, with the config
version read before the config (as the jobs do), and read back.

Retention deletes what no window read when it ran: a window lengthened afterwards past the
retention horizon cannot be exact (the runs and buckets are gone), so those readings are left
out; that is retention's contract, not the rollups'.
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import replace

import pytest
from sqlalchemy import Connection, Engine, text

from gpufair.domain.ledger import EventKind, EventPod, LedgerEvent
from gpufair.domain.model import (
    ClusterConfig,
    Division,
    FairSharePolicy,
    GpuType,
    Node,
    NodePool,
    Queue,
    QueueQuota,
    UsageBasis,
    WindowKind,
    Workload,
    frozen_map,
)
from gpufair.domain.retention_horizon import window_reads_from
from gpufair.domain.usage import UsageInputs
from gpufair.store import config_repo, ingest_pipeline, rollup_repo, workload_repo
from gpufair.store.retention_repo import Retention, apply_retention
from tests.store.test_rollups import HOUR, NOW, install

DAY = 86400.0
REL = 1e-9
START = NOW - 40 * DAY  # the config is installed, and the first runs start, from here


@pytest.fixture
def conn(db: Engine) -> Iterator[Connection]:
    with db.connect() as connection:
        yield connection
        connection.rollback()


def quota(deserved: float, weight: float = 1.0, a100s: float = 0.0) -> Mapping[str, QueueQuota]:
    by_type = frozen_map({"a100": a100s} if a100s else {})
    return frozen_map(
        {
            "p": QueueQuota(
                "p", deserved_cu=deserved, deserved_gpus_by_type=by_type, over_quota_weight=weight
            )
        }
    )


def first_config() -> ClusterConfig:
    return ClusterConfig(
        gpu_types=(GpuType("a100", 80, 10), GpuType("t4", 16, 1)),
        pools=(NodePool("p", policy=FairSharePolicy(window_s=7 * DAY)),),
        nodes=tuple(Node(f"a{i}", "p", "a100", 8, 64000, 512000) for i in range(4))
        + tuple(Node(f"t{i}", "p", "t4", 4, 32000, 128000) for i in range(2)),
        queues=(
            Queue("dept", None, quota(60, 2)),
            Queue("a", "dept", quota(20)),
            Queue("b", "dept", quota(15, 3)),
            Queue("c", None, quota(30)),
        ),
    )


def random_policy(rng: random.Random, now_s: float) -> FairSharePolicy:
    kind = rng.choice(["sliding", "sliding", "tumbling", "none-decay", "none"])
    half_life = rng.choice([None, 6 * HOUR, 2 * DAY])
    basis = rng.choice(list(UsageBasis))
    if kind == "sliding":
        return FairSharePolicy(
            window_s=rng.choice([1, 3, 7, 20, 35]) * DAY, half_life_s=half_life, usage_basis=basis
        )
    if kind == "tumbling":
        period = rng.choice([1 * DAY, 7 * DAY, 30 * DAY, 5 * HOUR])
        return FairSharePolicy(
            window_kind=WindowKind.TUMBLING,
            window_s=period,
            window_anchor_unix_s=now_s - rng.uniform(0, 50) * DAY,
            half_life_s=half_life,
            usage_basis=basis,
            division=rng.choice(list(Division)),
        )
    if kind == "none-decay":
        return FairSharePolicy(
            window_kind=WindowKind.NONE,
            half_life_s=rng.choice([2, 8, 24]) * HOUR,
            usage_basis=basis,
        )
    return FairSharePolicy(window_kind=WindowKind.NONE, usage_basis=basis)


class Story:
    """One seed's state: the config in force, the host clock, runs ingested so far."""

    def __init__(self, conn: Connection, rng: random.Random) -> None:
        self.conn, self.rng = conn, rng
        self.config = first_config()
        self.clock = START
        self.runs = 0
        self.added = 0
        self.log: list[str] = []
        install(conn, self.config, START)

    def apply(self, config: ClusterConfig, what: str) -> None:
        install(self.conn, config, self.clock)
        self.config = config
        self.log.append(what)

    def leaves(self) -> list[str]:
        return sorted(q.name for q in self.config.leaf_queues())

    def ingest(self, lo_s: float, hi_s: float, count: int, what: str) -> None:
        workloads, events = [], []
        for _ in range(count):
            uid, start = f"w{self.runs}", self.rng.uniform(lo_s, hi_s)
            self.runs += 1
            node = self.rng.choice(["a0", "a1", "a2", "a3", "t0", "t1"])
            gpus = self.rng.randint(1, 4 if node.startswith("t") else 8)
            queue = self.rng.choice(self.leaves())
            workloads.append(Workload(uid, queue, "p", 1, gpus, start - 60))
            ids = [str(uuid.UUID(int=self.rng.getrandbits(128))) for _ in "xx"]
            pods = (EventPod(node, tuple(range(gpus))),)
            events.append(LedgerEvent(ids[0], EventKind.STARTED, start, uid, pods))
            if self.rng.random() < 0.85:
                end = min(self.clock - 1, start + self.rng.expovariate(1 / (10 * HOUR)))
                if end > start:
                    events.append(LedgerEvent(ids[1], EventKind.STOPPED, end, uid))
        workload_repo.submit(self.conn, workloads)
        outcomes = ingest_pipeline.ingest(self.conn, events, self.clock)
        assert {o.status for o in outcomes} == {ingest_pipeline.EventStatus.STORED}
        self.log.append(what)

    def step(self) -> None:
        rng, config = self.rng, self.config
        op = rng.choice(
            [
                "advance", "advance", "runs", "late", "quota", "weight", "add", "move",
                "policy", "window", "drain", "retention", "racing", "gpu-type",
            ]
        )  # fmt: skip
        if op == "advance":
            self.clock += rng.uniform(0.3, 3) * DAY
            self.log.append(f"advance to NOW{(self.clock - NOW) / DAY:+.2f} d")
            self.ingest(self.clock - DAY, self.clock - 60, rng.randint(2, 10), "runs of the day")
        elif op == "runs":
            self.ingest(self.clock - DAY, self.clock - 60, rng.randint(1, 8), "runs")
        elif op == "late":
            back = rng.uniform(1, 30) * DAY
            self.ingest(self.clock - back, self.clock - back + DAY, rng.randint(1, 4), "late runs")
        elif op in ("quota", "weight"):
            name = rng.choice([q.name for q in config.queues])
            queues = tuple(
                replace(
                    q,
                    quotas=quota(
                        rng.choice([0, 5, 10, 20, 40, 70])
                        if op == "quota"
                        else q.quota("p").deserved_cu,
                        rng.choice([0.5, 1, 2, 4])
                        if op == "weight"
                        else q.quota("p").over_quota_weight,
                        rng.choice([0, 0, 2, 4])
                        if op == "quota"
                        else q.quota("p").deserved_gpus_by_type.get("a100", 0.0),
                    ),
                )
                if q.name == name
                else q
                for q in config.queues
            )
            self.apply(replace(config, queues=queues), f"{op} of {name}")
        elif op == "add":
            parent = rng.choice([q.name for q in config.queues])
            name = f"x{self.added}"
            self.added += 1
            queue = Queue(name, parent, quota(rng.choice([0, 5, 10])))
            self.apply(replace(config, queues=(*config.queues, queue)), f"{name} under {parent}")
        elif op == "move":
            movable = [q for q in config.queues if q.name in self.leaves()]
            queue = rng.choice(movable)
            parents = [None] + [
                q.name
                for q in config.queues
                if q.name not in self.leaves() and q.name != queue.parent
            ]
            parent = rng.choice(parents)
            queues = tuple(replace(q, parent=parent) if q is queue else q for q in config.queues)
            self.apply(replace(config, queues=queues), f"{queue.name} moved under {parent}")
        elif op in ("policy", "window"):
            pool = config.pools[0]
            if op == "policy":
                policy = random_policy(rng, self.clock)
            else:  # the same policy with only the window's length (or period) changed
                policy = replace(pool.policy, window_s=rng.choice([1, 3, 7, 20, 35]) * DAY)
            self.apply(replace(config, pools=(replace(pool, policy=policy),)), f"policy {policy}")
        elif op == "gpu-type":  # a GPU type's weight: per-type quotas and the capacity follow
            name = rng.choice(["a100", "t4"])
            weight = rng.choice([8, 10, 12]) if name == "a100" else rng.choice([1, 2, 3])
            types = tuple(
                replace(t, compute_weight=weight) if t.name == name else t for t in config.gpu_types
            )
            self.apply(replace(config, gpu_types=types), f"{name} weighs {weight} CU")
        elif op == "drain":
            node = rng.choice(config.nodes)
            nodes = tuple(replace(n, ready=not n.ready) if n is node else n for n in config.nodes)
            self.apply(replace(config, nodes=nodes), f"{node.name} ready={not node.ready}")
        elif op == "racing":
            # A rollup that read the version and the config just before an apply committed:
            # it writes with the old config, stamped with the old version.
            version, old = config_repo.config_version(self.conn), config
            pool = config.pools[0]
            quotas = quota(rng.choice([0, 10, 40]), rng.choice([1, 3]))
            queues = tuple(replace(q, quotas=quotas) if q.name == "c" else q for q in config.queues)
            self.apply(replace(config, queues=queues), "c changed while a rollup ran")
            rollup_repo.rollup_pool(self.conn, old, pool, self.clock, version)
        elif op == "retention":
            apply_retention(self.conn, self.clock, Retention(rollups_days=rng.choice([3, 10, 25])))
            self.log.append("retention")

    def check(self, now_s: float, where: str) -> None:
        """Roll up at `now_s` as the jobs do, and hold what a recompute reads to the exact
        integral under the current config."""
        conn, config = self.conn, self.config
        pool = config.pools[0]
        version = config_repo.config_version(conn)
        rollup_repo.rollup_pool(conn, config, pool, now_s, version)
        kept_from = conn.execute(
            text(
                "SELECT extract(epoch FROM max(kept_from))::float8 FROM retention_horizons "
                "WHERE kind = 'rollups' AND pool IN ('p', '')"
            )
        ).scalar()
        if kept_from is not None and window_reads_from(pool.policy, now_s)[0] < kept_from:
            return  # retention deleted what this window reads (module docstring)
        got = rollup_repo.decayed_usage(conn, config, pool, now_s)
        want = rollup_repo.exact_usage(conn, config, pool, now_s)
        assert_same(got, want, f"{where}; after: {' / '.join(self.log[-6:])}")


def assert_same(got: UsageInputs, want: UsageInputs, what: str) -> None:
    for key in sorted(set(got.usage_cu_s) | set(want.usage_cu_s)):
        g, w = got.usage_cu_s.get(key, 0.0), want.usage_cu_s.get(key, 0.0)
        assert g == pytest.approx(w, rel=REL, abs=1e-6), f"{what}: usage of {key!r}"
    for group in sorted(set(got.group_capacity_cu_s) | set(want.group_capacity_cu_s), key=str):
        g, w = got.group_capacity_cu_s.get(group, 0.0), want.group_capacity_cu_s.get(group, 0.0)
        assert g == pytest.approx(w, rel=REL, abs=1e-6), f"{what}: capacity of {group!r}"


@pytest.mark.parametrize("seed", range(8))
def test_decayed_usage_is_exact_under_the_current_config(conn: Connection, seed: int) -> None:
    rng = random.Random(seed)
    seq = Story(conn, rng)
    seq.clock = NOW - 10 * DAY
    seq.ingest(START, seq.clock - 60, 60, "history")
    seq.check(seq.clock, f"seed {seed}, first rollup")
    for n in range(30):
        seq.step()
        if rng.random() < 0.3:  # a recompute whose clock is behind the last one's
            earlier = seq.clock - rng.uniform(0.05, 6) * DAY
            seq.check(earlier, f"seed {seed} step {n}, at NOW{(earlier - NOW) / DAY:+.2f} d")
        seq.check(seq.clock, f"seed {seed} step {n}, at NOW{(seq.clock - NOW) / DAY:+.2f} d")
    # What budgets read of the buckets (`cu_seconds`) and the GPU-hours never depend on the
    # config: every kept bucket holds what a redo of the whole history writes.
    rows = "SELECT queue, gpu_type, bucket_start, gpu_seconds, cu_seconds FROM usage_hourly"
    kept = {tuple(r[:3]): r[3:] for r in conn.execute(text(rows))}
    conn.execute(text("DELETE FROM rollup_watermarks"))
    rollup_repo.rollup_pool(conn, seq.config, seq.config.pools[0], seq.clock)
    redone = {tuple(r[:3]): r[3:] for r in conn.execute(text(rows))}
    assert set(redone) == set(kept)
    for key, (gpu_s, cu_s) in kept.items():
        assert gpu_s == pytest.approx(redone[key][0], rel=REL, abs=1e-6), key
        assert cu_s == pytest.approx(redone[key][1], rel=REL, abs=1e-6), key
