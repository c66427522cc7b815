"""Migration 0028: `rollup_watermarks.current_from`, on PostgreSQL.

Every watermark before it stands for buckets all made with its config version (a change of
queues, GPU types or pools redid them all): NULL. Going back, a pool whose older buckets were
made with an older config loses its watermark, so the code before redoes it whole; the others
keep theirs.
"""

from __future__ import annotations

from alembic import command

from gpufair.store import migrate
from gpufair.store.database import Database
from gpufair.store.scratch import scratch_database
from tests.store.migrate_support import sql_rows as _rows


def test_watermarks_agree_whole_and_going_back_drops_the_partly_redone(
    pg_server: Database,
) -> None:
    with scratch_database(pg_server.url) as url:
        migrate.upgrade(url, "0027")
        _rows(
            url,
            "INSERT INTO rollup_watermarks VALUES ('a', to_timestamp(7200), NULL, 'over_quota', 3),"
            " ('b', to_timestamp(7200), 3600, 'total', 3)",
        )
        migrate.upgrade(url, "0028")
        assert _rows(url, "SELECT pool, current_from FROM rollup_watermarks ORDER BY pool") == [
            ("a", None),
            ("b", None),
        ]
        _rows(
            url, "UPDATE rollup_watermarks SET current_from = to_timestamp(3600) WHERE pool = 'b'"
        )
        command.downgrade(migrate.alembic_config(url), "0027")
        assert _rows(url, "SELECT pool, config_version FROM rollup_watermarks") == [("a", 3)]
