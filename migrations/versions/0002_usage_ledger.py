"""usage ledger

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30 05:34:09.618219
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "allocation_intervals",
        sa.Column("id", sa.BigInteger(), autoincrement=True, nullable=False),
        sa.Column("workload_uid", sa.Text(), nullable=False),
        sa.Column("start_event_id", sa.UUID(as_uuid=False), nullable=False),
        sa.Column("queue", sa.Text(), nullable=False),
        sa.Column("pool", sa.Text(), nullable=False),
        sa.Column("gpu_type", sa.Text(), nullable=False),
        sa.Column("gpus", sa.Double(), nullable=False),
        sa.Column("cu", sa.Double(), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("ended_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_heartbeat_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("end_kind", sa.Text(), nullable=True),
        sa.Column("pods", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.CheckConstraint(
            "ended_at IS NULL OR ended_at >= started_at",
            name=op.f("ck_allocation_intervals_ends_after_start"),
        ),
        sa.CheckConstraint(
            "gpus >= 0 AND cu >= 0", name=op.f("ck_allocation_intervals_amounts_non_negative")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_allocation_intervals")),
    )
    op.create_index(
        "ix_allocation_intervals_open",
        "allocation_intervals",
        ["pool"],
        unique=False,
        postgresql_where=sa.text("ended_at IS NULL"),
    )
    op.create_index(
        "ix_allocation_intervals_pool_span",
        "allocation_intervals",
        ["pool", "started_at", "ended_at"],
        unique=False,
    )
    op.create_index(
        "ix_allocation_intervals_workload", "allocation_intervals", ["workload_uid"], unique=False
    )
    op.create_table(
        "fair_share_history",
        sa.Column("run_id", sa.BigInteger(), nullable=False),
        sa.Column("queue", sa.Text(), nullable=False),
        sa.Column("pool", sa.Text(), nullable=False),
        sa.Column("computed_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("parent", sa.Text(), nullable=True),
        sa.Column("priority", sa.Integer(), nullable=False),
        sa.Column("deserved_cu", sa.Double(), nullable=False),
        sa.Column("demand_cu", sa.Double(), nullable=False),
        sa.Column("limit_cu", sa.Double(), nullable=True),
        sa.Column("allocated_cu", sa.Double(), nullable=False),
        sa.Column("weight_share", sa.Double(), nullable=False),
        sa.Column("usage_share", sa.Double(), nullable=False),
        sa.Column("priority_weight", sa.Double(), nullable=False),
        sa.Column("effective_weight", sa.Double(), nullable=False),
        sa.Column("fair_share_cu", sa.Double(), nullable=False),
        sa.Column("decayed_usage_cu_s", sa.Double(), nullable=False),
        sa.Column(
            "fair_share_gpus_by_type", postgresql.JSONB(astext_type=sa.Text()), nullable=False
        ),
        sa.PrimaryKeyConstraint("run_id", "queue", name=op.f("pk_fair_share_history")),
    )
    op.create_index(
        "ix_fair_share_history_pool_queue_time",
        "fair_share_history",
        ["pool", "queue", "computed_at"],
        unique=False,
    )
    op.create_table(
        "fair_share_runs",
        sa.Column("id", sa.BigInteger(), autoincrement=True, nullable=False),
        sa.Column("pool", sa.Text(), nullable=False),
        sa.Column("computed_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("capacity_cu", sa.Double(), nullable=False),
        sa.Column("config_version", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_fair_share_runs")),
    )
    op.create_index(
        "ix_fair_share_runs_pool_time", "fair_share_runs", ["pool", "computed_at"], unique=False
    )
    op.create_table(
        "fairness_hourly",
        sa.Column("pool", sa.Text(), nullable=False),
        sa.Column("queue", sa.Text(), nullable=False),
        sa.Column("bucket_start", sa.DateTime(timezone=True), nullable=False),
        sa.Column("half_life_s", sa.Double(), nullable=True),
        sa.Column("usage_basis", sa.Text(), nullable=False),
        sa.Column("usage_moment", sa.Double(), nullable=False),
        sa.Column("group_capacity_moment", sa.Double(), nullable=False),
        sa.PrimaryKeyConstraint("pool", "queue", "bucket_start", name=op.f("pk_fairness_hourly")),
    )
    op.create_table(
        "job_claims",
        sa.Column("job", sa.Text(), nullable=False),
        sa.Column("period_start", sa.DateTime(timezone=True), nullable=False),
        sa.Column("claimed_by", sa.Text(), nullable=False),
        sa.Column(
            "claimed_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("outcome", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("job", "period_start", name=op.f("pk_job_claims")),
    )
    op.create_table(
        "ledger_events",
        sa.Column("event_id", sa.UUID(as_uuid=False), nullable=False),
        sa.Column("workload_uid", sa.Text(), nullable=True),
        sa.Column("kind", sa.Text(), nullable=False),
        sa.Column("occurred_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("payload", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("payload_digest", sa.Text(), nullable=False),
        sa.Column(
            "received_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.CheckConstraint(
            "kind IN ('started', 'stopped', 'heartbeat', 'preempted', 'failed', 'node_capacity', 'stale')",
            name=op.f("ck_ledger_events_kind_known"),
        ),
        sa.PrimaryKeyConstraint("event_id", name=op.f("pk_ledger_events")),
    )
    op.create_index("ix_ledger_events_received_at", "ledger_events", ["received_at"], unique=False)
    op.create_index(
        "ix_ledger_events_workload", "ledger_events", ["workload_uid", "occurred_at"], unique=False
    )
    op.create_table(
        "node_capacity",
        sa.Column("node", sa.Text(), nullable=False),
        sa.Column("gpu_count", sa.Integer(), nullable=False),
        sa.Column("changed_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint("gpu_count >= 0", name=op.f("ck_node_capacity_gpu_count_non_negative")),
        sa.PrimaryKeyConstraint("node", name=op.f("pk_node_capacity")),
    )
    op.create_table(
        "pool_capacity_changes",
        sa.Column("pool", sa.Text(), nullable=False),
        sa.Column("changed_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("capacity_cu", sa.Double(), nullable=False),
        sa.Column("capacity_gpus_by_type", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("source", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("pool", "changed_at", name=op.f("pk_pool_capacity_changes")),
    )
    op.create_table(
        "rollup_watermarks",
        sa.Column("pool", sa.Text(), nullable=False),
        sa.Column("rolled_up_to", sa.DateTime(timezone=True), nullable=False),
        sa.Column("dirty_from", sa.DateTime(timezone=True), nullable=True),
        sa.Column("half_life_s", sa.Double(), nullable=True),
        sa.Column("usage_basis", sa.Text(), nullable=False),
        sa.Column("config_version", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("pool", name=op.f("pk_rollup_watermarks")),
    )
    op.create_table(
        "schedule_cycles",
        sa.Column("id", sa.BigInteger(), autoincrement=True, nullable=False),
        sa.Column("pool", sa.Text(), nullable=False),
        sa.Column(
            "decided_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column("reply", sa.LargeBinary(), nullable=False),
        sa.Column("binds", sa.Integer(), nullable=False),
        sa.Column("evicts", sa.Integer(), nullable=False),
        sa.Column("pending", sa.Integer(), nullable=False),
        sa.Column("dry_run", sa.Boolean(), server_default=sa.text("false"), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_schedule_cycles")),
    )
    op.create_index(
        "ix_schedule_cycles_pool_time", "schedule_cycles", ["pool", "decided_at"], unique=False
    )
    op.create_table(
        "usage_hourly",
        sa.Column("pool", sa.Text(), nullable=False),
        sa.Column("queue", sa.Text(), nullable=False),
        sa.Column("gpu_type", sa.Text(), nullable=False),
        sa.Column("bucket_start", sa.DateTime(timezone=True), nullable=False),
        sa.Column("gpu_seconds", sa.Double(), nullable=False),
        sa.Column("cu_seconds", sa.Double(), nullable=False),
        sa.Column("over_quota_cu_seconds", sa.Double(), nullable=False),
        sa.PrimaryKeyConstraint(
            "pool", "queue", "gpu_type", "bucket_start", name=op.f("pk_usage_hourly")
        ),
    )
    op.create_index("ix_usage_hourly_bucket", "usage_hourly", ["bucket_start"], unique=False)
    op.create_table(
        "workloads",
        sa.Column("uid", sa.Text(), nullable=False),
        sa.Column("queue", sa.Text(), nullable=False),
        sa.Column("pool", sa.Text(), nullable=False),
        sa.Column("state", sa.Text(), nullable=False),
        sa.Column("spec", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("spec_digest", sa.Text(), nullable=False),
        sa.Column("submit_time", sa.DateTime(timezone=True), nullable=False),
        sa.Column(
            "state_changed_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column("binding", postgresql.JSONB(astext_type=sa.Text()), nullable=True),
        sa.Column("bound_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("bind_expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_heartbeat_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.CheckConstraint(
            "state IN ('pending', 'bound', 'running', 'finished', 'cancelled')",
            name=op.f("ck_workloads_state_known"),
        ),
        sa.PrimaryKeyConstraint("uid", name=op.f("pk_workloads")),
    )
    op.create_index("ix_workloads_pool_state", "workloads", ["pool", "state"], unique=False)
    op.create_index("ix_workloads_queue_state", "workloads", ["queue", "state"], unique=False)


def downgrade() -> None:
    op.drop_index("ix_workloads_queue_state", table_name="workloads")
    op.drop_index("ix_workloads_pool_state", table_name="workloads")
    op.drop_table("workloads")
    op.drop_index("ix_usage_hourly_bucket", table_name="usage_hourly")
    op.drop_table("usage_hourly")
    op.drop_index("ix_schedule_cycles_pool_time", table_name="schedule_cycles")
    op.drop_table("schedule_cycles")
    op.drop_table("rollup_watermarks")
    op.drop_table("pool_capacity_changes")
    op.drop_table("node_capacity")
    op.drop_index("ix_ledger_events_workload", table_name="ledger_events")
    op.drop_index("ix_ledger_events_received_at", table_name="ledger_events")
    op.drop_table("ledger_events")
    op.drop_table("job_claims")
    op.drop_table("fairness_hourly")
    op.drop_index("ix_fair_share_runs_pool_time", table_name="fair_share_runs")
    op.drop_table("fair_share_runs")
    op.drop_index("ix_fair_share_history_pool_queue_time", table_name="fair_share_history")
    op.drop_table("fair_share_history")
    op.drop_index("ix_allocation_intervals_workload", table_name="allocation_intervals")
    op.drop_index("ix_allocation_intervals_pool_span", table_name="allocation_intervals")
    op.drop_index(
        "ix_allocation_intervals_open",
        table_name="allocation_intervals",
        postgresql_where=sa.text("ended_at IS NULL"),
    )
    op.drop_table("allocation_intervals")
