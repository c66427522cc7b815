"""Every SQL example of the README's "Reporting with SQL" section runs as written: queries with
the reporter role's rights alone, setup statements as the database owner, each in a transaction
that is rolled back."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from report_support import add_budget, add_scenario
from sqlalchemy import Engine
from sqlalchemy.engine import make_url

README = Path(__file__).resolve().parents[1] / "README.md"
SECTION = "## Reporting with SQL"


def sql_examples() -> list[str]:
    text = README.read_text()
    start = text.index(SECTION) + len(SECTION)
    end = text.find("\n## ", start)
    section = text[start : end if end != -1 else len(text)]
    return re.findall(r"```sql\n(.*?)```", section, flags=re.DOTALL)


def is_query(sql: str) -> bool:
    return sql.lstrip().split(None, 1)[0].upper() in {"SELECT", "WITH"}


@pytest.fixture
def conn(db: Engine, database_url: str) -> Iterator[psycopg.Connection[tuple[object, ...]]]:
    with db.begin() as c:
        add_scenario(c)
        add_budget(c, "research", "week", 1000)
        add_budget(c, "team-a", "month", 2000, pool="main")
    url = make_url(database_url).set(drivername="postgresql").render_as_string(False)
    with psycopg.connect(url) as connection:
        yield connection


def test_the_section_has_queries_and_setup() -> None:
    examples = sql_examples()
    assert sum(is_query(e) for e in examples) >= 5
    assert any("GRANT gpufair_reporter" in e for e in examples)


@pytest.mark.parametrize("example", sql_examples(), ids=lambda e: " ".join(e.split())[:40])
def test_example_runs_as_written(
    conn: psycopg.Connection[tuple[object, ...]], example: str
) -> None:
    try:
        if is_query(example):
            conn.execute("SET LOCAL ROLE gpufair_reporter")
        cursor = conn.execute(example)
        if is_query(example):
            assert cursor.description is not None
            cursor.fetchall()
    finally:
        conn.rollback()


def test_past_instant_example_shows_the_budgets(
    conn: psycopg.Connection[tuple[object, ...]],
) -> None:
    (example,) = [e for e in sql_examples() if "budget_status_at(" in e]
    try:
        conn.execute("SET LOCAL ROLE gpufair_reporter")
        rows = conn.execute(example).fetchall()
    finally:
        conn.rollback()
    assert {(r[0], r[1], r[2]) for r in rows} == {
        ("research", None, "week"),  # NULL: a budget of all pools
        ("team-a", "main", "month"),
    }
    research = next(r for r in rows if r[0] == "research")
    assert research[3] == 540  # the scenario's research subtree at Wednesday 2026-03-04 12:00


def test_the_compose_database_is_named_at_its_published_port() -> None:
    """The section says where Docker Compose publishes PostgreSQL: the host port of the
    docker-compose.yml `postgres` service."""
    import yaml

    text = README.read_text()
    start = text.index(SECTION)
    section = text[start : text.find("\n## ", start + len(SECTION))]
    compose = yaml.safe_load((README.parent / "docker-compose.yml").read_text())
    (published,) = compose["services"]["postgres"]["ports"]
    host, port, _ = published.rsplit(":", 2)
    said = re.search(r"with Docker Compose, `([\d.]+:\d+)`", section)
    assert said is not None and said.group(1) == f"{host}:{port}" == "127.0.0.1:5433"
