"""Migration 0026: the horizon recorded for every pool becomes pool '', on PostgreSQL.

Before it, `retention_horizons` held one row per kind, the horizon every pool was pruned to; it
now holds one per kind and pool. The old row stays as pool '', which bounds every pool's redo.
Going back keeps the earliest horizon a pool's redo is bounded by (its own row, or the later row of
every pool), the one the code before prunes every pool to.
"""

from __future__ import annotations

from alembic import command

from gpufair.store import migrate
from gpufair.store.database import Database
from gpufair.store.scratch import scratch_database
from tests.store.migrate_support import sql_rows as _rows


def test_the_horizon_of_every_pool_becomes_pool_empty_and_comes_back(pg_server: Database) -> None:
    with scratch_database(pg_server.url) as url:
        migrate.upgrade(url, "0025")
        _rows(url, "INSERT INTO retention_horizons VALUES ('rollups', to_timestamp(1000000))")
        migrate.upgrade(url, "0026")
        read = (
            "SELECT kind, pool, extract(epoch FROM kept_from)::int FROM retention_horizons "
            "ORDER BY pool"
        )
        assert _rows(url, read) == [("rollups", "", 1000000)]
        _rows(
            url,
            "INSERT INTO retention_horizons (kind, pool, kept_from) VALUES "
            "('rollups', 'a', to_timestamp(3000000)), ('rollups', 'b', to_timestamp(2000000))",
        )
        command.downgrade(migrate.alembic_config(url), "0025")
        assert _rows(
            url, "SELECT kind, extract(epoch FROM kept_from)::int FROM retention_horizons"
        ) == [("rollups", 1000000)]


def test_going_back_never_moves_the_bound_before_the_horizon_of_every_pool(
    pg_server: Database,
) -> None:
    """Every pool was pruned to the row of pool '' (at 1,000,000 s): no pool's redo starts
    before it, though pool 'a' recorded an earlier horizon of its own later (500,000 s, held
    back by a budget added since). Going back keeps the row of every pool, not 'a''s: with
    500,000 s the code before redoes every pool from there, over buckets and runs all pools
    lost up to 1,000,000 s, and writes back hours of capacity without their usage."""
    with scratch_database(pg_server.url) as url:
        migrate.upgrade(url, "0025")
        _rows(url, "INSERT INTO retention_horizons VALUES ('rollups', to_timestamp(1000000))")
        migrate.upgrade(url, "0026")
        _rows(
            url,
            "INSERT INTO retention_horizons (kind, pool, kept_from) VALUES "
            "('rollups', 'a', to_timestamp(500000)), ('rollups', 'b', to_timestamp(2000000))",
        )
        command.downgrade(migrate.alembic_config(url), "0025")
        assert _rows(
            url, "SELECT kind, extract(epoch FROM kept_from)::int FROM retention_horizons"
        ) == [("rollups", 1000000)]


def test_going_back_without_a_row_of_every_pool_keeps_the_earliest_pools(
    pg_server: Database,
) -> None:
    with scratch_database(pg_server.url) as url:
        migrate.upgrade(url, "0026")
        _rows(
            url,
            "INSERT INTO retention_horizons (kind, pool, kept_from) VALUES "
            "('rollups', 'a', to_timestamp(3000000)), ('rollups', 'b', to_timestamp(2000000))",
        )
        command.downgrade(migrate.alembic_config(url), "0025")
        assert _rows(
            url, "SELECT kind, extract(epoch FROM kept_from)::int FROM retention_horizons"
        ) == [("rollups", 2000000)]
