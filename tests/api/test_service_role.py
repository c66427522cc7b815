"""The `gpufair_service` role (migration 0006): a login user granted it runs the whole service
(every RPC's writes, the periodic jobs, the token table, the start-up migration check) but may not
change the schema or the migration stamp; a downgrade keeps the cluster-wide role."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import psycopg
import pytest
from alembic import command
from ledger_support import STARTED, STORED, cluster, event, report, submit
from psycopg import sql
from sqlalchemy import Engine, text
from sqlalchemy.engine import make_url

from gpufair.api.server import build_server
from gpufair.client import GpufairClient
from gpufair.jobs.runner import PeriodicJobs
from gpufair.store import migrate, token_repo
from gpufair.store.database import Database, make_engine
from gpufair.store.scratch import scratch_database
from gpufair.tokens import Role

SERVICE = "gpufair_service"


def libpq(url: str) -> str:
    return make_url(url).set(drivername="postgresql").render_as_string(False)


@pytest.fixture
def service_url(database_url: str) -> Iterator[str]:
    """The test database as a LOGIN role granted only gpufair_service (trust auth: no password).
    Roles are cluster-wide: a unique name, dropped afterwards."""
    name = f"gpufair_test_service_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(libpq(database_url), autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(name)))
        conn.execute(
            sql.SQL("GRANT {} TO {}").format(sql.Identifier(SERVICE), sql.Identifier(name))
        )
    try:
        yield make_url(database_url).set(username=name).render_as_string(False)
    finally:
        with psycopg.connect(libpq(database_url), autocommit=True) as conn:
            conn.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(name)))


@pytest.fixture
def service_engine(service_url: str, db: Engine) -> Iterator[Engine]:
    engine = make_engine(service_url, pool_size=2)
    yield engine
    engine.dispose()


def test_the_service_runs_on_the_service_role(service_url: str, service_engine: Engine) -> None:
    migrate.upgrade(service_url)  # what `gpufair serve` does first: nothing to do at head
    running = build_server(service_engine, "127.0.0.1:0", max_workers=2)
    try:
        with GpufairClient(f"127.0.0.1:{running.port}", attempts=1, timeout_s=30) as client:
            assert client.apply_config(cluster()).config_version == 1
            submit(client, "w-1", gpus=8)
            bind = client.schedule("main").binds[0]
            pods = [(p.node, list(p.gpu_indices), p.gpu_fraction) for p in bind.pods]
            started = event(STARTED, "w-1", time.time() - 60, pods)
            assert [r.status for r in report(client, started)] == [STORED]
            client.explain("w-1")
            client.get_usage(pool="main")
            PeriodicJobs(service_engine).tick()  # recompute, rollup, sweep, retention
            assert client.get_fair_share("main").queues
            client.cancel_workload("w-1")
    finally:
        running.stop(0.5)
    with service_engine.connect() as conn:
        outcomes = conn.execute(text("SELECT job, outcome FROM job_claims")).all()
    assert outcomes and all(o.startswith("ok") for _, o in outcomes), outcomes

    issued = token_repo.create(service_engine, "svc", Role.ADMIN)
    record = token_repo.find_active(service_engine, issued.token)
    assert record is not None
    token_repo.touch(service_engine, record.id)
    token_repo.revoke(service_engine, "svc")


@pytest.mark.parametrize(
    "statement",
    [
        "CREATE TABLE public.intruder (x int)",
        "ALTER TABLE public.workloads ADD COLUMN intruder int",
        "DROP TABLE public.api_tokens",
        "UPDATE public.alembic_version SET version_num = '0001'",
        "DELETE FROM public.alembic_version",
    ],
)
def test_the_service_role_may_not_change_the_schema(service_url: str, statement: str) -> None:
    with psycopg.connect(libpq(service_url)) as conn:
        assert conn.execute("SELECT count(*) FROM alembic_version").fetchone() == (1,)
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute(statement)


def test_downgrade_keeps_the_role_and_upgrade_grants_again(pg_server: Database) -> None:
    with scratch_database(pg_server.url) as url:
        migrate.upgrade(url)
        command.downgrade(migrate.alembic_config(url), "0005")
        with psycopg.connect(libpq(url)) as conn:
            assert conn.execute(
                "SELECT count(*) FROM pg_roles WHERE rolname = %s", (SERVICE,)
            ).fetchone() == (1,)
            assert conn.execute(
                "SELECT has_table_privilege(%s, 'public.workloads', 'INSERT')", (SERVICE,)
            ).fetchone() == (False,)
            assert conn.execute("SELECT to_regclass('public.api_tokens')").fetchone() == (None,)
        migrate.upgrade(url)  # the role exists now: created only if missing
        with psycopg.connect(libpq(url)) as conn:
            for table, privilege in [
                ("public.workloads", "INSERT"),
                ("public.api_tokens", "UPDATE"),
                ("public.alembic_version", "SELECT"),
                ("report.usage_daily", "SELECT"),
            ]:
                assert conn.execute(
                    "SELECT has_table_privilege(%s, %s, %s)", (SERVICE, table, privilege)
                ).fetchone() == (True,), (table, privilege)
            assert conn.execute(
                "SELECT has_table_privilege(%s, 'public.alembic_version', 'UPDATE')", (SERVICE,)
            ).fetchone() == (False,)
