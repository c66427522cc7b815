"""Throw-away databases on a PostgreSQL server, for tests, CI checks and benchmarks.

The server is the first of: `$GPUFAIR_TEST_DATABASE_URL`, PostgreSQL on 127.0.0.1:5432 when it
answers, or an embedded server in a temporary directory. Each scratch database gets a unique name
and is dropped afterwards, so nothing depends on what an earlier run left behind.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
from psycopg import sql
from sqlalchemy.engine import make_url

from gpufair.store.database import Database, normalise_url, start_embedded

TEST_DATABASE_URL_ENV = "GPUFAIR_TEST_DATABASE_URL"
LOCAL_SERVER_URL = "postgresql://postgres@127.0.0.1:5432/postgres"


def _libpq_url(url: str) -> str:
    return make_url(normalise_url(url)).set(drivername="postgresql").render_as_string(False)


def _reachable(url: str) -> bool:
    try:
        with psycopg.connect(_libpq_url(url), connect_timeout=2):
            return True
    except psycopg.OperationalError:
        return False


@contextlib.contextmanager
def test_server() -> Iterator[Database]:
    """A server to create scratch databases on; an embedded one is stopped afterwards."""
    given = os.environ.get(TEST_DATABASE_URL_ENV)
    if given:
        yield Database(url=normalise_url(given))
        return
    if _reachable(LOCAL_SERVER_URL):
        yield Database(url=normalise_url(LOCAL_SERVER_URL))
        return
    with tempfile.TemporaryDirectory(prefix="gpufair-pg-") as tmp:
        database = start_embedded(Path(tmp) / "pgdata")
        try:
            yield database
        finally:
            database.close()


@contextlib.contextmanager
def scratch_database(server_url: str, prefix: str = "gpufair_test") -> Iterator[str]:
    """Create a uniquely named database on the server, yield its URL, drop it afterwards."""
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    admin = _libpq_url(server_url)
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        yield make_url(normalise_url(server_url)).set(database=name).render_as_string(False)
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )
