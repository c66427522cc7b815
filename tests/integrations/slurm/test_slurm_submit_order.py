"""Jobs submitted in one second start in job-id order, as Slurm's own FIFO starts them.

Slurm's submit time has whole seconds, and gpufair orders a queue's pending work by (submit time,
uid): the job ids' digits alone would put `slurm-100` before `slurm-99`. The bridge adds the job
id's last six digits to the second as microseconds (mapping.py), so the lowest ids go first. The
test burns job ids up to a power of ten, submits four whole-node jobs in one second across it
(e.g. 99, 100, 101, 102) where two fit, and checks that the two lowest ids are the ones that run.
"""

from __future__ import annotations

import time
from typing import Any

from slurm_support import bridge_config, cluster_config, cycle_until, make_bridge, sbatch, squeue

from gpufair.client import GpufairClient


def burn_job_ids_until_next_is(slurm: Any, wanted: int) -> None:
    """Submit and cancel throwaway jobs (in a partition the bridge does not map) until Slurm's
    next job id is `wanted`."""
    burnt: list[str] = []
    while True:
        out = slurm.run(
            "sbatch", "--parsable", "--hold", "-p", "a100", "-o", "/dev/null", "--wrap", "true"
        ).stdout
        burnt.append(out.strip().split(";")[0])
        if int(burnt[-1]) >= wanted - 1:
            break
    slurm.run("scancel", *burnt)
    assert int(burnt[-1]) == wanted - 1, burnt[-1]


def next_power_of_ten_above(slurm: Any) -> int:
    out = slurm.run(
        "sbatch", "--parsable", "--hold", "-p", "a100", "-o", "/dev/null", "--wrap", "true"
    ).stdout
    last = int(out.strip().split(";")[0])
    slurm.run("scancel", str(last))
    power = 10
    while power <= last + 1:
        power *= 10
    return power


def test_jobs_of_one_second_start_in_job_id_order(slurm: Any, client: GpufairClient) -> None:
    client.apply_config(cluster_config("rtx"))
    bridge = make_bridge(client, bridge_config(partitions={"rtx": "rtx"}))
    bridge.cycle()
    power = next_power_of_ten_above(slurm)
    for _attempt in range(3):
        burn_job_ids_until_next_is(slurm, power - 1)
        # Start right after a second begins, so that the four submissions share it.
        time.sleep(1.02 - time.time() % 1)
        jobs = [
            sbatch(slurm, account="acct-a", partition="rtx", gres="gpu:8", seconds=600)
            for _ in range(4)
        ]
        seen = squeue(slurm)
        if len({seen[j]["submit_time"] for j in jobs}) == 1:
            break
        slurm.run("scancel", *map(str, jobs))  # a slow machine split them: again, a power up
        power *= 10
    else:
        raise AssertionError("four jobs were never submitted in one second")
    assert jobs == [power - 1, power, power + 1, power + 2]

    def two_run() -> bool:
        seen = squeue(slurm)
        return sum(seen[j]["job_state"] == "RUNNING" for j in jobs) == 2

    cycle_until(bridge, two_run, max_cycles=20)
    seen = squeue(slurm)
    running = [j for j in jobs if seen[j]["job_state"] == "RUNNING"]
    assert running == jobs[:2], {j: seen[j]["job_state"] for j in jobs}
    assert [seen[j]["job_state"] for j in jobs[2:]] == ["PENDING", "PENDING"]
    # gpufair's own order of the two left: the lower id first.
    order = {s.workload.uid: s.queue_position for s in client.list_workloads(states=["pending"])}
    assert order[f"slurm-{jobs[2]}"] < order[f"slurm-{jobs[3]}"], order
