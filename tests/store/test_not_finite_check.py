"""The recompute's check for runs that are not finite (`data_checks.nonfinite_history`) counts
exactly the pool's runs in the window whose GPUs or CU are infinite or NaN, and finds them
through their partial index (migration 0019), not by reading the pool's whole history."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import Connection, Engine, text

from gpufair.store import data_checks

T0 = 1_767_225_600.0  # 2026-01-01 00:00 UTC
HOUR = 3600.0
SINCE = T0 + 1_000 * HOUR


@pytest.fixture
def conn(db: Engine) -> Iterator[Connection]:
    with db.connect() as connection:
        yield connection
        connection.rollback()


def add_run(
    conn: Connection, pool: str, start: float, end: float | None, gpus: float, cu: float
) -> None:
    conn.execute(
        text(
            "INSERT INTO allocation_intervals (workload_uid, start_event_id, queue, pool, "
            "gpu_type, gpus, cu, started_at, ended_at, pods) VALUES ('w', gen_random_uuid(), "
            "'q', :pool, 'a100', :gpus, :cu, to_timestamp(:s), to_timestamp(:e), '[]')"
        ),
        {"pool": pool, "gpus": gpus, "cu": cu, "s": start, "e": end},
    )


def finite_history(conn: Connection, runs: int) -> None:
    """`runs` finite runs of pool p, one an hour from T0, each two hours long."""
    conn.execute(
        text(
            "INSERT INTO allocation_intervals (workload_uid, start_event_id, queue, pool, "
            "gpu_type, gpus, cu, started_at, ended_at, pods) SELECT 'w' || g, "
            "gen_random_uuid(), 'q', 'p', 'a100', 4, 40, to_timestamp(:t0 + g * 3600), "
            "to_timestamp(:t0 + g * 3600 + 7200), '[]' FROM generate_series(1, :n) AS g"
        ),
        {"t0": T0, "n": runs},
    )


def plan_nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from plan_nodes(child)


def test_counts_the_windows_runs_that_are_not_finite_and_nothing_else(conn: Connection) -> None:
    finite_history(conn, 2_000)
    inf, nan = float("inf"), float("nan")
    add_run(conn, "p", SINCE - 10 * HOUR, SINCE + HOUR, 4, inf)  # ends in the window: counted
    add_run(conn, "p", SINCE + HOUR, None, nan, 10)  # open: counted
    add_run(conn, "p", SINCE - 2 * HOUR, SINCE, 1, inf)  # ends as the window starts: counted
    add_run(conn, "p", SINCE - 5 * HOUR, SINCE - HOUR, inf, inf)  # ended before: not counted
    add_run(conn, "other", SINCE, None, 4, inf)  # another pool: not counted
    assert data_checks.nonfinite_history(conn, "p", SINCE) == [
        "pool 'p': 3 stored run(s) in the usage window have a GPU or CU amount that is not "
        "finite; they are skipped as no usage"
    ]
    assert data_checks.nonfinite_history(conn, "other", SINCE) == [
        "pool 'other': 1 stored run(s) in the usage window have a GPU or CU amount that is not "
        "finite; they are skipped as no usage"
    ]
    assert data_checks.nonfinite_history(conn, "p", SINCE + 2 * HOUR) == [
        "pool 'p': 1 stored run(s) in the usage window have a GPU or CU amount that is not "
        "finite; they are skipped as no usage"
    ]
    assert data_checks.nonfinite_history(conn, "empty", SINCE) == []


def test_the_runs_count_reads_the_partial_index_not_the_history(conn: Connection) -> None:
    finite_history(conn, 20_000)
    add_run(conn, "p", SINCE, None, 4, float("inf"))
    conn.execute(text("ANALYZE allocation_intervals"))
    # The recompute runs the check as a prepared statement: its generic plan must use the
    # index too, so both a custom and a generic plan are asked for.
    for mode in ("force_custom_plan", "force_generic_plan"):
        conn.execute(text(f"SET LOCAL plan_cache_mode = {mode}"))
        sql = f"EXPLAIN (FORMAT JSON) {data_checks.HISTORY_SQL.text}"
        [[found]] = conn.execute(text(sql), {"pool": "p", "since": SINCE}).all()
        nodes = list(
            plan_nodes((found if isinstance(found, list) else json.loads(found))[0]["Plan"])
        )
        on_runs = [n for n in nodes if n.get("Relation Name") == "allocation_intervals"]
        assert [(n["Node Type"], n.get("Index Name")) for n in on_runs] in (
            [("Index Scan", "ix_allocation_intervals_not_finite")],
            [("Bitmap Heap Scan", None)],
        ), (mode, on_runs)
        bitmap = [n.get("Index Name") for n in nodes if n["Node Type"] == "Bitmap Index Scan"]
        if on_runs[0]["Node Type"] == "Bitmap Heap Scan":
            assert bitmap == ["ix_allocation_intervals_not_finite"], (mode, nodes)
