"""The commands that work on the database itself (`migrate`, `token`, `serve`) given a database
they cannot use: one line saying why and a non-zero exit, never a traceback."""

from __future__ import annotations

import pytest
from sqlalchemy.engine import make_url

from gpufair.cli import main
from gpufair.store.database import Database


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return code, err


@pytest.mark.parametrize(
    "argv",
    [["migrate"], ["token", "list"], ["token", "create", "ci", "--role", "admin"]],
)
def test_a_server_that_does_not_answer(capsys: pytest.CaptureFixture[str], argv: list[str]) -> None:
    url = "postgresql://gpufair@127.0.0.1:1/gpufair"  # nothing listens on port 1
    code, err = run(capsys, *argv, "--database-url", url)
    assert code == 1
    assert err.startswith("error: cannot reach the database: connection failed:")
    assert "Connection refused" in err and len(err.splitlines()) <= 3


def test_a_database_that_does_not_exist(
    capsys: pytest.CaptureFixture[str], pg_server: Database
) -> None:
    url = make_url(pg_server.url).set(database="gpufair_no_such_db").render_as_string(False)
    code, err = run(capsys, "migrate", "--database-url", url)
    assert code == 1
    assert err.startswith("error: cannot reach the database: ")
    assert 'database "gpufair_no_such_db" does not exist' in err


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("mysql://gpufair@db/gpufair", "error: gpufair needs PostgreSQL, got a mysql URL\n"),
        # Not echoed: a URL may hold a password.
        (
            "gpufair:secret@db.example.internal",
            "error: not a database URL (expected postgresql://user:password@host:port/database)\n",
        ),
    ],
)
@pytest.mark.parametrize("argv", [["migrate"], ["token", "list"], ["serve", "--processes", "1"]])
def test_a_url_that_is_not_postgresql(
    capsys: pytest.CaptureFixture[str], argv: list[str], url: str, message: str
) -> None:
    code, err = run(capsys, *argv, "--database-url", url)
    assert (code, err) == (2, message)
