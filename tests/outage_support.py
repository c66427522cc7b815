"""A database outage for tests: the scratch database refuses connections until the block ends."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator

import psycopg
from psycopg import sql
from sqlalchemy.engine import make_url


def _admin_url(url: str) -> tuple[str, str]:
    """(libpq URL of the server's maintenance database, the database's name) for `url`."""
    parsed = make_url(url)
    admin = parsed.set(drivername="postgresql", database="postgres")
    return admin.render_as_string(hide_password=False), str(parsed.database)


@contextlib.contextmanager
def database_unreachable(url: str) -> Iterator[None]:
    """Refuse new connections to `url`'s database and end the open ones, as an outage would;
    allow them again afterwards. Other databases of the server are untouched."""
    admin, name = _admin_url(url)
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(
            sql.SQL("ALTER DATABASE {} ALLOW_CONNECTIONS false").format(sql.Identifier(name))
        )
        conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = %s AND pid <> pg_backend_pid()",
            (name,),
        )
    try:
        yield
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(
                sql.SQL("ALTER DATABASE {} ALLOW_CONNECTIONS true").format(sql.Identifier(name))
            )


def wait_for(check: Callable[[], bool], timeout_s: float = 20.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not reached within {timeout_s} s")
        time.sleep(0.1)
