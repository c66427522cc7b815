"""The read-only reporter role: it reads the `report` schema and nothing else; and migration 0003
goes down and up again while the cluster-wide role stays."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import psycopg
import pytest
from alembic import command
from psycopg import sql
from sqlalchemy.engine import make_url

from gpufair.store import migrate
from gpufair.store.database import Database
from gpufair.store.scratch import scratch_database

REPORTER = "gpufair_reporter"


def libpq(url: str) -> str:
    return make_url(url).set(drivername="postgresql").render_as_string(False)


@pytest.fixture
def login_role(database_url: str) -> Iterator[str]:
    """A LOGIN role granted the reporter role, as a person or a dashboard would get it. Roles are
    cluster-wide: a unique name, dropped afterwards."""
    name = f"gpufair_test_reader_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(libpq(database_url), autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(name)))
        conn.execute(
            sql.SQL("GRANT {} TO {}").format(sql.Identifier(REPORTER), sql.Identifier(name))
        )
    try:
        yield name
    finally:
        with psycopg.connect(libpq(database_url), autocommit=True) as conn:
            conn.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(name)))


def run_as(database_url: str, role: str, query: str) -> list[tuple[object, ...]]:
    """Run `query` with the rights of `role` (SET ROLE from the test's superuser connection, so
    no password setup is needed) in a transaction that is rolled back."""
    with psycopg.connect(libpq(database_url)) as conn:
        try:
            conn.execute(sql.SQL("SET LOCAL ROLE {}").format(sql.Identifier(role)))
            return conn.execute(query).fetchall()
        finally:
            conn.rollback()


def report_views(database_url: str) -> list[str]:
    with psycopg.connect(libpq(database_url)) as conn:
        rows = conn.execute(
            "SELECT table_name FROM information_schema.views WHERE table_schema = 'report' "
            "ORDER BY table_name"
        ).fetchall()
    return [r[0] for r in rows]


def test_reporter_reads_every_report_view(database_url: str, login_role: str) -> None:
    views = report_views(database_url)
    assert set(views) >= {
        "usage_daily",
        "usage_weekly",
        "usage_monthly",
        "queue_ancestors",
        "budget_status",
    }
    for view in views:
        run_as(database_url, login_role, f"SELECT * FROM report.{view}")
    run_as(database_url, login_role, "SELECT * FROM report.budget_status_at(now())")


@pytest.mark.parametrize(
    "table", ["workloads", "ledger_events", "usage_hourly", "budgets", "queues"]
)
def test_reporter_is_denied_the_tables(database_url: str, login_role: str, table: str) -> None:
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        run_as(database_url, login_role, f"SELECT * FROM public.{table}")


def test_others_may_not_call_the_budget_function(database_url: str) -> None:
    # It reads the ledger with its owner's rights, so it is not left executable by PUBLIC.
    name = f"gpufair_test_other_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(libpq(database_url), autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE ROLE {} NOLOGIN").format(sql.Identifier(name)))
    try:
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            run_as(database_url, name, "SELECT * FROM report.budget_status_at(now())")
    finally:
        with psycopg.connect(libpq(database_url), autocommit=True) as conn:
            conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(name)))


def test_downgrade_keeps_the_role_and_upgrade_runs_again(pg_server: Database) -> None:
    with scratch_database(pg_server.url) as url:
        migrate.upgrade(url)
        command.downgrade(migrate.alembic_config(url), "0002")
        assert migrate.current_revision(url) == "0002"
        with psycopg.connect(libpq(url)) as conn:
            assert conn.execute("SELECT to_regnamespace('report')").fetchone() == (None,)
            assert conn.execute(
                "SELECT count(*) FROM pg_roles WHERE rolname = %s", (REPORTER,)
            ).fetchone() == (1,)
        migrate.upgrade(url)  # the role exists now: created only if missing
        assert migrate.current_revision(url) == migrate.head_revision(url)
        with psycopg.connect(libpq(url)) as conn:
            assert conn.execute(
                "SELECT has_schema_privilege(%s, 'report', 'USAGE')", (REPORTER,)
            ).fetchone() == (True,)
