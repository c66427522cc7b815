"""cluster config and request replies

Revision ID: 0001
Revises: (none)
Create Date: 2026-11-30 05:24:20.986051
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "config_versions",
        sa.Column("version", sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column(
            "applied_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column("changes", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.PrimaryKeyConstraint("version", name=op.f("pk_config_versions")),
    )
    op.create_table(
        "gpu_types",
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("memory_gib", sa.Double(), nullable=False),
        sa.Column("compute_weight", sa.Double(), nullable=False),
        sa.Column(
            "partition_profiles",
            postgresql.JSONB(astext_type=sa.Text()),
            server_default=sa.text("'[]'::jsonb"),
            nullable=False,
        ),
        sa.CheckConstraint("compute_weight > 0", name=op.f("ck_gpu_types_compute_weight_positive")),
        sa.CheckConstraint("memory_gib > 0", name=op.f("ck_gpu_types_memory_positive")),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_gpu_types")),
    )
    op.create_table(
        "node_pools",
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("window_kind", sa.Text(), nullable=False),
        sa.Column("window_s", sa.Double(), nullable=False),
        sa.Column("window_anchor_s", sa.Double(), nullable=False),
        sa.Column("half_life_s", sa.Double(), nullable=True),
        sa.Column("k", sa.Double(), nullable=False),
        sa.Column("usage_basis", sa.Text(), nullable=False),
        sa.Column("recompute_interval_s", sa.Double(), nullable=False),
        sa.Column("rounding", sa.Text(), nullable=False),
        sa.Column("dead_band", sa.Double(), nullable=False),
        sa.Column("placement", sa.Text(), nullable=False),
        sa.Column("gang_reservation_after_s", sa.Double(), nullable=True),
        sa.CheckConstraint(
            "placement IN ('binpack', 'spread')", name=op.f("ck_node_pools_placement_known")
        ),
        sa.CheckConstraint(
            "rounding IN ('continuous', 'whole_gpus')", name=op.f("ck_node_pools_rounding_known")
        ),
        sa.CheckConstraint(
            "usage_basis IN ('over_quota', 'total')", name=op.f("ck_node_pools_usage_basis_known")
        ),
        sa.CheckConstraint(
            "window_kind IN ('sliding', 'tumbling', 'none')",
            name=op.f("ck_node_pools_window_kind_known"),
        ),
        sa.CheckConstraint("k >= 0", name=op.f("ck_node_pools_k_non_negative")),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_node_pools")),
    )
    op.create_table(
        "queues",
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("parent", sa.Text(), nullable=True),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.CheckConstraint(
            "parent IS NULL OR parent <> name", name=op.f("ck_queues_not_own_parent")
        ),
        sa.ForeignKeyConstraint(
            ["parent"],
            ["queues.name"],
            name=op.f("fk_queues_parent_queues"),
            initially="DEFERRED",
            deferrable=True,
        ),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_queues")),
    )
    op.create_index(op.f("ix_queues_parent"), "queues", ["parent"], unique=False)
    op.create_table(
        "request_replies",
        sa.Column("request_id", sa.Text(), nullable=False),
        sa.Column("method", sa.Text(), nullable=False),
        sa.Column("request_digest", sa.Text(), nullable=False),
        sa.Column("reply", sa.LargeBinary(), nullable=False),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.PrimaryKeyConstraint("request_id", name=op.f("pk_request_replies")),
    )
    op.create_index(
        op.f("ix_request_replies_created_at"), "request_replies", ["created_at"], unique=False
    )
    op.create_table(
        "budgets",
        sa.Column("queue", sa.Text(), nullable=False),
        sa.Column("period", sa.Text(), nullable=False),
        sa.Column("pool", sa.Text(), server_default=sa.text("''"), nullable=False),
        sa.Column("cu_hours", sa.Double(), nullable=False),
        sa.CheckConstraint(
            "period IN ('day', 'week', 'month')", name=op.f("ck_budgets_period_known")
        ),
        sa.CheckConstraint("cu_hours > 0", name=op.f("ck_budgets_cu_hours_positive")),
        sa.ForeignKeyConstraint(
            ["queue"],
            ["queues.name"],
            name=op.f("fk_budgets_queue_queues"),
            ondelete="CASCADE",
            initially="DEFERRED",
            deferrable=True,
        ),
        sa.PrimaryKeyConstraint("queue", "period", "pool", name=op.f("pk_budgets")),
    )
    op.create_table(
        "nodes",
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("pool", sa.Text(), nullable=False),
        sa.Column("gpu_type", sa.Text(), nullable=False),
        sa.Column("gpu_count", sa.Integer(), nullable=False),
        sa.Column("cpu_millicores", sa.BigInteger(), nullable=False),
        sa.Column("memory_mib", sa.BigInteger(), nullable=False),
        sa.Column(
            "labels",
            postgresql.JSONB(astext_type=sa.Text()),
            server_default=sa.text("'{}'::jsonb"),
            nullable=False,
        ),
        sa.Column("ready", sa.Boolean(), server_default=sa.text("true"), nullable=False),
        sa.CheckConstraint("gpu_count >= 0", name=op.f("ck_nodes_gpu_count_non_negative")),
        sa.ForeignKeyConstraint(
            ["gpu_type"],
            ["gpu_types.name"],
            name=op.f("fk_nodes_gpu_type_gpu_types"),
            initially="DEFERRED",
            deferrable=True,
        ),
        sa.ForeignKeyConstraint(
            ["pool"],
            ["node_pools.name"],
            name=op.f("fk_nodes_pool_node_pools"),
            initially="DEFERRED",
            deferrable=True,
        ),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_nodes")),
    )
    op.create_index(op.f("ix_nodes_pool"), "nodes", ["pool"], unique=False)
    op.create_table(
        "queue_quotas",
        sa.Column("queue", sa.Text(), nullable=False),
        sa.Column("pool", sa.Text(), nullable=False),
        sa.Column("deserved_cu", sa.Double(), nullable=False),
        sa.Column(
            "deserved_gpus_by_type",
            postgresql.JSONB(astext_type=sa.Text()),
            server_default=sa.text("'{}'::jsonb"),
            nullable=False,
        ),
        sa.Column("over_quota_weight", sa.Double(), nullable=False),
        sa.Column("limit_cu", sa.Double(), nullable=True),
        sa.Column(
            "limit_gpus_by_type",
            postgresql.JSONB(astext_type=sa.Text()),
            server_default=sa.text("'{}'::jsonb"),
            nullable=False,
        ),
        sa.Column("priority", sa.Integer(), nullable=False),
        sa.CheckConstraint("deserved_cu >= 0", name=op.f("ck_queue_quotas_deserved_non_negative")),
        sa.CheckConstraint(
            "over_quota_weight >= 0", name=op.f("ck_queue_quotas_weight_non_negative")
        ),
        sa.ForeignKeyConstraint(
            ["pool"],
            ["node_pools.name"],
            name=op.f("fk_queue_quotas_pool_node_pools"),
            initially="DEFERRED",
            deferrable=True,
        ),
        sa.ForeignKeyConstraint(
            ["queue"],
            ["queues.name"],
            name=op.f("fk_queue_quotas_queue_queues"),
            ondelete="CASCADE",
            initially="DEFERRED",
            deferrable=True,
        ),
        sa.PrimaryKeyConstraint("queue", "pool", name=op.f("pk_queue_quotas")),
    )


def downgrade() -> None:
    op.drop_table("queue_quotas")
    op.drop_index(op.f("ix_nodes_pool"), table_name="nodes")
    op.drop_table("nodes")
    op.drop_table("budgets")
    op.drop_index(op.f("ix_request_replies_created_at"), table_name="request_replies")
    op.drop_table("request_replies")
    op.drop_index(op.f("ix_queues_parent"), table_name="queues")
    op.drop_table("queues")
    op.drop_table("node_pools")
    op.drop_table("gpu_types")
    op.drop_table("config_versions")
