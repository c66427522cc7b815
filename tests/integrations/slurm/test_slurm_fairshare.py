"""Time-based fair share on a real Slurm cluster: a bursty account's gang gets the pool back.

The pool `a100` is Slurm's partition of the two A100 nodes: 16 GPUs, 160 CU. team-a (account
acct-a) keeps it full with 1-GPU jobs and has 4 more waiting; team-b (acct-b) submits one gang of
2 nodes x 8 GPUs = 160 CU. Equal weights, no deserved quota, so W' = (0.5, 0.5).

- k = 0: shares follow W': 80 CU each. The gang needs 160 > 80: it waits, nothing is requeued.
- k = 1, once team-a's usage fills the 10 s window: U' = (1, 0), P = W' + k(W' - U') = (0, 1), so
  team-b's fair share is all 160 CU. gpufair reclaims team-a's 16 jobs (Slurm requeues them held),
  and the gang runs on both A100 nodes within a few cycles.

The window is short so that history builds in seconds; then a one-second gap between the evictions
and the gang's bind already moves U' (team-a's usage stops): to 0.9 of the 10 s window, which would
give team-a an effective weight of 0.09 and the gang only 15 GPUs. The pool's dead band (0.25, the
anti-thrash rule of DESIGN §3.6) keeps effective weights that move less than that, as a week-long
window would do by itself.
"""

from __future__ import annotations

import time
from typing import Any

from slurm_support import (
    bridge_config,
    cluster_config,
    cycle_until,
    make_bridge,
    sbatch,
    squeue,
)

from gpufair.client import GpufairClient
from gpufair.integrations.slurm.bridge import CycleReport

WINDOW_S = 10.0
DEAD_BAND = 0.25
OWNED_KINDS = ["gpu_type", "pool", "queue"]  # the bridge owns the nodes


def test_gang_waits_with_k0_and_runs_after_reclaim_with_k1(
    slurm: Any, client: GpufairClient
) -> None:
    client.apply_config(cluster_config("a100", k=0, window_s=WINDOW_S, dead_band=DEAD_BAND))
    bridge = make_bridge(client, bridge_config(partitions={"a100": "a100"}))
    bridge.cycle()
    fillers = [
        sbatch(slurm, account="acct-a", partition="a100", gres="gpu:1", seconds=600)
        for _ in range(20)
    ]

    def running(job_ids: list[int]) -> list[int]:
        jobs = squeue(slurm)
        return [j for j in job_ids if jobs[j]["job_state"] == "RUNNING"]

    cycle_until(bridge, lambda: len(running(fillers)) == 16, max_cycles=6)
    filled_at = time.time()
    gang = sbatch(slurm, account="acct-b", partition="a100", nodes=2, gres="gpu:8", seconds=8)

    # k = 0: the gang waits, and no job of team-a is touched.
    reports: list[CycleReport] = []
    for _ in range(6):
        reports.append(bridge.cycle())
        time.sleep(1.0)
    assert not any(r.requeued for r in reports)
    assert squeue(slurm)[gang]["job_state"] == "PENDING"
    shares = {q.queue: q for q in client.get_fair_share("a100").queues}
    assert round(shares["team-b"].fair_share_cu) == 80
    assert round(shares["team-a"].fair_share_cu) == 80
    explained = client.explain(f"slurm-{gang}")
    assert explained.state == "pending"
    assert explained.needs_cu == 160

    # k = 1, with team-a's usage over the whole window.
    time.sleep(max(0.0, filled_at + WINDOW_S + 1.0 - time.time()))
    bridge.cycle()
    shares = {q.queue: q for q in client.get_fair_share("a100").queues}
    assert shares["team-a"].usage_share > 0.97  # U' = (1, 0), up to the second's rounding
    assert shares["team-b"].usage_share == 0
    assert round(shares["team-b"].fair_share_cu) == 80  # k = 0 ignores history
    ran = running(fillers)
    assert len(ran) == 16
    client.apply_config(
        cluster_config("a100", k=1, window_s=WINDOW_S, dead_band=DEAD_BAND), kinds=OWNED_KINDS
    )
    reports.clear()
    cycles = cycle_until(
        bridge,
        lambda: squeue(slurm)[gang]["job_state"] == "RUNNING",
        max_cycles=8,
        reports=reports,
    )
    # Evict (requeue held) in one cycle, bind the gang in the next, see it running in the third.
    assert cycles <= 4
    requeued = sorted(uid for r in reports for uid in r.requeued)
    assert requeued == sorted(f"slurm-{j}" for j in ran)
    jobs = squeue(slurm)
    assert jobs[gang]["nodes"] == "a100-[0-1]"
    assert jobs[gang]["restart_cnt"] == 0
    for uid in requeued:
        job = jobs[int(uid.removeprefix("slurm-"))]
        assert (job["job_state"], job["priority"], job["restart_cnt"]) == ("PENDING", 0, 1)
    shares = {q.queue: q for q in client.get_fair_share("a100").queues}
    assert round(shares["team-b"].fair_share_cu) == 160
    assert shares["team-a"].fair_share_cu == 0
    # team-a's usage stopped at the evictions, so U' slipped below 1, within the dead band.
    assert 0.75 < shares["team-a"].usage_share < 1
    assert (shares["team-a"].effective_weight, shares["team-b"].effective_weight) == (0, 1)

    # The ledger: each requeued job has one closed run ended by preemption, the gang one open run.
    bridge.cycle()
    gang_status = {w.workload.uid: w for w in client.list_workloads(states=["running"])}
    assert set(gang_status) == {f"slurm-{gang}"}
    assert sorted(p.node for p in gang_status[f"slurm-{gang}"].pods) == ["a100-0", "a100-1"]
