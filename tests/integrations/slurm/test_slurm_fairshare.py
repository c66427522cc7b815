"""Time-based fair share on a real Slurm cluster: a bursty account's gang gets the pool back.

The pool `a100` is Slurm's partition of the two A100 nodes: 16 GPUs, 160 CU. team-a (account
acct-a) keeps it full with 1-GPU jobs and has 4 more waiting; team-b (acct-b) submits one gang of
2 nodes x 8 GPUs = 160 CU. Equal weights, no deserved quota, so W' = (0.5, 0.5).

- k = 0: shares follow W': 80 CU each. The gang needs 160 > 80: it waits, nothing is requeued.
- k = 1, once team-a's usage fills the 10 s window: U' = (1, 0), P = W' + k(W' - U') = (0, 1), so
  team-b's fair share is all 160 CU. gpufair reclaims team-a's 16 jobs (Slurm requeues them held),
  and the gang runs on both A100 nodes within a few cycles. The bridge dies right after the
  requeues, before reporting them; a fresh bridge reports each with the time stamped in the job.

The window is short so that history builds in seconds; then a one-second gap between the evictions
and the gang's bind already moves U' (team-a's usage stops): to 0.9 of the 10 s window, which would
give team-a an effective weight of 0.09 and the gang only 15 GPUs. The pool's dead band (0.25, the
anti-thrash rule of DESIGN §3.6) keeps effective weights that move less than that, as a week-long
window would do by itself.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import pytest
from slurm_support import (
    bridge_config,
    cluster_config,
    cycle_until,
    make_bridge,
    sbatch,
    squeue,
)
from sqlalchemy import Engine, text

from gpufair.client import GpufairClient
from gpufair.integrations.slurm import events
from gpufair.integrations.slurm.bridge import Bridge, CycleReport
from gpufair.integrations.slurm.slurmctl import SlurmCtl
from gpufair.v1 import ledger_pb2

# U' falls by 1 / WINDOW_S each second after the evictions; the restarted bridge's checks need
# it still within the dead band, so the window leaves 7.5 s of slack on a loaded machine (with 10 s
# it left 2.5 s, and a loaded run read U' = 0.747; with 20 s, 5 s, and a run at a load average
# of 8-11 on 2 cores read U' = 0.708).
WINDOW_S = 30.0
DEAD_BAND = 0.25
OWNED_KINDS = ["gpu_type", "pool", "queue"]  # the bridge owns the nodes


def test_gang_waits_with_k0_and_runs_after_reclaim_with_k1(
    slurm: Any, client: GpufairClient, db: Engine
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
    assert [r.errors for r in reports] == [[]] * 6
    assert not any(r.requeued for r in reports)
    assert [w.workload.uid for w in client.list_workloads() if w.evicting] == []
    assert squeue(slurm)[gang]["job_state"] == "PENDING"
    shares = {q.queue: q for q in client.get_fair_share("a100").queues}
    assert round(shares["team-b"].fair_share_cu) == 80
    assert round(shares["team-a"].fair_share_cu) == 80
    explained = client.explain(f"slurm-{gang}")
    assert explained.state == "pending"
    assert explained.needs_cu == 160

    # k = 1, with team-a's usage over the whole window.
    time.sleep(max(0.0, filled_at + WINDOW_S + 1.0 - time.time()))
    assert bridge.cycle().errors == []
    shares = {q.queue: q for q in client.get_fair_share("a100").queues}
    assert shares["team-a"].usage_share > 0.97  # U' = (1, 0), up to the second's rounding
    assert shares["team-b"].usage_share == 0
    assert round(shares["team-b"].fair_share_cu) == 80  # k = 0 ignores history
    ran = running(fillers)
    assert len(ran) == 16
    client.apply_config(
        cluster_config("a100", k=1, window_s=WINDOW_S, dead_band=DEAD_BAND), kinds=OWNED_KINDS
    )
    # The bridge requeues team-a's jobs and dies before it reports it (as if killed there).
    crashing = CrashBeforeEvents(bridge.config, client, SlurmCtl())
    crash_cycles = 0
    while True:
        crash_cycles += 1
        assert crash_cycles <= 3, "no evictions"
        try:
            assert crashing.cycle().errors == []
        except SimulatedCrash:
            break
        time.sleep(1.0)
    # Slurm has requeued them; gpufair still counts them running, evicting.
    assert [j for j in ran if squeue(slurm)[j]["restart_cnt"] == 1] == ran
    evicting = {w.workload.uid for w in client.list_workloads(states=["running"]) if w.evicting}
    assert evicting == {f"slurm-{j}" for j in ran}

    # A bridge started afresh reports the requeues and places the gang: in its first cycle, or
    # its second when the first one's recompute still saw the evicted jobs' last second running.
    restarted = make_bridge(client, bridge.config)
    placed: list[CycleReport] = []
    cycles = cycle_until(
        restarted,
        lambda: f"slurm-{gang}" in placed[-1].placed,
        max_cycles=8,
        reports=placed,
    )
    assert cycles <= 2
    assert placed[-1].placed[f"slurm-{gang}"] == ["a100-0", "a100-1"]
    # Slurm starts a released job on its own one-second tick (slower on a loaded machine).
    deadline = time.monotonic() + 20.0
    while squeue(slurm)[gang]["job_state"] != "RUNNING":
        assert time.monotonic() < deadline, "Slurm did not start the released gang"
        time.sleep(0.2)
    jobs = squeue(slurm)
    assert jobs[gang]["nodes"] == "a100-[0-1]"
    assert jobs[gang]["restart_cnt"] == 0
    for job_id in ran:
        job = jobs[job_id]
        assert (job["job_state"], job["priority"], job["restart_cnt"]) == ("PENDING", 0, 1)
    shares = {q.queue: q for q in client.get_fair_share("a100").queues}
    assert round(shares["team-b"].fair_share_cu) == 160
    assert shares["team-a"].fair_share_cu == 0
    # team-a's usage stopped at the evictions, so U' slipped below 1, within the dead band.
    assert 0.75 < shares["team-a"].usage_share < 1
    assert (shares["team-a"].effective_weight, shares["team-b"].effective_weight) == (0, 1)

    # The ledger: each requeued job's run ended by preemption at the instant the bridge stamped
    # into its Comment just before requeueing it; the gang runs on both A100 nodes.
    with db.connect() as conn:
        runs = conn.execute(
            text(
                "SELECT workload_uid, extract(epoch FROM ended_at)::float8, end_kind "
                "FROM allocation_intervals WHERE queue = 'team-a' ORDER BY workload_uid"
            )
        ).all()
    assert sorted(r[0] for r in runs) == sorted(f"slurm-{j}" for j in ran)
    for uid, ended_s, end_kind in runs:
        stamp_s = events.stamped_requeue_s(jobs[int(uid.removeprefix("slurm-"))]["comment"], 0)
        assert end_kind == "preempted" and stamp_s is not None
        assert ended_s == pytest.approx(stamp_s, abs=1e-3)
    assert restarted.cycle().errors == []
    # Every eviction was reported: none is left in flight.
    assert [w.workload.uid for w in client.list_workloads() if w.evicting] == []
    gang_status = {w.workload.uid: w for w in client.list_workloads(states=["running"])}
    assert set(gang_status) == {f"slurm-{gang}"}
    assert sorted(p.node for p in gang_status[f"slurm-{gang}"].pods) == ["a100-0", "a100-1"]


class SimulatedCrash(Exception):
    pass


class CrashBeforeEvents(Bridge):
    """A bridge that dies after its requeues and before it sends what they did. Other events
    (a running job's heartbeat, due in each 30 s period's first two cycles once the job has run
    that long) go out as usual: the crash must follow the requeues, not a heartbeat before them."""

    def _send(self, batch: Sequence[ledger_pb2.LedgerEvent], report: CycleReport) -> None:
        if any(e.kind == ledger_pb2.EVENT_KIND_PREEMPTED for e in batch):
            raise SimulatedCrash
        super()._send(batch, report)
