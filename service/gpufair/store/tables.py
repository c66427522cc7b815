"""The tables of the declared cluster state and of request idempotency.

SQLAlchemy Core tables: repositories in this package read and write them with explicit SQL, and
Alembic compares them to the database (`alembic check` in CI keeps the two from drifting).
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    Column,
    DateTime,
    Double,
    ForeignKey,
    Integer,
    LargeBinary,
    MetaData,
    Table,
    Text,
    func,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB

# Stable constraint names, so migrations can refer to them on every database.
metadata = MetaData(
    naming_convention={
        "ix": "ix_%(column_0_label)s",
        "uq": "uq_%(table_name)s_%(column_0_name)s",
        "ck": "ck_%(table_name)s_%(constraint_name)s",
        "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
        "pk": "pk_%(table_name)s",
    }
)

_now = func.now()

gpu_types = Table(
    "gpu_types",
    metadata,
    Column("name", Text, primary_key=True),
    Column("memory_gib", Double, nullable=False),
    Column("compute_weight", Double, nullable=False),
    # [{"name": "1g.10gb", "gpu_fraction": 0.142857, "memory_gib": 10}, ...]
    Column("partition_profiles", JSONB, nullable=False, server_default=text("'[]'::jsonb")),
    CheckConstraint("memory_gib > 0", name="memory_positive"),
    CheckConstraint("compute_weight > 0", name="compute_weight_positive"),
)

node_pools = Table(
    "node_pools",
    metadata,
    Column("name", Text, primary_key=True),
    Column("window_kind", Text, nullable=False),
    Column("window_s", Double, nullable=False),
    Column("window_anchor_s", Double, nullable=False),
    Column("half_life_s", Double, nullable=True),
    Column("k", Double, nullable=False),
    Column("usage_basis", Text, nullable=False),
    Column("recompute_interval_s", Double, nullable=False),
    Column("rounding", Text, nullable=False),
    Column("dead_band", Double, nullable=False),
    Column("placement", Text, nullable=False),
    Column("gang_reservation_after_s", Double, nullable=True),
    Column("max_borrow_s", Double, nullable=True),
    Column("division", Text, nullable=False, server_default=text("'gpufair'")),
    Column("topology_levels", JSONB, nullable=False, server_default=text("'[]'::jsonb")),
    Column("max_moved_share_per_hour", Double, nullable=True),
    Column("gang_entitlement", Boolean, nullable=False, server_default=text("false")),
    CheckConstraint("window_kind IN ('sliding', 'tumbling', 'none')", name="window_kind_known"),
    CheckConstraint("usage_basis IN ('over_quota', 'total')", name="usage_basis_known"),
    CheckConstraint("rounding IN ('continuous', 'whole_gpus')", name="rounding_known"),
    CheckConstraint("placement IN ('binpack', 'spread')", name="placement_known"),
    CheckConstraint("division IN ('gpufair', 'kai')", name="division_known"),
    CheckConstraint("k >= 0", name="k_non_negative"),
)

nodes = Table(
    "nodes",
    metadata,
    Column("name", Text, primary_key=True),
    Column(
        "pool",
        Text,
        ForeignKey("node_pools.name", deferrable=True, initially="DEFERRED"),
        nullable=False,
        index=True,
    ),
    Column(
        "gpu_type",
        Text,
        ForeignKey("gpu_types.name", deferrable=True, initially="DEFERRED"),
        nullable=False,
    ),
    Column("gpu_count", Integer, nullable=False),
    Column("cpu_millicores", BigInteger, nullable=False),
    Column("memory_mib", BigInteger, nullable=False),
    Column("labels", JSONB, nullable=False, server_default=text("'{}'::jsonb")),
    Column("ready", Boolean, nullable=False, server_default=text("true")),
    CheckConstraint("gpu_count >= 0", name="gpu_count_non_negative"),
)

queues = Table(
    "queues",
    metadata,
    Column("name", Text, primary_key=True),
    Column(
        "parent",
        Text,
        ForeignKey("queues.name", deferrable=True, initially="DEFERRED"),
        nullable=True,
        index=True,
    ),
    # Older queues win whole-GPU rounding ties; kept across updates of the queue.
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=_now),
    CheckConstraint("parent IS NULL OR parent <> name", name="not_own_parent"),
)

queue_quotas = Table(
    "queue_quotas",
    metadata,
    Column(
        "queue",
        Text,
        ForeignKey("queues.name", ondelete="CASCADE", deferrable=True, initially="DEFERRED"),
        primary_key=True,
    ),
    Column(
        "pool",
        Text,
        ForeignKey("node_pools.name", deferrable=True, initially="DEFERRED"),
        primary_key=True,
    ),
    Column("deserved_cu", Double, nullable=False),
    Column("deserved_gpus_by_type", JSONB, nullable=False, server_default=text("'{}'::jsonb")),
    Column("over_quota_weight", Double, nullable=False),
    Column("limit_cu", Double, nullable=True),
    Column("limit_gpus_by_type", JSONB, nullable=False, server_default=text("'{}'::jsonb")),
    Column("priority", Integer, nullable=False),
    Column("max_borrow_s", Double, nullable=True),
    CheckConstraint("deserved_cu >= 0", name="deserved_non_negative"),
    CheckConstraint("over_quota_weight >= 0", name="weight_non_negative"),
)

budgets = Table(
    "budgets",
    metadata,
    Column(
        "queue",
        Text,
        ForeignKey("queues.name", ondelete="CASCADE", deferrable=True, initially="DEFERRED"),
        primary_key=True,
    ),
    Column("period", Text, primary_key=True),
    # '' = all pools; part of the key, so it cannot be NULL.
    Column("pool", Text, primary_key=True, server_default=text("''")),
    Column("cu_hours", Double, nullable=False),
    CheckConstraint("period IN ('day', 'week', 'month')", name="period_known"),
    CheckConstraint("cu_hours > 0", name="cu_hours_positive"),
)

# One row per applied change set: the version the API reports and an audit trail of diffs.
config_versions = Table(
    "config_versions",
    metadata,
    Column("version", BigInteger, primary_key=True, autoincrement=False),
    Column("applied_at", DateTime(timezone=True), nullable=False, server_default=_now),
    Column("changes", JSONB, nullable=False),
)

# Mutating RPCs carry a request id; the first reply is stored and returned to replays.
request_replies = Table(
    "request_replies",
    metadata,
    Column("request_id", Text, primary_key=True),
    Column("method", Text, nullable=False),
    Column("request_digest", Text, nullable=False),  # sha256 of the request, to catch reuse
    Column("reply", LargeBinary, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=_now, index=True),
)
