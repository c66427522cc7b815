"""fair_share_runs, config_versions: any statement that writes them notifies the read caches

The read caches of every process (`api/read_cache.py`) learn that a key moved from PostgreSQL's
`NOTIFY gpufair_read_keys` (`store/commit_watch.py`). gpufair's own writers send it in the
transaction that writes a fair-share run or a config version; rows written any other way (by
hand, a restore, a TRUNCATE) sent nothing and showed only when an entry was rebuilt (5 s). A
statement trigger on both tables now sends the same notification for every insert, update,
delete or truncate: PostgreSQL delivers it only if the transaction commits, and once per
transaction however many statements sent it, so gpufair's own writes still make one.

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-02 04:40:00.000000
"""

from __future__ import annotations

from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None

# As in store/commit_watch.py when this was written (a migration keeps its own copy).
_CHANNEL = "gpufair_read_keys"
_TABLES = ("fair_share_runs", "config_versions")


def upgrade() -> None:
    op.execute(
        f"""
        CREATE FUNCTION gpufair_notify_read_keys() RETURNS trigger
        LANGUAGE plpgsql AS $$
        BEGIN
          PERFORM pg_notify('{_CHANNEL}', '');
          RETURN NULL;
        END
        $$
        """
    )
    for table in _TABLES:
        op.execute(
            f"CREATE TRIGGER {table}_notify_read_keys"
            f" AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON {table}"
            " FOR EACH STATEMENT EXECUTE FUNCTION gpufair_notify_read_keys()"
        )


def downgrade() -> None:
    for table in _TABLES:
        op.execute(f"DROP TRIGGER {table}_notify_read_keys ON {table}")
    op.execute("DROP FUNCTION gpufair_notify_read_keys()")
