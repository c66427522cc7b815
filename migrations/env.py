"""Alembic environment: one transaction per migration, statement and lock timeouts."""

from __future__ import annotations

import os

from alembic import context
from sqlalchemy import Connection, create_engine, text
from sqlalchemy.pool import NullPool

from gpufair.store.database import DATABASE_URL_ENV, normalise_url
from gpufair.store.schema import metadata

config = context.config


def _run(connection: Connection) -> None:
    connection.execute(text("SET statement_timeout = '300s'"))
    connection.execute(text("SET lock_timeout = '60s'"))
    connection.commit()
    context.configure(
        connection=connection,
        target_metadata=metadata,
        transaction_per_migration=True,
        compare_type=True,
        include_schemas=False,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    given = config.attributes.get("connection")
    if given is not None:
        _run(given)
        return
    url = config.get_main_option("sqlalchemy.url") or os.environ.get(DATABASE_URL_ENV)
    if not url:
        raise SystemExit(f"no database: set {DATABASE_URL_ENV}")
    engine = create_engine(normalise_url(url), poolclass=NullPool)
    with engine.connect() as connection:
        _run(connection)
    engine.dispose()


if context.is_offline_mode():
    raise SystemExit("offline migrations are not supported; run `gpufair migrate`")
run_migrations_online()
