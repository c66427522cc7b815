"""Writes that two actors make at once, run against each other many times through a real server:
no call fails (never INTERNAL, nor any other error), and the totals come out right.

- Submissions of overlapping batches, in any order (workload_repo.submit inserts in uid order).
- Attempts of one request id at once (api/idempotent.py: one reply, one effect).
- Schedule calls, recomputes, rollups and job claims of one pool, from two "replicas".
- `started` events on GPUs of the batch system's choosing while cycles bind (bind_overlaps.py).
"""

from __future__ import annotations

import random
import threading
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from sqlalchemy import Engine, text

from gpufair.api.server import RunningServer
from gpufair.client import GpufairClient
from gpufair.config_file import parse_config
from gpufair.jobs.runner import JobSettings, PeriodicJobs
from gpufair.services.recompute import recompute_pool
from gpufair.v1 import ledger_pb2, scheduler_pb2

NODES = 4
CLUSTER = {
    "gpu_types": [{"name": "a100", "memory_gib": 80, "compute_weight": 1}],
    "pools": [{"name": "main", "policy": {"recompute_interval_s": 1}}],
    "nodes": [
        {
            "name": f"n{i}",
            "pool": "main",
            "gpu_type": "a100",
            "gpu_count": 8,
            "cpu_millicores": 64000,
            "memory_mib": 524288,
        }
        for i in range(NODES)
    ],
    "queues": [
        {"name": "a", "quotas": [{"pool": "main", "deserved_cu": 16}]},
        {"name": "b", "quotas": [{"pool": "main", "deserved_cu": 16}]},
    ],
}


def one_gpu(uid: str, queue: str = "a") -> scheduler_pb2.Workload:
    return scheduler_pb2.Workload(uid=uid, queue=queue, pool="main", pods=1, gpus_per_pod=1)


def hammer(threads: int, rounds: int, work: Callable[[int, int], None]) -> list[BaseException]:
    """Run work(thread, round) from `threads` threads started together; the exceptions raised."""
    errors: list[BaseException] = []
    start = threading.Barrier(threads)

    def run(t: int) -> None:
        start.wait()
        for r in range(rounds):
            try:
                work(t, r)
            except Exception as exc:
                errors.append(exc)

    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(run, range(threads)))
    return errors


def test_overlapping_submissions_in_any_order_all_succeed(
    client: GpufairClient, db: Engine, server: RunningServer
) -> None:
    client.apply_config(parse_config(CLUSTER))
    uids = [f"w{i:03}" for i in range(60)]
    address = f"127.0.0.1:{server.port}"
    accepted = Counter[str]()

    def submit(t: int, r: int) -> None:
        batch = random.Random(t * 1000 + r).sample(uids, 40)  # shuffled: any order
        with GpufairClient(address, attempts=1, timeout_s=30) as c:
            reply = c.submit_workloads([one_gpu(u) for u in batch])
        assert [x.uid for x in reply.results if not x.accepted] == []
        accepted.update(x.uid for x in reply.results)

    errors = hammer(8, 12, submit)

    assert errors == []
    assert sum(accepted.values()) == 8 * 12 * 40
    with db.connect() as conn:
        stored = conn.execute(text("SELECT count(*), count(DISTINCT uid) FROM workloads")).one()
    assert tuple(stored) == (len(accepted), len(accepted))


def test_attempts_of_one_request_id_at_once_have_one_reply_and_one_effect(
    client: GpufairClient, db: Engine, server: RunningServer
) -> None:
    client.apply_config(parse_config(CLUSTER))
    client.submit_workloads([one_gpu(f"c{i}") for i in range(10)])
    address = f"127.0.0.1:{server.port}"
    replies: dict[str, list[bytes]] = defaultdict(list)

    def cancel(t: int, r: int) -> None:
        # Round r: 6 attempts of one cancellation, all at once (a client retrying early).
        with GpufairClient(address, attempts=1, timeout_s=30) as c:
            reply = c.scheduler.CancelWorkload(
                scheduler_pb2.CancelWorkloadRequest(uid=f"c{r}", request_id=f"cancel-c{r}"),
                timeout=30,
            )
        replies[f"c{r}"].append(reply.SerializeToString())

    errors = hammer(6, 10, cancel)

    assert errors == []
    for uid, got in replies.items():
        assert len(got) == 6
        assert set(got) == {
            scheduler_pb2.CancelWorkloadResponse(
                was_pending=True, previous_state="pending"
            ).SerializeToString()
        }, uid
    with db.connect() as conn:
        states = Counter(conn.execute(text("SELECT state FROM workloads")).scalars())
        stored = conn.execute(
            text("SELECT count(*) FROM request_replies WHERE method = 'CancelWorkload'")
        ).scalar_one()
    assert states == {"cancelled": 10}
    assert stored == 10


def _ledger_event(kind: int, uid: str, node: str, gpu: int, at_s: float) -> Any:
    event = ledger_pb2.LedgerEvent(event_id=str(uuid.uuid4()), kind=kind, workload_uid=uid)
    if kind == ledger_pb2.EVENT_KIND_STARTED:  # pods belong on starts only
        event.pods.append(ledger_pb2.EventPod(node=node, gpu_indices=[gpu]))
    event.occurred_at.FromNanoseconds(int(at_s * 1e9))
    return event


def test_schedules_recomputes_rollups_and_claims_of_one_pool_run_together(
    client: GpufairClient, db: Engine, server: RunningServer
) -> None:
    client.apply_config(parse_config(CLUSTER))
    client.submit_workloads([one_gpu(f"s{i:03}", "ab"[i % 2]) for i in range(80)])
    # Some finished usage, so that rollups and recomputes have hours to write.
    now = time.time()
    done = [one_gpu(f"done{i}") for i in range(8)]
    client.submit_workloads(done)
    reported = client.report_events(
        [
            e
            for i, w in enumerate(done)
            for e in (
                _ledger_event(ledger_pb2.EVENT_KIND_STARTED, w.uid, "n3", i, now - 7200),
                _ledger_event(ledger_pb2.EVENT_KIND_STOPPED, w.uid, "n3", i, now - 3600),
            )
        ]
    )
    assert {r.status for r in reported.results} == {ledger_pb2.EVENT_STATUS_STORED}
    address = f"127.0.0.1:{server.port}"
    replicas = [
        PeriodicJobs(db, JobSettings(tick_s=0.05, rollup_period_s=0.2), replica=f"r{i}")
        for i in range(2)
    ]

    def act(t: int, r: int) -> None:
        if t < 3:  # callers of Schedule
            with GpufairClient(address, attempts=1, timeout_s=30) as c:
                c.schedule("main")
        elif t < 5:  # recomputes outside any job (as Schedule makes them)
            with db.connect() as conn:
                recompute_pool(conn, "main", time.time())
                conn.commit()
        else:  # the two replicas' periodic jobs
            replicas[t - 5].tick()
            time.sleep(0.05)

    errors = hammer(7, 15, act)

    assert errors == []
    with db.connect() as conn:
        claims = conn.execute(
            text("SELECT job, period_start, count(*) FROM job_claims GROUP BY 1, 2")
        ).all()
        unfinished = conn.execute(
            text("SELECT count(*) FROM job_claims WHERE outcome IS NULL OR outcome NOT LIKE 'ok%'")
        ).scalar_one()
        runs = conn.execute(
            text(
                "SELECT r.id, count(h.queue), sum(h.fair_share_cu) FROM fair_share_runs r "
                "JOIN fair_share_history h ON h.run_id = r.id GROUP BY r.id"
            )
        ).all()
        bound = conn.execute(
            text("SELECT count(*) FROM workloads WHERE state = 'bound'")
        ).scalar_one()
        usage = conn.execute(
            text("SELECT sum(gpu_seconds) FROM usage_hourly WHERE pool = 'main'")
        ).scalar_one()
    assert claims and all(n == 1 for *_, n in claims)  # each period claimed once
    assert unfinished == 0  # and every claimed run finished ok
    # Every stored run is whole: both queues, fair shares summing to the pool's 32 CU.
    assert runs and all(queues == 2 and abs(total - 32) < 1e-6 for _, queues, total in runs)
    assert bound == 32  # every GPU bound once, however the cycles interleaved
    assert usage == 8 * 3600  # the finished runs counted once by the racing rollups


def test_starts_racing_schedules_never_put_two_workloads_on_one_gpu(
    client: GpufairClient, db: Engine, server: RunningServer
) -> None:
    client.apply_config(parse_config(CLUSTER))
    client.submit_workloads([one_gpu(f"p{i:03}") for i in range(60)])
    rogues = [one_gpu(f"r{i:02}", "b") for i in range(16)]
    client.submit_workloads(rogues)
    address = f"127.0.0.1:{server.port}"

    def act(t: int, r: int) -> None:
        with GpufairClient(address, attempts=1, timeout_s=30) as c:
            if t < 3:
                c.schedule("main")
            else:  # the batch system starts rogue r on a GPU of its own choosing (each its own)
                rogue = rogues[(t - 3) * 8 + r]
                node, gpu = divmod((t - 3) * 8 + r, 8)
                reply = c.report_events(
                    [
                        _ledger_event(
                            ledger_pb2.EVENT_KIND_STARTED, rogue.uid, f"n{node}", gpu, time.time()
                        )
                    ]
                )
                assert [o.status for o in reply.results] == [ledger_pb2.EVENT_STATUS_STORED]
                time.sleep(random.random() * 0.05)

    errors = hammer(5, 8, act)

    assert errors == []
    on_gpu, running = _gpu_holders(db)
    assert running == 16
    assert {gpu: uids for gpu, uids in on_gpu.items() if len(uids) > 1} == {}
    # A rogue the scheduler had bound elsewhere frees that GPU when it starts on its own; a start
    # after the last racing cycle leaves the hole for the next cycle, which fills the pool.
    client.schedule("main")
    on_gpu, running = _gpu_holders(db)
    assert running == 16
    assert {gpu: uids for gpu, uids in on_gpu.items() if len(uids) > 1} == {}
    assert len(on_gpu) == 32  # the pool is full: bound and running together


def _gpu_holders(db: Engine) -> tuple[dict[tuple[str, int], list[str]], int]:
    """The workloads on each GPU (bound and running together) and how many are running."""
    with db.connect() as conn:
        holders = conn.execute(
            text(
                "SELECT uid, binding->'pods' FROM workloads WHERE state = 'bound' UNION ALL "
                "SELECT workload_uid, pods FROM allocation_intervals WHERE ended_at IS NULL"
            )
        ).all()
        running = conn.execute(
            text("SELECT count(*) FROM workloads WHERE state = 'running'")
        ).scalar_one()
    on_gpu: dict[tuple[str, int], list[str]] = defaultdict(list)
    for uid, pods in holders:
        for pod in pods:
            for index in pod["gpu_indices"]:
                on_gpu[(pod["node"], index)].append(uid)
    return on_gpu, running
