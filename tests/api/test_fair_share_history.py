"""GetFairShareHistory over gRPC: the range a caller asks for is the range it gets, whole or
refused, and a name that means nothing is NOT_FOUND rather than an empty history."""

from __future__ import annotations

import time

import grpc
import pytest
from google.protobuf.timestamp_pb2 import Timestamp
from sqlalchemy import Engine, text

from gpufair.api import ledger
from gpufair.client import GpufairClient, field_violations
from gpufair.v1 import ledger_pb2 as lpb
from tests.api.ledger_support import cluster

DAY = 86400


def _run_days_ago(db: Engine, days: float) -> None:
    """A copy of pool main's latest run, dated `days` ago."""
    with db.begin() as conn:
        run = conn.execute(
            text(
                "INSERT INTO fair_share_runs (pool, computed_at, capacity_cu, config_version) "
                "SELECT pool, now() - make_interval(secs => :ago), capacity_cu, config_version "
                "FROM fair_share_runs WHERE pool = 'main' ORDER BY id DESC LIMIT 1 RETURNING id"
            ),
            {"ago": days * DAY},
        ).scalar_one()
        conn.execute(
            text(
                "INSERT INTO fair_share_history SELECT :run, h.queue, h.pool, r.computed_at, "
                "h.parent, h.priority, h.deserved_cu, h.demand_cu, h.limit_cu, h.allocated_cu, "
                "h.weight_share, h.usage_share, h.priority_weight, h.effective_weight, "
                "h.fair_share_cu, h.decayed_usage_cu_s, h.fair_share_gpus_by_type "
                "FROM fair_share_history h, fair_share_runs r "
                "WHERE r.id = :run AND h.run_id = (SELECT min(id) FROM fair_share_runs)"
            ),
            {"run": run},
        )


def _history(client: GpufairClient, **fields: object) -> lpb.GetFairShareHistoryResponse:
    request = lpb.GetFairShareHistoryRequest(pool="main")
    for name, value in fields.items():
        if isinstance(value, Timestamp):
            getattr(request, name).CopyFrom(value)
        else:
            setattr(request, name, value)
    return client.call(client.ledger.GetFairShareHistory, request)


def _days_back(points: lpb.GetFairShareHistoryResponse) -> list[int]:
    now = time.time()
    return sorted({round((now - p.computed_at.seconds) / DAY) for p in points.points})


@pytest.fixture
def three_runs(client: GpufairClient, db: Engine) -> None:
    """Pool main's fair share computed now, and copies of it 3 and 10 days ago."""
    client.apply_config(cluster())
    client.get_fair_share("main")
    _run_days_ago(db, 3)
    _run_days_ago(db, 10)


@pytest.mark.usefixtures("three_runs")
def test_since_the_epoch_is_all_history_not_the_default_day(client: GpufairClient) -> None:
    assert _days_back(_history(client)) == [0]  # unset: the last day
    assert _days_back(_history(client, since=Timestamp(seconds=0))) == [0, 3, 10]


@pytest.mark.usefixtures("three_runs")
def test_until_alone_is_the_day_before_it(client: GpufairClient) -> None:
    until = Timestamp(seconds=int(time.time() - 2.5 * DAY))
    assert _days_back(_history(client, until=until)) == [3]


@pytest.mark.usefixtures("three_runs")
def test_more_points_than_a_reply_holds_are_refused_not_cut_short(
    client: GpufairClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ledger, "MAX_HISTORY_POINTS", 5)  # 3 runs x 2 queues = 6 points
    everything = Timestamp(seconds=0)
    with pytest.raises(grpc.RpcError) as err:
        _history(client, since=everything)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    [(field, message)] = field_violations(err.value)
    assert field == "since" and "more than 5 points" in message
    assert len(_history(client, since=everything, queue="llm").points) == 3  # narrowed: whole


@pytest.mark.usefixtures("three_runs")
def test_an_unknown_pool_or_queue_is_not_found(client: GpufairClient) -> None:
    for fields in ({"pool": "mian"}, {"queue": "lmm"}):
        with pytest.raises(grpc.RpcError) as err:
            _history(client, **fields)
        assert err.value.code() == grpc.StatusCode.NOT_FOUND, fields
    # Known, with no point in the range: an empty history.
    assert list(_history(client, until=Timestamp(seconds=DAY)).points) == []


@pytest.mark.usefixtures("three_runs")
def test_a_deleted_queue_keeps_its_history(client: GpufairClient) -> None:
    config = cluster()
    del config.queues[1]  # vision
    client.apply_config(config)
    assert {p.share.queue for p in _history(client, queue="vision").points} == {"vision"}
