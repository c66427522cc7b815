"""Migrations: replicas starting together, and tables that match the migrations."""

from __future__ import annotations

import threading

from sqlalchemy import create_engine, inspect

from gpufair.store import migrate
from gpufair.store.database import Database, normalise_url
from gpufair.store.schema import metadata
from gpufair.store.scratch import scratch_database


def test_concurrent_upgrades_serialise(pg_server: Database) -> None:
    with scratch_database(pg_server.url) as url:
        errors: list[BaseException] = []

        def upgrade() -> None:
            try:
                migrate.upgrade(url)
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=upgrade) for _ in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        assert errors == []
        assert migrate.current_revision(url) == migrate.head_revision(url)
        engine = create_engine(normalise_url(url))
        try:
            tables = set(inspect(engine).get_table_names())
        finally:
            engine.dispose()
        assert {t.name for t in metadata.sorted_tables} <= tables


def test_models_and_migrations_agree(database_url: str) -> None:
    migrate.check(database_url)  # raises if autogenerate would find a difference
