"""GetUsage with include_open_hour: the open UTC hour so far, from the raw runs, in rows marked
partial after the closed hours, with the instant it was counted up to; filters apply to it."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from gpufair import client as sdk
from gpufair.client import GpufairClient
from gpufair.config_file import load_config_file
from gpufair.v1 import ledger_pb2, scheduler_pb2

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "clusters"


def test_the_open_hour_is_counted_and_marked(client: GpufairClient) -> None:
    client.apply_config(load_config_file(EXAMPLES / "llm-vs-vision.yaml"))
    client.submit_workloads(
        [scheduler_pb2.Workload(uid="j-1", queue="llm", pool="default", pods=3, gpus_per_pod=4)]
    )
    (bind,) = client.schedule("default").binds
    now = time.time()
    hour_start = now - now % 3600
    started_at = max(hour_start, now - 120)
    client.report_events([sdk.started("j-1", bind.pods, at=started_at)])

    closed_only = client.get_usage()
    assert list(closed_only.rows) == []  # nothing closed and rolled up yet

    reply = client.get_usage(include_open_hour=True, period=ledger_pb2.USAGE_PERIOD_WEEK)
    (row,) = reply.rows
    as_of = reply.as_of.ToDatetime(tzinfo=UTC).timestamp()
    assert row.partial and (row.pool, row.queue, row.gpu_type) == ("default", "llm", "h100-80gb")
    assert row.gpu_hours == pytest.approx(12 * (as_of - started_at) / 3600, rel=1e-6)
    assert row.cu_hours == pytest.approx(row.gpu_hours)
    # llm deserves 30 CU and holds 12: nothing over its quota.
    assert row.over_quota_cu_hours == 0
    # The row sits in its period (here the ISO week) like the closed ones.
    day = datetime.fromtimestamp(hour_start, UTC).replace(hour=0)
    assert row.period_start.ToDatetime(tzinfo=UTC) == day - timedelta(days=day.weekday())

    assert list(client.get_usage(include_open_hour=True, queue="vision").rows) == []
    past = datetime.fromtimestamp(hour_start - 7200, UTC)
    assert list(client.get_usage(include_open_hour=True, until=past).rows) == []
    later = datetime.fromtimestamp(time.time() + 60, UTC)  # after the instant counted up to
    assert list(client.get_usage(include_open_hour=True, since=later).rows) == []
    earlier = datetime.fromtimestamp(started_at, UTC)  # inside the open hour: it overlaps
    (row,) = client.get_usage(include_open_hour=True, since=earlier).rows
    assert row.partial and row.queue == "llm"
