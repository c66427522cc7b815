"""A running job requeued in Slurm by someone else (`scontrol requeue`, as an admin does).

Slurm puts the job back to pending, not held, with an eligible time about two minutes ahead, and
keeps its old node list. The bridge reports the end of the first run (at the moment it sees the
requeue, documented as up to a cycle late), and gpufair places the next run like any other: the
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
