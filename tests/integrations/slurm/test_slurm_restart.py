"""The bridge as its own process, killed (SIGKILL, by its pid) mid-run and started again.

16 jobs of 1 to 8 GPUs (62 GPUs of work for a 32-GPU cluster) run a few seconds each. The bridge
is killed once the first has finished, while others run and wait; jobs end while no bridge runs.
The restarted bridge derives everything again from Slurm and gpufair. Checked:

- no job started twice: every Slurm restart count is 0 and each workload has exactly one run;
- no event lost: each run's start and end in the ledger are Slurm's own start and end times;
- nothing pinned to a busy GPU: every job gpufair released started within 3 s (a job pinned to a
  node without free GPUs would wait in Slurm), and no two jobs ran on one GPU at once.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml
from slurm_support import BRIDGE_YAML, cluster_config, sbatch, squeue
from sqlalchemy import Engine, text

from gpufair.client import GpufairClient
from gpufair.integrations.slurm.records import expand_hostlist, gpu_indices

GPUS = [8, 4, 2, 1] * 4  # 60 GPUs of work: about twice the cluster


def start_bridge(config: Path, address: str, log: Path) -> subprocess.Popen[bytes]:
    with open(log, "ab") as out:
        argv = [sys.executable, "-m", "gpufair.cli", "slurm-bridge", "--config", str(config)]
        return subprocess.Popen(
            [*argv, "--address", address],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def test_bridge_killed_and_restarted_mid_run_repeats_and_loses_nothing(
    slurm: Any, client: GpufairClient, db: Engine, tmp_path: Path
) -> None:
    client.apply_config(cluster_config("gpu"))
    config = tmp_path / "bridge.yaml"
    config.write_text(yaml.safe_dump({**BRIDGE_YAML, "accounts": {"acct-a": "team-a"}}))
    log = tmp_path / "bridge.log"
    jobs = [
        sbatch(slurm, account="acct-a", gres=f"gpu:{gpus}", seconds=3 + i % 3)
        for i, gpus in enumerate(GPUS)
    ]
    bridge = start_bridge(config, client.address, log)
    released_at: dict[int, float] = {}  # wall clock: compared with Slurm's start times
    restarted = False
    at_kill: list[str] = []
    at_restart: list[str] = []
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline:
            now = time.time()
            seen = squeue(slurm)
            gpus_in_use: dict[tuple[str, int], int] = {}
            for job_id in jobs:
                job = seen[job_id]
                if job["job_state"] == "PENDING" and job["priority"] > 0:
                    released_at.setdefault(job_id, now)
                if job["job_state"] == "RUNNING":
                    nodes = expand_hostlist(job["nodes"])
                    for node, detail in zip(nodes, job["gres_detail"], strict=True):
                        for index in gpu_indices(detail):
                            gpus_in_use[node, index] = gpus_in_use.get((node, index), 0) + 1
            assert all(count == 1 for count in gpus_in_use.values()), gpus_in_use
            states = [seen[j]["job_state"] for j in jobs]
            if not restarted and "COMPLETED" in states:
                os.kill(bridge.pid, signal.SIGKILL)
                bridge.wait()
                at_kill = states
                time.sleep(3)  # jobs end and nobody watches
                at_restart = [squeue(slurm)[j]["job_state"] for j in jobs]
                bridge = start_bridge(config, client.address, log)
                restarted = True
            finished = client.list_workloads(states=["finished"])
            if restarted and len(finished) == len(jobs):
                break
            time.sleep(0.3)
        else:
            raise AssertionError(f"not all jobs finished; bridge log:\n{log.read_text()}")
    finally:
        bridge.send_signal(signal.SIGTERM)
        bridge.wait(timeout=10)

    # Killed mid-run: jobs were running and waiting, and some ended while no bridge ran.
    assert at_kill.count("RUNNING") >= 3 and at_kill.count("PENDING") >= 3, at_kill
    ended_unwatched = [
        j for j, before, after in zip(jobs, at_kill, at_restart, strict=True)
        if before == "RUNNING" and after == "COMPLETED"
    ]  # fmt: skip
    assert ended_unwatched, (at_kill, at_restart)
    seen = squeue(slurm)
    assert [seen[j]["job_state"] for j in jobs] == ["COMPLETED"] * len(jobs)
    assert [seen[j]["restart_cnt"] for j in jobs] == [0] * len(jobs)
    # From the release this test saw to Slurm's own start time (whole seconds, so up to a second
    # short): not to when the test next looked, which the blind seconds around the kill stretch.
    waits = {j: seen[j]["start_time"] - released_at[j] for j in released_at}
    assert max(waits.values(), default=0.0) < 3.0, waits

    with db.connect() as conn:
        runs = conn.execute(
            text(
                "SELECT workload_uid, extract(epoch FROM started_at)::bigint, "
                "extract(epoch FROM ended_at)::bigint, gpus, end_kind "
                "FROM allocation_intervals ORDER BY workload_uid"
            )
        ).all()
        started_events = conn.execute(
            text("SELECT count(*) FROM ledger_events WHERE kind = 'started'")
        ).scalar_one()
    assert sorted((r[0], r[1], r[2], r[3], r[4]) for r in runs) == sorted(
        (
            f"slurm-{j}",
            seen[j]["start_time"],
            seen[j]["end_time"],
            float(gpus),
            "stopped",
        )
        for j, gpus in zip(jobs, GPUS, strict=True)
    )
    assert started_events == len(jobs)
    assert "refused" not in log.read_text()
