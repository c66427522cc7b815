"""A batch system's side of gpufair, in one small loop.

    python examples/batch_adapter.py --pool default --jobs 20 --seconds 30

It talks to `$GPUFAIR_ADDRESS` (default 127.0.0.1:50051) with `$GPUFAIR_TOKEN` if set, like the
`gpufair` command.

What any adapter (a Kubernetes controller, a Slurm plugin, an in-house queue) does:

1. submit the workloads waiting in its queue (idempotent: resubmitting is harmless);
2. ask gpufair for a cycle of the pool: `Schedule` returns binds and evicts;
3. start each bound workload on the pods gpufair chose, and report `started` with those pods;
4. stop each evicted workload and report `preempted` (its GPUs count as taken until then);
5. report `heartbeat` for what runs, and `stopped` when a workload finishes.

Here "running" is pretend: a job finishes after its duration of wall-clock seconds. Everything
sent to gpufair is real.
"""

from __future__ import annotations

import argparse
import os
import random
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from gpufair import client as sdk
from gpufair.client import DEFAULT_ADDRESS, GpufairClient
from gpufair.v1 import ledger_pb2, scheduler_pb2


@dataclass
class Job:
    uid: str
    queue: str
    gpus: int
    duration_s: float
    started_at: float | None = None
    pods: list[scheduler_pb2.PodBinding] = field(default_factory=list)


def event(kind: int, job: Job, now: float) -> ledger_pb2.LedgerEvent:
    """The event of `kind` for `job` at `now`, made by the client's event builders."""
    if kind == ledger_pb2.EVENT_KIND_STARTED:
        return sdk.started(job.uid, job.pods, at=now)
    builder = {
        ledger_pb2.EVENT_KIND_STOPPED: sdk.stopped,
        ledger_pb2.EVENT_KIND_HEARTBEAT: sdk.heartbeat,
        ledger_pb2.EVENT_KIND_PREEMPTED: sdk.preempted,
        ledger_pb2.EVENT_KIND_FAILED: sdk.failed,
    }[kind]
    return builder(job.uid, at=now)


def run(
    client: GpufairClient,
    pool: str,
    jobs: list[Job],
    *,
    seconds: float,
    cycle_s: float = 1.0,
    clock: Callable[[], float] = time.time,
    sleep: Callable[[float], None] = time.sleep,
    say: Callable[[str], None] = lambda line: None,
) -> dict[str, int]:
    """Drive `jobs` through gpufair for `seconds`; returns counts of what happened. `say` gets
    one line per decision (bind, evict) and per finished job."""
    counts = {"started": 0, "finished": 0, "preempted": 0}
    client.submit_workloads(
        [
            scheduler_pb2.Workload(uid=j.uid, queue=j.queue, pool=pool, pods=j.gpus, gpus_per_pod=1)
            for j in jobs
        ]
    )
    by_uid = {j.uid: j for j in jobs}
    deadline = clock() + seconds
    while clock() < deadline:
        now = clock()
        events = []
        reply = client.schedule(pool)
        for bind in reply.binds:
            job = by_uid.get(bind.uid)
            if job is None:
                continue  # work submitted by someone else: its own system starts it
            job.started_at, job.pods = now, list(bind.pods)
            nodes = ", ".join(sorted({p.node for p in bind.pods}))
            say(f"bind   {job.uid} ({job.queue}, {job.gpus} GPUs) on {nodes}")
            events.append(event(ledger_pb2.EVENT_KIND_STARTED, job, now))
            counts["started"] += 1
        for evict in reply.evicts:
            job = by_uid.get(evict.uid)
            if job is not None and job.started_at is not None:
                say(f"evict  {job.uid} ({job.queue}, {job.gpus} GPUs)")
                events.append(event(ledger_pb2.EVENT_KIND_PREEMPTED, job, now))
                job.started_at = None  # requeued under the same uid; gpufair knows it waits
                counts["preempted"] += 1
        for job in jobs:
            if job.started_at is None or any(e.workload_uid == job.uid for e in events):
                continue
            if now - job.started_at >= job.duration_s:
                events.append(event(ledger_pb2.EVENT_KIND_STOPPED, job, now))
                say(f"done   {job.uid} after {now - job.started_at:.0f} s")
                job.started_at = None
                job.duration_s = float("inf")  # done for good
                counts["finished"] += 1
            else:
                events.append(event(ledger_pb2.EVENT_KIND_HEARTBEAT, job, now))
        if events:
            client.report_events(events)
        sleep(cycle_s)
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--address",
        default=os.environ.get("GPUFAIR_ADDRESS", DEFAULT_ADDRESS),
        help="gpufair server (default $GPUFAIR_ADDRESS or 127.0.0.1:50051)",
    )
    parser.add_argument("--pool", default="default")
    parser.add_argument("--queues", default="llm,vision", help="comma-separated leaf queues")
    parser.add_argument("--jobs", type=int, default=20)
    parser.add_argument("--seconds", type=float, default=30)
    args = parser.parse_args()
    rng = random.Random(1)
    queues = args.queues.split(",")
    jobs = [
        Job(
            f"adapter-{uuid.uuid4().hex[:8]}",
            rng.choice(queues),
            rng.choice([1, 2, 4, 8]),
            rng.uniform(3, 15),
        )
        for _ in range(args.jobs)
    ]
    with GpufairClient(args.address, token=os.environ.get("GPUFAIR_TOKEN")) as client:
        counts = run(client, args.pool, jobs, seconds=args.seconds, say=print)
    print(", ".join(f"{n} {what}" for what, n in counts.items()))


if __name__ == "__main__":
    main()
