"""Ledger.GetUsage (api/usage.get_usage) over a real gRPC channel on PostgreSQL, with the
hand-computed scenario of tests/report_support.py and budgets at a pinned instant."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime

import grpc
import pytest
from google.protobuf.timestamp_pb2 import Timestamp
from report_support import DAY, HOUR, MONTH, WEEK, add_budget, add_scenario, usage_server
from sqlalchemy import Engine, text

from gpufair.client import GpufairClient, field_violations
from gpufair.v1 import ledger_pb2


@pytest.fixture
def usage_client(db: Engine) -> Iterator[GpufairClient]:
    with db.begin() as conn:
        add_scenario(conn)
        add_budget(conn, "team-a", "week", 1000)
        add_budget(conn, "research", "month", 100_000)
        add_budget(conn, "vision-train", "week", 15, pool="spot")
    with usage_server(db) as address, GpufairClient(address, timeout_s=20, attempts=1) as c:
        yield c


def utc(ts: Timestamp) -> datetime:
    return ts.ToDatetime(tzinfo=UTC)


def test_weekly_usage_per_type_with_budgets(usage_client: GpufairClient) -> None:
    reply = usage_client.get_usage(period=ledger_pb2.USAGE_PERIOD_WEEK)
    assert [
        (utc(r.period_start), r.pool, r.queue, r.gpu_type, r.gpu_hours, r.cu_hours)
        for r in reply.rows
    ] == [
        (WEEK, "main", "ops", "a100", 1, 10),
        (WEEK, "main", "team-a", "a100", 50, 500),
        (WEEK, "main", "vision-train", "v100", 5, 20),
        (WEEK, "spot", "vision-train", "rtx4090", 10, 20),
    ]
    assert reply.rows[1].over_quota_cu_hours == 80

    by_queue = {(b.queue, b.pool, b.period): b for b in reply.budgets}
    assert set(by_queue) == {
        ("research", "", "month"),
        ("team-a", "", "week"),
        ("vision-train", "spot", "week"),
    }
    team_a = by_queue["team-a", "", "week"]
    assert utc(team_a.period_start) == WEEK
    assert (team_a.budget_cu_hours, team_a.consumed_cu_hours, team_a.remaining_cu_hours) == (
        1000,
        500,
        500,
    )
    assert team_a.burn_cu_hours_per_day == pytest.approx(200)
    assert utc(team_a.projected_exhaustion) == WEEK + 5 * DAY
    # research: 540 CU-hours over 3.5 days of March; 100,000 lasts far beyond the month.
    research = by_queue["research", "", "month"]
    assert utc(research.period_start) == MONTH
    assert research.consumed_cu_hours == 540
    assert not research.HasField("projected_exhaustion")
    spot = by_queue["vision-train", "spot", "week"]
    assert spot.remaining_cu_hours == -5
    assert utc(spot.projected_exhaustion) == WEEK + DAY + 12 * HOUR + HOUR * 3 / 4


def test_daily_is_the_default_and_filters_select(usage_client: GpufairClient) -> None:
    reply = usage_client.get_usage()
    assert sorted({utc(r.period_start) for r in reply.rows}) == [WEEK, WEEK + DAY]

    research = usage_client.get_usage(queue="research", period=ledger_pb2.USAGE_PERIOD_MONTH)
    assert [(r.queue, r.cu_hours) for r in research.rows] == [
        ("team-a", 500),
        ("vision-train", 20),
        ("vision-train", 20),
    ]
    assert {b.queue for b in research.budgets} == {"research", "team-a", "vision-train"}

    spot = usage_client.get_usage(pool="spot")
    assert [(r.queue, r.gpu_type) for r in spot.rows] == [("vision-train", "rtx4090")]
    # Budgets of that pool, and those of all pools (they count this pool too).
    assert {(b.queue, b.pool) for b in spot.budgets} == {
        ("research", ""),
        ("team-a", ""),
        ("vision-train", "spot"),
    }

    # since inside Tuesday: Tuesday's whole day; until is exclusive.
    tuesday = usage_client.get_usage(since=WEEK + DAY + 10 * HOUR, until=WEEK + 2 * DAY)
    assert {utc(r.period_start) for r in tuesday.rows} == {WEEK + DAY}
    monday = usage_client.get_usage(until=WEEK + DAY)
    assert {utc(r.period_start) for r in monday.rows} == {WEEK}


def test_a_deleted_queue_still_reports(usage_client: GpufairClient, db: Engine) -> None:
    # Ledger names are history: a queue gone from the config keeps its rows.
    with db.begin() as conn:
        conn.execute(text("DELETE FROM budgets WHERE queue = 'ops'"))
        conn.execute(text("DELETE FROM queues WHERE name = 'ops'"))
    assert [r.cu_hours for r in usage_client.get_usage(queue="ops").rows] == [10]


def invalid(client: GpufairClient, request: ledger_pb2.GetUsageRequest) -> list[tuple[str, str]]:
    with pytest.raises(grpc.RpcError) as caught:
        client.call(client.ledger.GetUsage, request)
    assert isinstance(caught.value, grpc.Call)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    return field_violations(caught.value)


def test_bad_requests_are_invalid_argument_with_field_violations(
    usage_client: GpufairClient,
) -> None:
    violations = invalid(usage_client, ledger_pb2.GetUsageRequest(period=7))  # type: ignore[arg-type]
    assert [f for f, _ in violations] == ["period"]

    request = ledger_pb2.GetUsageRequest()
    request.since.FromDatetime(WEEK + DAY)
    request.until.FromDatetime(WEEK)
    assert [f for f, _ in invalid(usage_client, request)] == ["until"]

    request = ledger_pb2.GetUsageRequest()
    request.since.seconds = 10**13  # far beyond year 9999
    assert [f for f, _ in invalid(usage_client, request)] == ["since"]


def test_unknown_names_are_not_found(usage_client: GpufairClient) -> None:
    for kwargs in ({"queue": "nope"}, {"pool": "nope"}):
        with pytest.raises(grpc.RpcError) as caught:
            usage_client.get_usage(**kwargs)
        assert isinstance(caught.value, grpc.Call)
        assert caught.value.code() == grpc.StatusCode.NOT_FOUND


def test_too_many_rows_is_refused(
    usage_client: GpufairClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gpufair.api import usage

    monkeypatch.setattr(usage, "MAX_ROWS", 3)
    assert [f for f, _ in invalid(usage_client, ledger_pb2.GetUsageRequest())] == ["since"]
    assert len(usage_client.get_usage(period=ledger_pb2.USAGE_PERIOD_WEEK, pool="main").rows) == 3
