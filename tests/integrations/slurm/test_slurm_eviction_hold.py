"""The bridge's eviction on a real Slurm: `scontrol uhold` of the running job, then `scontrol
requeue` (bridge.py, `_requeue`), which leaves the job held with reason `JobHeldUser` and no
description. The cycles while the evicted job waits held read the jobs as text only (no `squeue
--json`: with `requeuehold`, the description `job requeued in held state` in the reason's place
made every one of them read it); an operator's `scontrol hold` of the waiting job then reads
`JobHeldAdmin` in the text and is respected (withdrawn, never released, with room for it); the
run ended once in the ledger, preempted, at the stamp; handed back (`scontrol uhold`), the job is
placed and runs again (released no sooner than 2 s after the requeue, or Slurm would kill it).
"""

from __future__ import annotations

import time
from typing import Any

from slurm_support import bridge_config, cluster_config, cycle_until, runs_of, sbatch, squeue
from sqlalchemy import Engine
from test_slurm_text_read import CountingSlurmCtl

from gpufair.client import GpufairClient
from gpufair.integrations.slurm import events
from gpufair.integrations.slurm.bridge import Bridge, CycleReport


def test_an_evicted_job_waits_held_read_as_text_and_an_operators_hold_of_it_is_respected(
    slurm: Any, client: GpufairClient, db: Engine
) -> None:
    client.apply_config(cluster_config("a100", k=0))
    config = bridge_config(partitions={"a100": "a100"})
    ctl = CountingSlurmCtl(config.slurm_bin)
    bridge = Bridge(config, client, ctl)
    team_a = [
        sbatch(slurm, account="acct-a", partition="a100", gres="gpu:8", seconds=600)
        for _ in range(2)
    ]

    def running_in_gpufair() -> set[str]:
        return {w.workload.uid for w in client.list_workloads(states=["running"])}

    cycle_until(
        bridge,
        lambda: {f"slurm-{j}" for j in team_a} <= running_in_gpufair(),
        max_cycles=8,
    )
    # team-b asks its share (80 CU of 160): gpufair evicts one of team-a's two jobs.
    team_b = sbatch(slurm, account="acct-b", partition="a100", gres="gpu:8", seconds=600)
    reports: list[CycleReport] = []
    cycle_until(bridge, lambda: bool(reports[-1].requeued), max_cycles=6, reports=reports)
    [evicted_uid] = reports[-1].requeued
    evicted = int(evicted_uid.removeprefix("slurm-"))
    assert evicted in team_a
    evictions = [c for c in ctl.commands if c[0] == "scontrol" and c[1] in ("uhold", "requeue")]
    assert evictions[-2:] == [
        ["scontrol", "uhold", str(evicted)],
        ["scontrol", "requeue", str(evicted)],
    ]

    # team-b's job runs on the freed node; the evicted job waits, held by the bridge.
    cycle_until(bridge, lambda: f"slurm-{team_b}" in running_in_gpufair(), max_cycles=10)
    waited: list[CycleReport] = []
    for _ in range(3):
        waited.append(bridge.cycle())
        time.sleep(1.0)
    assert [r.errors for r in waited] == [[]] * 3
    job = squeue(slurm)[evicted]
    assert (job["job_state"], job["state_reason"], job["state_description"]) == (
        "PENDING",
        "JobHeldUser",
        "",
    )
    assert (job["priority"], job["restart_cnt"]) == (0, 1)
    assert ctl.json_reads() == 0, [c for c in ctl.commands if c[0] == "squeue"]

    # The ledger: the run ended once, preempted, at the stamp written just before the requeue,
    # the requeue's second (Slurm's submit time of the requeued job).
    stamp_s = events.stamped_requeue_s(job["comment"], 0)
    assert stamp_s is not None
    [run] = runs_of(db, evicted_uid)
    assert run[1] is not None and abs(run[1] - stamp_s) < 1e-3 and run[4] == "preempted"
    assert -1 <= job["submit_time"] - stamp_s < 5

    # An operator holds it, and team-b's job ends: gpufair would place the evicted job now, but
    # the bridge reads the operator's hold in the text and withdraws it.
    slurm.run("scontrol", "hold", str(evicted))
    slurm.run("scancel", str(team_b))
    held: list[CycleReport] = []
    for _ in range(4):
        held.append(bridge.cycle())
        time.sleep(1.0)
    assert [r.errors for r in held] == [[]] * 4
    withdrawn = {uid: why for r in held for uid, why in r.withdrawn.items()}
    assert withdrawn == {
        evicted_uid: f"held by an operator (scontrol hold); scontrol uhold {evicted} hands it "
        "back to gpufair"
    }
    assert not any(r.placed for r in held)
    job = squeue(slurm)[evicted]
    assert (job["job_state"], job["state_reason"], job["priority"]) == (
        "PENDING",
        "JobHeldAdmin",
        0,
    )
    assert ctl.json_reads() == 0, [c for c in ctl.commands if c[0] == "squeue"]

    # Handed back: the next revision is placed and Slurm runs it (run 1).
    slurm.run("scontrol", "uhold", str(evicted))

    def runs_again() -> bool:
        job = squeue(slurm)[evicted]
        return (job["job_state"], job["restart_cnt"]) == ("RUNNING", 1)

    cycle_until(bridge, runs_again, max_cycles=10)
    assert ctl.json_reads() == 0, [c for c in ctl.commands if c[0] == "squeue"]
