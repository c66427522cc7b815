"""The database of the commands that open it themselves (`serve`, `migrate`, `token`): a URL
that cannot be PostgreSQL's and a server that does not answer are the user's to fix, so each is
one line of error, not a traceback. SQLAlchemy is imported only when such a command runs."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gpufair.store.database import Database

# Said instead of the URL, which may hold a password.
_URL_SHAPE = "postgresql://user:password@host:port/database"


class DatabaseUrlError(Exception):
    """The URL given is not one gpufair can use: one message, exit code 2."""


def resolve(args: argparse.Namespace) -> Database:
    """The database the options (or $GPUFAIR_DATABASE_URL) name, else the embedded one."""
    from sqlalchemy.exc import ArgumentError

    from gpufair.store import database

    url = args.database_url or os.environ.get(database.DATABASE_URL_ENV) or None
    if url:
        try:
            database.normalise_url(url)
        except ArgumentError:
            raise DatabaseUrlError(f"not a database URL (expected {_URL_SHAPE})") from None
        except ValueError as exc:  # a URL of another database
            raise DatabaseUrlError(str(exc)) from None
    return database.resolve(url, Path(args.data_dir) if args.data_dir else None)


def describe(exc: BaseException) -> str | None:
    """One line or two for a database error the user can act on (the server does not answer,
    refuses the login, has no such database); None for anything else."""
    errors = sys.modules.get("sqlalchemy.exc")
    if errors is None or not isinstance(exc, errors.OperationalError):
        return None
    state = getattr(exc.orig, "sqlstate", None)
    if state is not None and state[:2] not in ("08", "28", "3D"):
        return None
    return f"cannot reach the database: {str(exc.orig).strip()}"
