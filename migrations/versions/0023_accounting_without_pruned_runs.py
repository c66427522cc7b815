"""report.workload_accounting: no wait for a finished workload whose runs retention pruned

0010's view counted a workload's wait from its submit time to its first run, or, with no run, to
its cancellation or to now (still waiting). Retention deletes the runs of finished work after
their age (`store/retention_repo.py`) but keeps the workload row, so such a finished workload
had no run and a wait of "now minus submit time" that grew every day, as if it still waited.
Its wait is unknown once its runs are gone: NULL, like its start and end. The comment of the
column says so. Same columns and types: CREATE OR REPLACE keeps the grants.

Revision ID: 0023
Revises: 0022
Create Date: 2026-12-06 00:20:00.000000
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

from alembic import op

revision = "0023"
down_revision = "0022"
branch_labels = None
depends_on = None

_OLD_WAIT = "CASE WHEN w.state = 'cancelled' THEN w.state_changed_at ELSE now() END"
_NEW_WAIT = (
    "CASE WHEN w.state = 'cancelled' THEN w.state_changed_at "
    "WHEN w.state = 'finished' THEN NULL ELSE now() END"
)
_COMMENT = (
    "seconds from submit to its first start (to now while it waits; NULL for finished work "
    "whose runs retention deleted)"
)


def _view_0010() -> ModuleType:
    """0010's module, from its file beside this one (Alembic loads migrations by path)."""
    spec = importlib.util.spec_from_file_location(
        "gpufair_migration_0010", Path(__file__).with_name("0010_report_views_for_bi_tools.py")
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _accounting(wait: str) -> str:
    sql: str = _view_0010()._ACCOUNTING
    assert _OLD_WAIT in sql
    return sql.replace("CREATE VIEW", "CREATE OR REPLACE VIEW").replace(_OLD_WAIT, wait)


def _comment(text: str) -> None:
    quoted = text.replace("'", "''")
    op.execute(f"COMMENT ON COLUMN report.workload_accounting.wait_s IS '{quoted}'")


def upgrade() -> None:
    op.execute(_accounting(_NEW_WAIT))
    _comment(_COMMENT)


def downgrade() -> None:
    op.execute(_accounting(_OLD_WAIT))
    _comment(_view_0010().COMMENTS["workload_accounting"][1]["wait_s"])
