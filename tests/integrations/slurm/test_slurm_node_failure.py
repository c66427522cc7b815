"""A node fails under a running job that may be requeued (`--requeue`), on the real Slurm.

The node's slurmd is killed and the node set DOWN (as an operator, or Slurm after SlurmdTimeout,
does for a dead node). Slurm 22.05 requeues the job at once: pending, not held, restart count 1,
no nodes, begin time 121 s ahead, submit time the requeue's second. The bridge ends the run in
gpufair's ledger once, at that second (a bridge that looks later too), holds the job, and
gpufair places the next run on a ready node, where it runs; other work runs on untouched, and
gpufair no longer counts or offers the down node.
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
from sqlalchemy import Engine, text

from gpufair.client import GpufairClient
from gpufair.integrations.slurm.bridge import CycleReport


def capacities(db: Engine, pool: str) -> list[float]:
    """The pool's capacity in CU after each change, in time order."""
    with db.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT capacity_cu FROM pool_capacity_changes WHERE pool = :pool"
                " ORDER BY changed_at"
            ),
            {"pool": pool},
        ).all()
    return [float(r[0]) for r in rows]


def ends_of(db: Engine, uid: str) -> list[tuple[str, float]]:
    """The workload's end events in the ledger: (kind, time)."""
    with db.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT kind, extract(epoch FROM occurred_at)::float8 FROM ledger_events"
                " WHERE workload_uid = :uid AND kind IN ('stopped', 'preempted', 'failed')"
            ),
            {"uid": uid},
        ).all()
    return [(str(r[0]), float(r[1])) for r in rows]


def test_a_job_requeued_by_a_node_failure_runs_again_on_a_ready_node(
    slurm: Any, client: GpufairClient, db: Engine
) -> None:
    client.apply_config(cluster_config("gpu"))
    bridge = make_bridge(client, bridge_config())
    bridge.cycle()
    out = slurm.run(
        "sbatch", "--parsable", "--hold", "--requeue", "-p", "gpu", "-A", "acct-a", "-N1",
        "--gres=gpu:a100:8", "-o", "/dev/null", "--wrap", "sleep 600",
    ).stdout  # fmt: skip
    job = int(out.strip().split(";")[0])
    other = sbatch(slurm, account="acct-b", gres="gpu:rtx4090:2", seconds=600)
    uid, other_uid = f"slurm-{job}", f"slurm-{other}"
    running = client.list_workloads
    cycle_until(
        bridge,
        lambda: {s.workload.uid for s in running(states=["running"])} == {uid, other_uid},
        max_cycles=10,
    )
    first, other_seen = squeue(slurm)[job], squeue(slurm)[other]
    lost = first["nodes"]
    [spare] = {"a100-0", "a100-1"} - {lost}
    # 2 x 8 A100 (10 CU each) and 2 x 8 RTX 4090 (2 CU each).
    assert capacities(db, "gpu")[-1] == 192.0

    slurm.kill_node(lost)
    try:
        before_s = time.time()
        slurm.run("scontrol", "update", f"NodeName={lost}", "State=DOWN", "Reason=node failure")
        after_s = time.time()
        requeued = squeue(slurm)[job]
        assert (requeued["job_state"], requeued["restart_cnt"], requeued["priority"] > 0) == (
            "PENDING",
            1,
            True,
        )
        # The bridge was down meanwhile: one started again 3 s later ends the run at Slurm's
        # second of the requeue (the submit time it set), not at the moment it looked.
        time.sleep(3)
        bridge = make_bridge(client, bridge_config())
        seen_s = time.time()
        reports: list[CycleReport] = []
        cycle_until(
            bridge,
            lambda: squeue(slurm)[job]["job_state"] == "RUNNING" and len(runs_of(db, uid)) == 2,
            max_cycles=12,
            reports=reports,
        )
        second = squeue(slurm)[job]
        assert (second["nodes"], second["restart_cnt"]) == (spare, 1)
        assert second["start_time"] <= after_s + 30  # placed by gpufair, not the 121 s delay
        [(start0, end0, gpus0, type0, kind0), later] = runs_of(db, uid)
        assert (start0, gpus0, type0, kind0) == (first["start_time"], 8.0, "a100-80gb", "preempted")
        assert end0 == requeued["submit_time"] and before_s - 1 <= end0 <= after_s
        assert end0 < seen_s - 2
        assert later == (second["start_time"], None, 8.0, "a100-80gb", None)
        assert ends_of(db, uid) == [("preempted", end0)]  # one end event, of run 0
        assert {u for r in reports for u in r.placed} == {uid}
        assert [u for r in reports for u in r.requeued] == []  # the bridge evicted nothing
        # The other job runs on, its one run still open.
        assert runs_of(db, other_uid) == [
            (other_seen["start_time"], None, 2.0, "rtx4090-24gb", None)
        ]
        assert squeue(slurm)[other]["job_state"] == "RUNNING"
        assert squeue(slurm)[other]["restart_cnt"] == 0

        # gpufair counts the down node out (80 CU) and places nothing on it: a second whole
        # A100 job waits, with the spare node taken.
        assert capacities(db, "gpu")[-1] == 112.0
        [lost_node] = [n for n in client.get_config().config.nodes if n.name == lost]
        assert not lost_node.ready
        waiting = sbatch(slurm, account="acct-b", gres="gpu:a100:8", seconds=600)
        for _ in range(3):
            report = bridge.cycle()
            assert not report.errors and not report.placed and not report.requeued
        assert client.explain(f"slurm-{waiting}").state == "pending"
        assert squeue(slurm)[waiting]["job_state"] == "PENDING"
    finally:
        slurm.start_node(lost)
    # Back: gpufair counts it again, and places the waiting job there.
    cycle_until(bridge, lambda: squeue(slurm)[waiting]["job_state"] == "RUNNING", max_cycles=10)
    assert squeue(slurm)[waiting]["nodes"] == lost
    assert capacities(db, "gpu")[-1] == 192.0
