"""report.workload_accounting: a wait is never below 0

`wait_s` is the first start (or the cancel, or now while it waits) minus the submit time. The
start is the batch system's own timestamp, the submit time the submitter's (or gpufair's when
none was sent): when their clocks disagree, a start can read before its submit, and a submit
time ahead of the server's clock makes a pending workload's wait negative. Such a workload
waited no time as far as anyone can tell: its wait reads 0, as the wait histograms of the
metrics count it (`metrics.py`), instead of minus the skew. NULL stays NULL (finished work whose
runs retention deleted). Same columns and types: CREATE OR REPLACE keeps the grants.

Revision ID: 0031
Revises: 0030
Create Date: 2026-12-06 10:30:00.000000
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

from alembic import op

revision = "0031"
down_revision = "0030"
branch_labels = None
depends_on = None

COMMENT = (
    "seconds from submit to its first start (to now while it waits; NULL for finished work "
    "whose runs retention deleted); 0, never below, when the start (or now) reads before the "
    "submit time: the batch system's clock behind the submitter's"
)


def _load(name: str, file: str) -> ModuleType:
    """A migration's module, from its file beside this one (Alembic loads migrations by path)."""
    spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name(file))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _waits() -> tuple[str, str]:
    """0030's expression of the wait, and the same never below 0 (NULL kept NULL)."""
    m0023 = _load("gpufair_migration_0023", "0023_accounting_without_pruned_runs.py")
    seconds = (
        "extract(epoch FROM coalesce(\n"
        "           r.first_start,\n"
        f"           {m0023._NEW_WAIT}\n"
        "       ) - w.submit_time)"
    )
    old = f"       {seconds}::float8 AS wait_s,"
    new = f"       (CASE WHEN {seconds} < 0 THEN 0 ELSE {seconds} END)::float8 AS wait_s,"
    return old, new


def _accounting_0030() -> str:
    """The view as 0030 left it."""
    m0030 = _load("gpufair_migration_0030", "0030_accounting_of_compute_unit_requests.py")
    sql: str = m0030._accounting_0023()
    return sql.replace(m0030._OLD_GPUS, m0030._NEW_GPUS).replace(m0030._LAST, m0030._WITH_CU)


def _comment(text: str) -> None:
    quoted = text.replace("'", "''")
    op.execute(f"COMMENT ON COLUMN report.workload_accounting.wait_s IS '{quoted}'")


def upgrade() -> None:
    old, new = _waits()
    sql = _accounting_0030()
    assert old in sql
    op.execute(sql.replace(old, new))
    _comment(COMMENT)


def downgrade() -> None:
    m0023 = _load("gpufair_migration_0023", "0023_accounting_without_pruned_runs.py")
    op.execute(_accounting_0030())
    _comment(m0023._COMMENT)
