"""Migration 0026: the horizon recorded for every pool becomes pool '', on PostgreSQL.

Before it, `retention_horizons` held one row per kind, the horizon every pool was pruned to; it
now holds one per kind and pool. The old row stays as pool '', which bounds every pool's redo.
Going back keeps the earliest pool's horizon, the one the code before prunes every pool to.
"""

from __future__ import annotations

from alembic import command
from sqlalchemy import create_engine, text

from gpufair.store import migrate
from gpufair.store.database import Database, normalise_url
from gpufair.store.scratch import scratch_database


def _rows(url: str, sql: str, **params: object) -> list[tuple[object, ...]]:
    engine = create_engine(normalise_url(url))
    try:
        with engine.begin() as conn:
            result = conn.execute(text(sql), params)
            return [tuple(r) for r in result] if result.returns_rows else []
    finally:
        engine.dispose()


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
