"""A running job requeued in Slurm by someone else (`scontrol requeue`, as an admin does).

Slurm puts the job back to pending, not held, with an eligible time about two minutes ahead, and
keeps its old node list. The bridge reports the end of the first run (at the second Slurm made
the job pending again, its submit time, or when it sees the job still completing, up to a cycle
late), and gpufair places the next run like any other: the
bridge holds the job, pins it to gpufair's nodes and releases it, so it starts within a few
cycles, where gpufair put it, instead of waiting for the eligible time with gpufair's GPUs
reserved and then starting wherever Slurm picks. The ledger keeps the first run and holds the
second with Slurm's own start time.
"""

from __future__ import annotations

import time
from typing import Any

from slurm_support import (
    bridge_config,
    cluster_config,
    cycle_until,
    make_bridge,
    runs_of,
    sbatch,
    squeue,
)
from sqlalchemy import Engine

from gpufair.client import GpufairClient
from gpufair.integrations.slurm import events
from gpufair.v1 import ledger_pb2


def test_job_requeued_by_an_admin_runs_again_where_gpufair_places_it(
    slurm: Any, client: GpufairClient, db: Engine
) -> None:
    client.apply_config(cluster_config("gpu"))
    bridge = make_bridge(client, bridge_config())
    bridge.cycle()
    job = sbatch(slurm, account="acct-a", gres="gpu:rtx4090:2", seconds=120)
    uid = f"slurm-{job}"
    cycle_until(bridge, lambda: client.explain(uid).state == "running", max_cycles=8)
    first = squeue(slurm)[job]

    before_s = time.time()
    slurm.run("scontrol", "requeue", str(job))
    after_s = time.time()

    def second_run_started() -> bool:
        return len(runs_of(db, uid)) == 2

    # Far less than Slurm's two minutes of eligible time.
    cycle_until(bridge, second_run_started, max_cycles=10)
    second = squeue(slurm)[job]
    assert (second["job_state"], second["restart_cnt"]) == ("RUNNING", 1)
    [running] = client.list_workloads(states=["running"])
    assert [p.node for p in running.pods] == [second["nodes"]]

    [(start0, end0, gpus0, type0, kind0), later] = runs_of(db, uid)
    assert (start0, gpus0, type0, kind0) == (first["start_time"], 2.0, "rtx4090-24gb", "preempted")
    assert end0 is not None and before_s - 1 <= end0 <= after_s + 2
    assert later == (second["start_time"], None, 2.0, "rtx4090-24gb", None)
    assert second["start_time"] <= after_s + 10


def test_admin_requeue_of_a_job_slow_to_die_ends_its_run_at_the_requeue(
    slurm: Any, client: GpufairClient, db: Engine
) -> None:
    """A job that ignores SIGTERM stays COMPLETING after `scontrol requeue` (Slurm 22.05: the
    restart count already 1, no GPU indices, start time Slurm's now, no end time) until KillWait
    has passed and its processes are gone, 5 s on the local cluster (KillWait=2). Its run ends at
    the requeue, not when Slurm shows it pending again; the bridge sends no event of run 1 before
    run 1 starts, and gpufair, not Slurm, places run 1."""
    client.apply_config(cluster_config("gpu"))
    bridge = make_bridge(client, bridge_config())
    sent: list[ledger_pb2.LedgerEvent] = []
    stream_events = client.stream_events

    def recording(batches: Any, **kwargs: Any) -> Any:
        batches = [list(b) for b in batches]
        sent.extend(e for b in batches for e in b)
        return stream_events(batches, **kwargs)

    bridge.client = _Delegate(client, stream_events=recording)  # type: ignore[assignment]
    bridge.cycle()
    wrap = "trap '' TERM; while true; do sleep 1; done"
    out = slurm.run(
        "sbatch", "--parsable", "--hold", "-p", "gpu", "-A", "acct-a", "-N1",
        "--gres=gpu:rtx4090:2", "-o", "/dev/null", "--wrap", wrap,
    ).stdout  # fmt: skip
    job = int(out.strip().split(";")[0])
    uid = f"slurm-{job}"
    cycle_until(bridge, lambda: client.explain(uid).state == "running", max_cycles=8)
    first = squeue(slurm)[job]

    before_s = time.time()
    slurm.run("scontrol", "requeue", str(job))
    after_s = time.time()
    completing = squeue(slurm)[job]
    assert (completing["job_state"], completing["restart_cnt"]) == ("COMPLETING", 1)

    cycle_until(bridge, lambda: len(runs_of(db, uid)) == 2, max_cycles=20)
    second = squeue(slurm)[job]
    assert (second["job_state"], second["restart_cnt"]) == ("RUNNING", 1)
    [running] = client.list_workloads(states=["running"])
    assert [p.node for p in running.pods] == [second["nodes"]]

    [(start0, end0, gpus0, type0, kind0), later] = runs_of(db, uid)
    assert (start0, gpus0, type0, kind0) == (first["start_time"], 2.0, "rtx4090-24gb", "preempted")
    assert end0 is not None and before_s - 1 <= end0 <= after_s + 2
    # Slurm showed the job pending again seconds later (its submit time, which a requeue sets to
    # the second the job is pending again and a start keeps): the end is not that moment.
    assert end0 < second["submit_time"] - 1
    assert later == (second["start_time"], None, 2.0, "rtx4090-24gb", None)
    assert second["start_time"] <= after_s + 30  # gpufair placed it, not the 121 s begin time

    # Every event of run 1 came after its start: the first event naming run 1 is its start.
    run1 = {events.event_id(uid, 1, "started")}
    run1 |= {
        events.event_id(uid, 1, f"heartbeat-{b}")
        for b in range(int(first["start_time"] // 30) - 2, int(time.time() // 30) + 2)
    }
    run1 |= {events.event_id(uid, 1, w) for w in ("preempted", "stopped", "failed")}
    first_of_run1 = next(e for e in sent if e.event_id in run1)
    assert first_of_run1.event_id == events.event_id(uid, 1, "started")
    ids = [e.event_id for e in sent]
    assert ids.index(events.event_id(uid, 0, "preempted")) < ids.index(first_of_run1.event_id)


def test_job_requeued_and_placed_within_the_same_second_still_runs(
    slurm: Any, client: GpufairClient, db: Engine
) -> None:
    """The requeue revokes the job's launch credential on its node as of that second, and a
    launch in that second is refused for good: Slurm kills the job ("Job credential revoked",
    FAILED, seen on 22.05), as happened when a cycle read the job pending, ended its run and
    placed it again within the second. The requeue is made at the start of a second here, and a
    cycle runs as soon as Slurm shows the job pending: the bridge releases it no sooner than 2 s
    after the requeue, and the job runs again."""
    client.apply_config(cluster_config("gpu"))
    bridge = make_bridge(client, bridge_config())
    bridge.cycle()
    job = sbatch(slurm, account="acct-a", gres="gpu:rtx4090:2", seconds=120)
    uid = f"slurm-{job}"
    cycle_until(bridge, lambda: client.explain(uid).state == "running", max_cycles=8)

    time.sleep(1.02 - time.time() % 1)
    slurm.run("scontrol", "requeue", str(job))
    deadline = time.monotonic() + 5
    while squeue(slurm)[job]["job_state"] != "PENDING":
        assert time.monotonic() < deadline, squeue(slurm)[job]
        time.sleep(0.02)
    first = bridge.cycle()
    assert not first.errors, first.errors
    assert first.placed == {}  # bound by gpufair in that cycle, released by a later one

    cycle_until(bridge, lambda: len(runs_of(db, uid)) == 2, max_cycles=10)
    second = squeue(slurm)[job]
    assert (second["job_state"], second["restart_cnt"]) == ("RUNNING", 1)
    assert second["start_time"] >= second["submit_time"] + 2
    [running] = client.list_workloads(states=["running"])
    assert [p.node for p in running.pods] == [second["nodes"]]


class _Delegate:
    """The client, with some of its methods replaced."""

    def __init__(self, inner: Any, **overrides: Any) -> None:
        self._inner, self._overrides = inner, overrides

    def __getattr__(self, name: str) -> Any:
        return self._overrides.get(name) or getattr(self._inner, name)
