"""`gpufair migrate --check` on a database whose tables differ from the migrations: one line
saying what differs and a non-zero exit, never the library's traceback."""

from __future__ import annotations

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.pool import NullPool

from gpufair.cli import main
from gpufair.store import migrate
from gpufair.store.database import Database, normalise_url
from gpufair.store.scratch import scratch_database


def test_tables_that_differ_are_one_line_and_exit_1(
    capsys: pytest.CaptureFixture[str], pg_server: Database
) -> None:
    with scratch_database(pg_server.url) as url:
        migrate.upgrade(url)
        engine = create_engine(normalise_url(url), poolclass=NullPool)
        try:
            with engine.begin() as conn:  # a hand-made change the migrations do not know
                conn.execute(text("ALTER TABLE workloads ADD COLUMN note text"))
                conn.execute(text("DROP INDEX ix_fair_share_runs_pool_time"))
                conn.execute(text("ALTER TABLE evictions ALTER COLUMN reason DROP NOT NULL"))
        finally:
            engine.dispose()
        code = main(["migrate", "--check", "--database-url", url])
    out, err = capsys.readouterr()
    assert code == 1
    assert out.endswith(f"schema at revision {migrate.head_revision(url)}\n")
    assert err == (
        "error: the tables differ from the migrations (3 differences): "
        "modify nullable evictions.reason, add index ix_fair_share_runs_pool_time, "
        "remove column workloads.note\n"
    )


def test_tables_that_agree_exit_0(capsys: pytest.CaptureFixture[str], pg_server: Database) -> None:
    with scratch_database(pg_server.url) as url:
        code = main(["migrate", "--check", "--database-url", url])
    out, err = capsys.readouterr()
    assert (code, err) == (0, "")
    assert out.endswith("tables and migrations agree\n")
