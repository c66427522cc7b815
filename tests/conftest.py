"""Shared fixtures: a real PostgreSQL (a scratch database per test session) and a real gRPC server.

The server behind the scratch database is $GPUFAIR_TEST_DATABASE_URL, else PostgreSQL on
127.0.0.1:5432 when it answers, else an embedded PostgreSQL. Tests that write truncate every table
afterwards, so each starts from an empty, migrated schema.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
from sqlalchemy import Engine, text

from gpufair.api.server import RunningServer, build_server
from gpufair.cli.logs import stop_logging
from gpufair.client import GpufairClient
from gpufair.store import migrate
from gpufair.store.commit_watch import wrote_read_key
from gpufair.store.database import Database, make_engine
from gpufair.store.schema import metadata
from gpufair.store.scratch import scratch_database, test_server


@pytest.fixture(autouse=True)
def logging_as_it_was() -> Iterator[None]:
    """The root logger's handlers and level put back after each test. A command run in-process
    (`main(["migrate", ...])`) sets the root's handler to a stream on the test's captured stderr,
    which pytest closes after the test: a later test's server then logged each RPC line into a
    closed file, and the error it printed landed in that test's own captured stderr."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    stop_logging()  # a queued writer (`serve`), if the test left one
    root.handlers[:] = handlers
    root.setLevel(level)


@pytest.fixture(scope="session")
def pg_server() -> Iterator[Database]:
    with test_server() as server:
        yield server


@pytest.fixture(scope="session")
def database_url(pg_server: Database) -> Iterator[str]:
    with scratch_database(pg_server.url) as url:
        migrate.upgrade(url)
        yield url


@pytest.fixture(scope="session")
def engine(database_url: str) -> Iterator[Engine]:
    engine = make_engine(database_url, pool_size=5)
    yield engine
    engine.dispose()


def truncate_all(engine: Engine) -> None:
    names = ", ".join(f'"{t.name}"' for t in metadata.sorted_tables)
    with engine.begin() as conn:
        # Emptied, the read caches' keys move: the servers on `engine` check at once, the
        # others when the notification arrives (store/commit_watch.py).
        wrote_read_key(conn)
        conn.execute(text(f"TRUNCATE {names} RESTART IDENTITY CASCADE"))


@pytest.fixture
def db(engine: Engine) -> Iterator[Engine]:
    """The engine, with every table emptied after the test."""
    yield engine
    truncate_all(engine)


@pytest.fixture(scope="session")
def server(engine: Engine) -> Iterator[RunningServer]:
    running = build_server(engine, "127.0.0.1:0", max_workers=8)
    yield running
    running.stop(1.0)


@pytest.fixture
def client(server: RunningServer, db: Engine) -> Iterator[GpufairClient]:
    with GpufairClient(f"127.0.0.1:{server.port}", timeout_s=20, attempts=1) as c:
        yield c
