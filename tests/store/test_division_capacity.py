"""`capacity_repo.division_capacity` on PostgreSQL: what the fair share divides while nodes are
drained with work on them, against `capacity_now` (ready nodes only, what the capacity history
and the capacity metrics count).

Pool `main`: r1 and d1, 8 `unit` GPUs each (1 CU), and d2, the pool's only `big` node, 4 GPUs
of 10 CU. On d1 run a 3-GPU pod and half of a shared GPU; on d2 a 4-GPU pod; on r1 a 2-GPU pod.
"""

from __future__ import annotations

import time

from sqlalchemy import Engine

from gpufair.client import GpufairClient
from gpufair.config_file import parse_config
from gpufair.store import capacity_repo
from gpufair.v1 import scheduler_pb2
from tests.api.ledger_support import NODE_CAPACITY, STARTED, STOPPED, STORED, event, report

NOW = time.time() - 600.0  # the server refuses events from its future


def _node(name: str, gpu_type: str, gpus: int) -> dict[str, object]:
    return {
        "name": name,
        "pool": "main",
        "gpu_type": gpu_type,
        "gpu_count": gpus,
        "cpu_millicores": 64000,
        "memory_mib": 524288,
    }


CONFIG = {
    "gpu_types": [
        {"name": "unit", "memory_gib": 40, "compute_weight": 1},
        {"name": "big", "memory_gib": 80, "compute_weight": 10},
    ],
    "pools": [{"name": "main"}],
    "nodes": [_node("r1", "unit", 8), _node("d1", "unit", 8), _node("d2", "big", 4)],
    "queues": [{"name": "q", "quotas": [{"pool": "main", "deserved_cu": 0}]}],
}

# uid: (GPUs per pod, pods as (node, indices, fraction))
WORK = {
    "three": (3.0, [("d1", [0, 1, 2], 1.0)]),
    "half": (0.5, [("d1", [3], 0.5)]),
    "four": (4.0, [("d2", [0, 1, 2, 3], 1.0)]),
    "ready": (2.0, [("r1", [0, 1], 1.0)]),
}


def _set_up(client: GpufairClient) -> None:
    client.apply_config(parse_config(CONFIG))
    reply = client.call(
        client.scheduler.SubmitWorkloads,
        scheduler_pb2.SubmitWorkloadsRequest(
            workloads=[
                scheduler_pb2.Workload(uid=uid, queue="q", pool="main", pods=1, gpus_per_pod=gpus)
                for uid, (gpus, _pods) in WORK.items()
            ]
        ),
    )
    assert all(r.accepted for r in reply.results), reply
    started = [event(STARTED, uid, NOW, pods) for uid, (_gpus, pods) in WORK.items()]
    results = report(client, *started)
    assert {r.status for r in results} == {STORED}, results


def _both(db: Engine, names: list[str]) -> tuple[object, object]:
    with db.connect() as conn:
        return (
            capacity_repo.division_capacity(conn, "main", names),
            capacity_repo.capacity_now(conn)["main"],
        )


def test_drained_nodes_count_what_their_running_work_holds(
    client: GpufairClient, db: Engine
) -> None:
    _set_up(client)
    assert _both(db, []) == ((56.0, {"big": 4.0, "unit": 16.0}),) * 2
    client.set_nodes_ready(["d1", "d2"], False)
    # d1: 3 GPUs and half a shared one (not its 4.5 free GPUs); d2: all 4 (40 CU), so the type
    # stays. Ready nodes only: r1's 8 GPUs.
    assert _both(db, ["d1", "d2"]) == ((51.5, {"big": 4.0, "unit": 11.5}), (8.0, {"unit": 8.0}))
    # d2 reported with 2 usable GPUs: never more than that, though its work holds 4 indices.
    msg = event(NODE_CAPACITY, "", time.time())
    msg.node = "d2"
    msg.gpu_count = 2
    results = report(client, msg)
    assert [r.status for r in results] == [STORED], results
    assert _both(db, ["d1", "d2"])[0] == (31.5, {"big": 2.0, "unit": 11.5})
    # The half-GPU pod ends: d1 counts its 3 busy GPUs.
    assert [r.status for r in report(client, event(STOPPED, "half", NOW + 3))] == [STORED]
    assert _both(db, ["d1", "d2"])[0] == (31.0, {"big": 2.0, "unit": 11.0})
    # d1 ready again, named by a caller that still thinks it drained: counted once, whole.
    client.set_nodes_ready(["d1"], True)
    assert _both(db, ["d1", "d2"])[0] == (36.0, {"big": 2.0, "unit": 16.0})
    # The work on d2 ends: nothing holds it, the type leaves the division.
    assert [r.status for r in report(client, event(STOPPED, "four", NOW + 4))] == [STORED]
    assert _both(db, ["d2"]) == ((16.0, {"unit": 16.0}),) * 2
