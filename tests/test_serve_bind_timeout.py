"""`gpufair serve --bind-timeout`: a placement handed out by `Schedule` and never confirmed by a
`started` event is released after the configured time, not the default 300 s
(store/schedule_repo.py). Through a real server process: the option reaches the scheduler."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest
from serve_support import ServeProcess
from sqlalchemy import create_engine, text

from gpufair.client import GpufairClient
from gpufair.config_file import parse_config
from gpufair.store.database import Database, normalise_url
from gpufair.store.scratch import scratch_database
from gpufair.v1 import scheduler_pb2

CLUSTER = {
    "gpu_types": [{"name": "a100", "memory_gib": 80, "compute_weight": 1}],
    "pools": [{"name": "main"}],
    "nodes": [{"name": "n0", "pool": "main", "gpu_type": "a100", "gpu_count": 8}],
    "queues": [{"name": "q", "quotas": [{"pool": "main", "deserved_cu": 8}]}],
}
TIMEOUT_S = 3.0


@pytest.fixture
def database_url(pg_server: Database) -> Iterator[str]:
    with scratch_database(pg_server.url) as url:
        yield url


def _bound(url: str) -> tuple[str, datetime | None, datetime | None]:
    engine = create_engine(normalise_url(url))
    try:
        with engine.connect() as conn:
            row = conn.execute(
                text("SELECT state, bound_at, bind_expires_at FROM workloads WHERE uid = 'w1'")
            ).one()
    finally:
        engine.dispose()
    return row.state, row.bound_at, row.bind_expires_at


def test_an_unconfirmed_binding_is_released_at_the_configured_timeout(
    database_url: str, tmp_path: Path
) -> None:
    env = {k: v for k, v in os.environ.items() if k != "GPUFAIR_DATABASE_URL"}
    args = ["--database-url", database_url, "--grace-s", "1", "--no-jobs", "--processes", "1"]
    server = ServeProcess([*args, "--bind-timeout", f"{TIMEOUT_S:g}"], env, tmp_path / "s.log")
    try:
        server.wait_serving()
        with GpufairClient(server.address, attempts=1) as client:
            client.apply_config(parse_config(CLUSTER))
            workload = scheduler_pb2.Workload(uid="w1", queue="q", pool="main", pods=1)
            workload.gpus_per_pod = 8
            client.submit_workloads([workload])
            first = client.schedule("main")
            assert [b.uid for b in first.binds] == ["w1"]
            state, bound_at, expires_at = _bound(database_url)
            assert state == "bound" and bound_at is not None and expires_at is not None
            assert (expires_at - bound_at).total_seconds() == TIMEOUT_S  # not 300
            # Cycles every 0.2 s: the binding holds until its timeout, and the first cycle
            # after it releases the workload and places it again (nothing else wants the node).
            rebound = None
            for _ in range(int(10 * TIMEOUT_S)):
                time.sleep(0.2)
                reply = client.schedule("main")
                if reply.binds:
                    rebound = reply
                    break
                assert _bound(database_url)[0] == "bound"
            assert rebound is not None, "the binding was not released"
            assert [b.uid for b in rebound.binds] == ["w1"]
            _, again_at, _ = _bound(database_url)
            assert again_at is not None
            held_s = (again_at - bound_at).total_seconds()
            assert TIMEOUT_S <= held_s < TIMEOUT_S + 1.0
    finally:
        assert server.terminate() == 0
