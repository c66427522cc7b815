"""Run the Alembic migrations, safely when several replicas start at once.

The upgrade holds a session-level advisory lock on a connection of its own (not from the service's
pool, and closed afterwards, so the lock cannot leak), and Alembic runs each migration in its own
transaction under it: a replica that starts while another migrates waits, then finds nothing to do.
"""

from __future__ import annotations

from importlib import resources

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import create_engine, text
from sqlalchemy.pool import NullPool

from gpufair.store import locks
from gpufair.store.database import normalise_url

LOCK_TIMEOUT_S = 300


def alembic_config(url: str) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(resources.files("gpufair.migrations")))
    # ConfigParser interpolation: a literal % in a password must be doubled.
    cfg.set_main_option("sqlalchemy.url", normalise_url(url).replace("%", "%%"))
    return cfg


def upgrade(url: str, revision: str = "head") -> None:
    """Migrate the database at `url` to `revision` under the migrations lock."""
    cfg = alembic_config(url)
    engine = create_engine(normalise_url(url), poolclass=NullPool)
    try:
        with engine.connect() as conn:
            conn.execute(text(f"SET lock_timeout = '{LOCK_TIMEOUT_S}s'"))
            conn.execute(text("SELECT pg_advisory_lock(:key)"), {"key": locks.MIGRATIONS})
            conn.commit()
            try:
                cfg.attributes["connection"] = conn
                command.upgrade(cfg, revision)
            finally:
                conn.rollback()
                conn.execute(text("SELECT pg_advisory_unlock(:key)"), {"key": locks.MIGRATIONS})
                conn.commit()
    finally:
        engine.dispose()


def current_revision(url: str) -> str | None:
    engine = create_engine(normalise_url(url), poolclass=NullPool)
    try:
        with engine.connect() as conn:
            return MigrationContext.configure(conn).get_current_revision()
    finally:
        engine.dispose()


def head_revision(url: str) -> str | None:
    return ScriptDirectory.from_config(alembic_config(url)).get_current_head()


def check(url: str) -> None:
    """Raise if the tables in code and the migrations disagree (`alembic check`)."""
    command.check(alembic_config(url))
