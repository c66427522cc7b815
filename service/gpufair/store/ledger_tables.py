"""Tables of the usage ledger: workloads, events, allocation intervals, rollups, fair-share
history, capacity history and periodic-job claims (DESIGN §5).

Queue and pool names in the ledger are plain text, not foreign keys: history outlives the config
objects it was recorded under, and reports of a deleted queue still add up.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    Column,
    DateTime,
    Double,
    Index,
    Integer,
    LargeBinary,
    Table,
    Text,
    func,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB, UUID

from gpufair.store.tables import metadata

_now = func.now()

# Runs shorter than this are left out of the GiST index on the run's time range (below): the
# predicate of that partial index, which the queries that use it repeat word for word.
SHORT_RUN = "interval '1 hour'"
LONG_OR_OPEN = f"ended_at IS NULL OR ended_at - started_at >= {SHORT_RUN}"

TZ = DateTime(timezone=True)

# A run whose GPUs or CU are not finite (stored before the input limits; `data_checks`): the
# predicate of the partial index that finds them, which the check repeats word for word.
NOT_FINITE_RUN = "NOT (gpus < 'Infinity'::float8 AND cu < 'Infinity'::float8)"

# Workloads as the batch system submitted them. `spec` holds the full request (for idempotent
# resubmission and for the scheduling cycle); the columns are what queries filter on.
workloads = Table(
    "workloads",
    metadata,
    Column("uid", Text, primary_key=True),
    Column("queue", Text, nullable=False),
    Column("pool", Text, nullable=False),
    Column("state", Text, nullable=False),
    Column("spec", JSONB, nullable=False),
    Column("spec_digest", Text, nullable=False),
    Column("submit_time", TZ, nullable=False),
    Column("state_changed_at", TZ, nullable=False, server_default=_now),
    # Set by a Schedule decision; released if no `started` event confirms it in time.
    Column("binding", JSONB, nullable=True),
    Column("bound_at", TZ, nullable=True),
    Column("bind_expires_at", TZ, nullable=True),
    Column("created_at", TZ, nullable=False, server_default=_now),
    # Set when retention removed the workload's events: its runs can no longer be derived again,
    # so a late run event for it is refused rather than rebuilding them from itself alone.
    Column("events_purged_at", TZ, nullable=True),
    # Set when CancelWorkload cancelled it (pending or bound): if the batch system started it all
    # the same, it is `cancelled` again once that run ends (`domain.ledger.state_after`).
    Column("cancelled_at", TZ, nullable=True),
    CheckConstraint(
        "state IN ('pending', 'bound', 'running', 'finished', 'cancelled')", name="state_known"
    ),
    Index("ix_workloads_pool_state", "pool", "state"),
    Index("ix_workloads_queue_state", "queue", "state"),
)

# Every event as received: the ledger's source of truth. A replay of an event_id is recognised by
# the digest of its payload.
ledger_events = Table(
    "ledger_events",
    metadata,
    Column("event_id", UUID(as_uuid=False), primary_key=True),
    Column("workload_uid", Text, nullable=True),
    Column("kind", Text, nullable=False),
    Column("occurred_at", TZ, nullable=False),
    Column("payload", JSONB, nullable=False),
    Column("payload_digest", Text, nullable=False),
    Column("received_at", TZ, nullable=False, server_default=_now),
    CheckConstraint(
        "kind IN ('started', 'stopped', 'heartbeat', 'preempted', 'failed', 'node_capacity', "
        "'stale')",
        name="kind_known",
    ),
    Index("ix_ledger_events_workload", "workload_uid", "occurred_at"),
    # Deriving a workload's runs reads its start and stop events only; without this a week-long
    # job's lookup would also read its thousands of heartbeats.
    Index(
        "ix_ledger_events_workload_runs",
        "workload_uid",
        postgresql_where=text("kind <> 'heartbeat'"),
    ),
)

# What ran: one row per workload run and GPU type, derived from the workload's events and rebuilt
# whenever one of them arrives (so out-of-order arrival converges to the same rows).
allocation_intervals = Table(
    "allocation_intervals",
    metadata,
    Column("id", BigInteger, primary_key=True, autoincrement=True),
    Column("workload_uid", Text, nullable=False),
    Column("start_event_id", UUID(as_uuid=False), nullable=False),
    Column("queue", Text, nullable=False),
    Column("pool", Text, nullable=False),
    Column("gpu_type", Text, nullable=False),
    Column("gpus", Double, nullable=False),
    Column("cu", Double, nullable=False),
    Column("started_at", TZ, nullable=False),
    Column("ended_at", TZ, nullable=True),  # NULL while running
    Column("end_kind", Text, nullable=True),  # stopped, preempted, failed, stale
    Column("pods", JSONB, nullable=False),  # [{"node", "gpu_indices", "gpu_fraction"}]
    CheckConstraint("gpus >= 0 AND cu >= 0", name="amounts_non_negative"),
    CheckConstraint("ended_at IS NULL OR ended_at >= started_at", name="ends_after_start"),
    Index("ix_allocation_intervals_workload", "workload_uid"),
    Index("ix_allocation_intervals_pool_span", "pool", "started_at", "ended_at"),
    Index(
        "ix_allocation_intervals_open",
        "pool",
        postgresql_where=text("ended_at IS NULL"),
    ),
    # The sweeper looks for recent stale closes that a later heartbeat voids
    # (`runs_repo.revived_runs`): few rows, kept apart so the look stays an index range scan.
    Index(
        "ix_allocation_intervals_stale_end",
        "ended_at",
        postgresql_where=text("end_kind = 'stale'"),
    ),
    # Every recompute asks whether the pool's window holds runs that are not finite
    # (`data_checks.nonfinite_history`); without this (normally empty) index that is a scan of
    # all the pool's history, which grew with the ledger. A finite run is not in it, so it costs
    # the writes of runs nothing but its predicate.
    Index(
        "ix_allocation_intervals_not_finite",
        "pool",
        postgresql_where=text(NOT_FINITE_RUN),
    ),
    # Window queries ("what ran in [lo, hi)") must not scan all earlier history. A GiST index on
    # the run's time range answers `&&` in O(log n + matches), but it is the dearest write of an
    # interval (about as much as the row and its other indexes together), and most runs are
    # short. So it holds only the runs that are open or lasted at least SHORT_RUN; a short run
    # that overlaps [lo, hi) started after lo - SHORT_RUN, which the B-tree on (pool,
    # started_at) finds (`rollup_repo.intervals_between` reads both).
    Index(
        "ix_allocation_intervals_long_span",
        text("tstzrange(started_at, ended_at, '[)')"),
        postgresql_using="gist",
        postgresql_where=text(LONG_OR_OPEN),
    ),
)

# A pool's usable capacity over time: one row per change (config apply or node capacity event).
pool_capacity_changes = Table(
    "pool_capacity_changes",
    metadata,
    Column("pool", Text, primary_key=True),
    Column("changed_at", TZ, primary_key=True),
    Column("capacity_cu", Double, nullable=False),
    Column("capacity_gpus_by_type", JSONB, nullable=False),
    Column("source", Text, nullable=False),  # "config" or "node_capacity"
)

# Usable GPUs of a node as the batch system last reported them (a failed card, a drained node).
node_capacity = Table(
    "node_capacity",
    metadata,
    Column("node", Text, primary_key=True),
    Column("gpu_count", Integer, nullable=False),
    Column("changed_at", TZ, nullable=False),
    CheckConstraint("gpu_count >= 0", name="gpu_count_non_negative"),
)

# Every usable-GPU report of a node over time (node_capacity events), whatever order they came
# in: a report older than the pool's latest capacity row is replayed among those after it
# (`capacity_repo.rebuild_from`). `node_capacity` above keeps only the latest one. Two reports
# of one node at one instant keep the fewer GPUs, whichever came first.
node_capacity_reports = Table(
    "node_capacity_reports",
    metadata,
    Column("node", Text, primary_key=True),
    Column("reported_at", TZ, primary_key=True),
    Column("gpu_count", Integer, nullable=False),
    CheckConstraint("gpu_count >= 0", name="gpu_count_non_negative"),
)

# What a node counts for in its pool's capacity, from each config change of it on: its pool
# (NULL while it is not ready or not configured: it counts nowhere), GPU type, declared GPUs and
# CU per GPU; on a node's removal, no pool and -1 declared GPUs (`node_history_repo.REMOVED`:
# not configured from then on, so its reports there are refused in time and late alike). Written
# by config applies only (`node_history_repo.record_config`); a node with no row counts as it is
# configured now. Reports and this together give any pool's capacity at any
# instant, so a late report is counted with the config of its time.
node_config_history = Table(
    "node_config_history",
    metadata,
    Column("node", Text, primary_key=True),
    Column("changed_at", TZ, primary_key=True),
    Column("pool", Text, nullable=True),
    Column("gpu_type", Text, nullable=False),
    Column("gpu_count", Integer, nullable=False),
    Column("cu_per_gpu", Double, nullable=False),
    Index("ix_node_config_history_changed_at", "changed_at"),
)

# The instant from which `node_config_history` is complete, on a database that held nodes before
# it was kept (migration 0027): a capacity rebuild starts no earlier. No row: complete since ever.
node_history_start = Table(
    "node_history_start",
    metadata,
    Column("since", TZ, primary_key=True),
)

# Hourly usage per pool x leaf queue x GPU type, for reports and budgets.
usage_hourly = Table(
    "usage_hourly",
    metadata,
    Column("pool", Text, primary_key=True),
    Column("queue", Text, primary_key=True),
    Column("gpu_type", Text, primary_key=True),
    Column("bucket_start", TZ, primary_key=True),
    Column("gpu_seconds", Double, nullable=False),
    Column("cu_seconds", Double, nullable=False),
    Column("over_quota_cu_seconds", Double, nullable=False),
    Index("ix_usage_hourly_bucket", "bucket_start"),
)

# Hourly inputs of the fair-share engine per pool x queue (every level of the tree; queue '' is
# the pool's root). `*_moment` = ∫ x(t) · 2^((t - bucket_start) / half_life_s) dt over the hour,
# so the decayed integral at any later instant is a sum of moments times one power of two each:
# exact, and O(buckets) instead of O(events). Without a half-life the moment is the plain integral.
fairness_hourly = Table(
    "fairness_hourly",
    metadata,
    Column("pool", Text, primary_key=True),
    Column("queue", Text, primary_key=True),
    Column("bucket_start", TZ, primary_key=True),
    Column("half_life_s", Double, nullable=True),  # the decay the moments were taken with
    Column("usage_basis", Text, nullable=False),
    Column("usage_moment", Double, nullable=False),  # the queue's usage under the basis
    Column("group_capacity_moment", Double, nullable=False),  # what its children competed for
    Index("ix_fairness_hourly_pool_bucket", "pool", "bucket_start"),
)

# The last completed hour per pool: rollups exist for every hour before it (unless a dirty mark
# below says otherwise). Written by rollups only. The buckets from `current_from` on were made
# with the config `config_version` (NULL: all of them); older ones with the config of their own
# rollup, redone when the pool's usage window reads them (`rollup_repo` says why).
rollup_watermarks = Table(
    "rollup_watermarks",
    metadata,
    Column("pool", Text, primary_key=True),
    Column("rolled_up_to", TZ, nullable=False),
    Column("half_life_s", Double, nullable=True),
    Column("usage_basis", Text, nullable=False),
    Column("config_version", BigInteger, nullable=False),
    Column("current_from", TZ, nullable=True),
)

# Where ingestion changed a pool's usage: one row per pool per ingest transaction, only ever
# inserted by ingestion (no row lock, so an ingest never waits for a rollup) and deleted by the
# rollup that has counted it (`rollup_repo.rollup_pool` says why none is lost).
rollup_dirty_marks = Table(
    "rollup_dirty_marks",
    metadata,
    Column("pool", Text, primary_key=True),
    Column("id", BigInteger, primary_key=True, autoincrement=True),
    Column("dirty_from", TZ, nullable=False),  # the earliest instant whose usage changed
)

# From when retention keeps each kind of history per pool ('rollups': usage_hourly,
# fairness_hourly, ended runs and capacity rows), the latest it deleted up to: a full rollup redo
# of the pool starts no earlier (`store/retention_horizons.py`, `rollup_repo.rollup_pool`). Pool
# '': recorded when one horizon held for every pool; it bounds every pool's redo.
retention_horizons = Table(
    "retention_horizons",
    metadata,
    Column("kind", Text, primary_key=True),
    Column("pool", Text, primary_key=True, server_default=text("''")),
    Column("kept_from", TZ, nullable=False),
)

# One row per recompute of a pool; the per-queue records hang off it.
fair_share_runs = Table(
    "fair_share_runs",
    metadata,
    Column("id", BigInteger, primary_key=True, autoincrement=True),
    Column("pool", Text, nullable=False),
    Column("computed_at", TZ, nullable=False),
    Column("capacity_cu", Double, nullable=False),
    Column("config_version", BigInteger, nullable=False),
    Index("ix_fair_share_runs_pool_time", "pool", "computed_at"),
    Index("ix_fair_share_runs_pool_id", "pool", "id"),  # the latest run is the last stored
)

fair_share_history = Table(
    "fair_share_history",
    metadata,
    Column("run_id", BigInteger, primary_key=True),
    Column("queue", Text, primary_key=True),
    Column("pool", Text, nullable=False),
    Column("computed_at", TZ, nullable=False),
    Column("parent", Text, nullable=True),
    Column("priority", Integer, nullable=False),
    Column("deserved_cu", Double, nullable=False),
    Column("demand_cu", Double, nullable=False),
    Column("limit_cu", Double, nullable=True),
    Column("allocated_cu", Double, nullable=False),
    Column("weight_share", Double, nullable=False),
    Column("usage_share", Double, nullable=False),
    Column("priority_weight", Double, nullable=False),
    Column("effective_weight", Double, nullable=False),
    Column("fair_share_cu", Double, nullable=False),
    Column("decayed_usage_cu_s", Double, nullable=False),
    Column("fair_share_gpus_by_type", JSONB, nullable=False),
    Index("ix_fair_share_history_pool_queue_time", "pool", "queue", "computed_at"),
)

# A periodic job claims (job, period) before it runs: across any number of replicas the insert
# succeeds once, so the job runs once per period.
job_claims = Table(
    "job_claims",
    metadata,
    Column("job", Text, primary_key=True),
    Column("period_start", TZ, primary_key=True),
    Column("claimed_by", Text, nullable=False),
    Column("claimed_at", TZ, nullable=False, server_default=_now),
    Column("finished_at", TZ, nullable=True),
    Column("outcome", Text, nullable=True),
)

# Scheduling decisions (one row per Schedule call that was not a dry run).
schedule_cycles = Table(
    "schedule_cycles",
    metadata,
    Column("id", BigInteger, primary_key=True, autoincrement=True),
    Column("pool", Text, nullable=False),
    Column("decided_at", TZ, nullable=False, server_default=_now),
    Column("reply", LargeBinary, nullable=False),
    Column("binds", Integer, nullable=False),
    Column("evicts", Integer, nullable=False),
    Column("pending", Integer, nullable=False),
    Column("dry_run", Boolean, nullable=False, server_default=text("false")),
    Index("ix_schedule_cycles_pool_time", "pool", "decided_at"),
)

# Evictions decided by Schedule whose victims have not stopped yet: the cycle holds their capacity
# for the workload they were evicted for (see domain/snapshot.py). A row goes once a cycle has run
# after its victim stopped (that cycle serves the beneficiary's standing claim).
evictions = Table(
    "evictions",
    metadata,
    Column("victim_uid", Text, primary_key=True),
    Column("beneficiary_uid", Text, nullable=True),
    Column("pool", Text, nullable=False, index=True),
    Column("reason", Text, nullable=False),
    Column("cycle_id", BigInteger, nullable=False),
    Column("decided_at", TZ, nullable=False, server_default=_now),
    # A move (defragmentation): where the victim goes, {"gpu_type", "pods"}; NULL otherwise.
    Column("move_to", JSONB, nullable=True),
)

# Moves (defragmentation evictions) of the last hour, per pool: the hourly move budget's use
# (`NodePool.max_moved_share_per_hour`). Written with the cycle; older rows go as new ones come.
moves = Table(
    "moves",
    metadata,
    Column("pool", Text, primary_key=True),
    Column("victim_uid", Text, primary_key=True),
    Column("decided_at", TZ, primary_key=True),
    Column("gpus", Double, nullable=False),
)
