"""The scheduling cycle as a service: a snapshot from PostgreSQL, the pure cycle, decisions stored.

Scheduling of one pool is serialised across replicas by a transaction-scoped advisory lock on the
pool (`locks.pool_key`): the snapshot is read and the decisions written inside one transaction
that holds it, so two `Schedule` calls can never hand out the same GPU.

A servicer passes its `SnapshotSource` (`services/snapshot_source.py`): the config and the
pool's rows are then kept between cycles and brought up to date from what changed, checked in
this same transaction, so nothing another replica changed is missed. Without one (tools,
benchmarks, the reference in tests) everything is read afresh.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sqlalchemy import Connection

from gpufair.domain.cycle import run_cycle
from gpufair.domain.explain import Explanation, explain
from gpufair.domain.model import ClusterConfig, NodePool
from gpufair.domain.snapshot import CycleResult, CycleSnapshot, UsageStanding
from gpufair.domain.stored_limits import within_limits
from gpufair.gc_tuning import collector_paused
from gpufair.services.recompute import recompute_pool
from gpufair.services.snapshot_source import SnapshotSource
from gpufair.store import config_repo, fairshare_repo, locks, schedule_repo, workload_repo


@dataclass(frozen=True, slots=True)
class Decided:
    snapshot: CycleSnapshot
    result: CycleResult
    # From a recompute made for this cycle: stored values read within the limits, stored
    # history skipped as not finite.
    warnings: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Shares:
    by_leaf: dict[str, float]
    computed_at_s: float
    warnings: tuple[str, ...] = ()
    standing: dict[str, UsageStanding] = field(default_factory=dict)  # W' and U' per queue


CLOCK_SKEW_S = 60.0  # how far ahead of this replica's clock another's run may be dated


def fair_shares(
    conn: Connection,
    config: ClusterConfig,
    pool: NodePool,
    now_s: float,
    source: SnapshotSource | None = None,
) -> Shares:
    """Leaf fair shares from the latest recompute, recomputed first when it is older than the
    pool's interval, predates a change of the pool's workloads (a new submission must not wait
    a whole interval to count as demand), or is dated ahead of this replica's clock by more than
    `CLOCK_SKEW_S`."""
    if source is None:
        run = fairshare_repo.latest_run(conn, pool.name)
    else:
        run = source.latest_run(conn, pool.name)
    changed_at = workload_repo.last_change_s(conn, pool.name)
    stale = (
        run is None
        or now_s - run.computed_at_s >= pool.policy.recompute_interval_s
        # Dated further ahead than replicas' clocks differ: stored by a replica whose clock ran
        # ahead, so its age says nothing (new submissions would wait until that date).
        or run.computed_at_s - now_s > CLOCK_SKEW_S
        or (changed_at is not None and changed_at > run.computed_at_s)
    )
    if stale:
        done = recompute_pool(conn, pool.name, now_s)
        result = done.result
        return Shares(dict(result.fair_share_cu), now_s, done.warnings, dict(result.standing))
    assert run is not None
    return Shares(
        {s.queue: s.fair_share_cu for s in run.shares},
        run.computed_at_s,
        standing={s.queue: UsageStanding(s.weight_share, s.usage_share) for s in run.shares},
    )


def build_snapshot(
    conn: Connection, pool_name: str, now_s: float, source: SnapshotSource | None = None
) -> tuple[CycleSnapshot, float]:
    snapshot, shares = _snapshot(conn, pool_name, now_s, source)
    return snapshot, shares.computed_at_s


def _snapshot(
    conn: Connection, pool_name: str, now_s: float, source: SnapshotSource | None
) -> tuple[CycleSnapshot, Shares]:
    """The cycle's input; the stored config is read within the input limits (a value stored
    before them is clamped, and said so in the warnings of a recompute)."""
    if source is None:
        config = within_limits(config_repo.load_config(conn))[0]
    else:
        config = source.config(conn)
    pool = config.pool(pool_name)
    schedule_repo.release_expired_binds(conn, pool.name, now_s)
    computed = fair_shares(conn, config, pool, now_s, source)
    shares = computed.by_leaf
    leaves = {q.name for q in config.leaf_queues()}
    if source is None:
        holding, waiting = schedule_repo.holding_and_pending(conn, pool.name)
        running, pending = tuple(holding), tuple(waiting)
    else:
        running, pending = source.holding_and_pending(conn, pool.name)
    snapshot = CycleSnapshot(
        pool=pool,
        nodes=tuple(n for n in config.nodes if n.pool == pool.name),
        gpu_types=config.gpu_types,
        queues=tuple(q for q in config.queues if q.name in leaves),
        fair_share_cu={q: shares.get(q, 0.0) for q in leaves},
        running=running,
        pending=pending,
        now_s=now_s,
        evicting=tuple(schedule_repo.evictions_in_flight(conn, pool.name)),
        inner_queues=tuple(q for q in config.queues if q.name not in leaves),
        moved_gpus_last_hour=schedule_repo.moved_gpus_since(conn, pool.name, now_s - 3600.0)
        if pool.max_moved_share_per_hour is not None
        else 0.0,
        standing={q: computed.standing[q] for q in leaves if q in computed.standing},
    )
    return snapshot, computed


def decide(
    conn: Connection, pool_name: str, now_s: float, source: SnapshotSource | None = None
) -> Decided:
    """Lock the pool for this transaction, read the snapshot (brought up to date in `source`,
    if given) and run the cycle. The caller records the decisions (or rolls back for a dry run)
    in the same transaction. The cycle runs with the cyclic collector paused
    (`gc_tuning.collector_paused`: nothing it builds is garbage before it ends), and, given a
    `source`, with the records the pool's last cycle loaded (`source.carried`: the same
    decisions, made loading only the rows that changed)."""
    locks.xact_lock(conn, locks.pool_key(pool_name))
    snapshot, shares = _snapshot(conn, pool_name, now_s, source)
    with collector_paused():
        result = run_cycle(snapshot, None if source is None else source.carried(pool_name))
    return Decided(snapshot, result, shares.warnings)


def standing_claims_served(snapshot: CycleSnapshot) -> list[str]:
    """Victims of evictions in `snapshot` that had stopped before it: their beneficiaries'
    standing claims were served by this cycle, so a recorded cycle forgets them."""
    running = {allocation.workload.uid for allocation in snapshot.running}
    return sorted({e.victim_uid for e in snapshot.evicting if e.victim_uid not in running})


def explain_pending(
    conn: Connection, pool_name: str, uid: str, now_s: float, source: SnapshotSource | None = None
) -> Explanation:
    """Why `uid` waits, from a dry cycle over the current snapshot (the caller rolls back)."""
    decided = decide(conn, pool_name, now_s, source)
    return explain(decided.snapshot, decided.result, uid)
