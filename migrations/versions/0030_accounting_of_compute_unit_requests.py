"""report.workload_accounting: a compute-unit request's ask; utilisation above 1 explained

0010's `requested_gpus` is pods times GPUs per pod. A request of compute units leaves both to
placement (stored 0), so the view said such a workload asked for 0 GPUs. It is NULL for one now,
and a new last column, `requested_cu`, gives the CU it asked for (NULL for a request of GPUs).
CREATE OR REPLACE adds a column only at the end and keeps the grants.

`report.pool_utilisation_daily.utilisation` was commented "0 to 1". A node drained, or reported
with fewer usable GPUs, leaves the capacity at once, while the work already running there keeps
running and counts as used until it stops: a day with such a node can read above 1 (and idle
hours below 0). The comments say so; the numbers are unchanged.

Revision ID: 0030
Revises: 0029
Create Date: 2026-12-10 12:00:00.000000
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

from alembic import op

revision = "0030"
down_revision = "0029"
branch_labels = None
depends_on = None

_OLD_GPUS = "(w.spec ->> 'pods')::int * (w.spec ->> 'gpus_per_pod')::float8 AS requested_gpus,"
_NEW_GPUS = (
    "CASE WHEN w.spec ? 'compute_units' THEN NULL "
    "ELSE (w.spec ->> 'pods')::int * (w.spec ->> 'gpus_per_pod')::float8 END AS requested_gpus,"
)
_LAST = "       r.last_end_kind\nFROM public.workloads w"
_WITH_CU = (
    "       r.last_end_kind,\n"
    "       (w.spec ->> 'compute_units')::float8 AS requested_cu\n"
    "FROM public.workloads w"
)

COMMENTS = {
    ("workload_accounting", "requested_gpus"): (
        "pods times GPUs per pod; NULL for a request of compute units (see requested_cu)"
    ),
    ("workload_accounting", "requested_cu"): (
        "compute units a request of compute units asked for; NULL for a request of GPUs"
    ),
    ("pool_utilisation_daily", "utilisation"): (
        "used over capacity; NULL without capacity. Above 1 (idle hours below 0) when work kept "
        "running on a node drained or reported with fewer GPUs: it left the capacity at once"
    ),
    ("pool_utilisation_daily", "idle_gpu_hours"): (
        "capacity_gpu_hours minus used_gpu_hours; below 0 when work kept running on a node "
        "drained or reported with fewer GPUs"
    ),
}


def _load(name: str, file: str) -> ModuleType:
    """A migration's module, from its file beside this one (Alembic loads migrations by path)."""
    spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name(file))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _accounting_0023() -> str:
    """The view as 0023 left it."""
    m0023 = _load("gpufair_migration_0023", "0023_accounting_without_pruned_runs.py")
    sql: str = m0023._accounting(m0023._NEW_WAIT)
    return sql


def _comment(view: str, column: str, text: str) -> None:
    quoted = text.replace("'", "''")
    op.execute(f"COMMENT ON COLUMN report.{view}.{column} IS '{quoted}'")


def upgrade() -> None:
    sql = _accounting_0023()
    assert _OLD_GPUS in sql and _LAST in sql
    op.execute(sql.replace(_OLD_GPUS, _NEW_GPUS).replace(_LAST, _WITH_CU))
    for (view, column), text in COMMENTS.items():
        _comment(view, column, text)


def downgrade() -> None:
    # A view's columns cannot be dropped by CREATE OR REPLACE: the view is made again as 0023
    # left it, and its grants and comments with it.
    grants = op.get_bind().exec_driver_sql(
        "SELECT grantee, privilege_type FROM information_schema.role_table_grants "
        "WHERE table_schema = 'report' AND table_name = 'workload_accounting'"
    )
    kept = [(r[0], r[1]) for r in grants]
    op.execute("DROP VIEW report.workload_accounting")
    op.execute(_accounting_0023().replace("CREATE OR REPLACE VIEW", "CREATE VIEW"))
    for grantee, privilege in kept:
        role = "PUBLIC" if grantee == "PUBLIC" else '"' + grantee.replace('"', '""') + '"'
        op.execute(f"GRANT {privilege} ON report.workload_accounting TO {role}")
    m0010 = _load("gpufair_migration_0010", "0010_report_views_for_bi_tools.py")
    m0023 = _load("gpufair_migration_0023", "0023_accounting_without_pruned_runs.py")
    view_comment, columns = m0010.COMMENTS["workload_accounting"]
    quoted = view_comment.replace("'", "''")
    op.execute(f"COMMENT ON VIEW report.workload_accounting IS '{quoted}'")
    for column, text in columns.items():
        _comment("workload_accounting", column, m0023._COMMENT if column == "wait_s" else text)
    _, utilisation = m0010.COMMENTS["pool_utilisation_daily"]
    for column in ("utilisation", "idle_gpu_hours"):
        _comment("pool_utilisation_daily", column, utilisation[column])
