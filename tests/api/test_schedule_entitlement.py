"""Gang entitlement over gRPC on PostgreSQL (issue 20): the burst case end to end. 16 GPUs, three
equal queues; a and b have held all 16 GPUs with 1-GPU jobs for 20 minutes (the ledger says so),
then c submits a 12-GPU gang. Time-based fair share gives c at most 2/3 of the pool (10.67 GPUs):
the gang is blocked by c's share alone. Past `gang_reservation_after_s` the Schedule call evicts
12 GPUs of a's and b's work for it, with EVICT_REASON_ENTITLEMENT; with the pool's
`gang_entitlement` off it does not.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from sqlalchemy import Engine
from test_schedule import Clock, schedule, start_binds, submit, workload

from gpufair.api.server import build_server
from gpufair.client import GpufairClient
from gpufair.config_file import parse_config
from gpufair.v1 import scheduler_pb2


@pytest.fixture
def clock() -> Clock:
    return Clock(time.time())


@pytest.fixture
def gpufair(db: Engine, clock: Clock) -> Iterator[GpufairClient]:
    running = build_server(db, "127.0.0.1:0", max_workers=4, clock=clock)
    try:
        with GpufairClient(f"127.0.0.1:{running.port}", attempts=1, timeout_s=60) as c:
            yield c
    finally:
        running.stop(0.5)


def _config(entitlement: bool) -> dict[str, object]:
    node = {"pool": "default", "gpu_type": "a100-80gb", "gpu_count": 8}
    node |= {"cpu_millicores": 128000, "memory_mib": 1048576}
    return {
        "gpu_types": [{"name": "a100-80gb", "memory_gib": 80, "compute_weight": 1}],
        "pools": [
            {
                "name": "default",
                "gang_reservation_after_s": 600,
                "gang_entitlement": entitlement,
                "policy": {"window_kind": "sliding", "window_s": "7d", "k": 1.0},
            }
        ],
        "queues": [
            {"name": name, "quotas": [{"pool": "default", "over_quota_weight": 1}]}
            for name in ("a", "b", "c")
        ],
        "nodes": [{"name": "n1", **node}, {"name": "n2", **node}],
    }


@pytest.mark.parametrize("entitlement", [True, False])
def test_the_burst_gang_takes_12_gpus_beyond_its_share_only_with_entitlement(
    gpufair: GpufairClient, clock: Clock, entitlement: bool
) -> None:
    gpufair.apply_config(parse_config(_config(entitlement)))
    start = clock.now_s
    submit(gpufair, *(workload(f"{q}-{i}", q, 1) for q in ("a", "b") for i in range(8)))
    first = schedule(gpufair)
    assert len(first.binds) == 16
    start_binds(gpufair, first, start)

    clock.now_s = start + 600.0
    submit(gpufair, workload("c-gang", "c", 12, min_pods=12))
    early = schedule(gpufair)  # not waited 600 s yet
    assert early.evicts == [] and early.binds == []
    (waiting,) = [p for p in early.pending if p.uid == "c-gang"]
    assert waiting.reason_code == "over_fair_share"

    clock.now_s = start + 1200.0
    reply = schedule(gpufair)
    shares = {s.queue: s.fair_share_cu for s in gpufair.get_fair_share("default").queues}
    assert shares["c"] == pytest.approx(32 / 3, abs=0.01)  # at most 2/3 of 16: the gang is 12
    if not entitlement:
        assert reply.evicts == []
        return
    assert len(reply.evicts) == 12
    assert {e.reason for e in reply.evicts} == {scheduler_pb2.EVICT_REASON_ENTITLEMENT}
    assert {e.in_favour_of for e in reply.evicts} == {"c-gang"}
    (held,) = [p for p in reply.pending if p.uid == "c-gang"]
    assert held.reason_code == "waiting_for_evicted_capacity"
