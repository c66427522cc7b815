"""`--gpus=G` (GPUs per job) on a real Slurm: on several nodes Slurm does not split it evenly.

`sbatch -N2 --gpus=8` on two idle 8-GPU nodes gets 7 GPUs on one node and 1 on the other, not
4 + 4; a workload says one GPU count per pod, so gpufair would count 4 on each node and bind other
jobs to GPUs Slurm has given away (they would wait in Slurm, released, with gpufair's GPUs
reserved). So the bridge maps `--gpus` on one node only and refuses it on several, with the reason
in the job's Comment; `--gres=gpu:g` (per node) says what gpufair can place. Checked: every job
gpufair places runs at once, on as many GPUs per node as gpufair counts.
"""

from __future__ import annotations

from typing import Any

from slurm_support import bridge_config, cluster_config, cycle_until, make_bridge, sbatch, squeue

from gpufair.client import GpufairClient
from gpufair.integrations.slurm.records import expand_hostlist, gpu_indices


def gpus_job(slurm: Any, nodes: int, gpus: int) -> int:
    out = slurm.run(
        "sbatch", "--parsable", "--hold", "-p", "rtx", "-A", "acct-a", f"-N{nodes}",
        f"--gpus={gpus}", "-o", "/dev/null", "--wrap", "sleep 60",
    ).stdout  # fmt: skip
    return int(out.strip())


def test_gpus_per_job_runs_on_one_node_and_is_refused_on_several(
    slurm: Any, client: GpufairClient
) -> None:
    client.apply_config(cluster_config("rtx"))
    bridge = make_bridge(client, bridge_config(partitions={"rtx": "rtx"}))
    bridge.cycle()
    spread = gpus_job(slurm, nodes=2, gpus=8)
    single = gpus_job(slurm, nodes=1, gpus=4)
    fours = [sbatch(slurm, account="acct-b", partition="rtx", gres="gpu:4", seconds=60)]
    fours.append(sbatch(slurm, account="acct-b", partition="rtx", gres="gpu:4", seconds=60))
    placed = [single, *fours]

    def placed_jobs_run() -> bool:
        """Running in Slurm, and reported so: a job Slurm starts after a cycle's look is
        reported started by the next cycle."""
        seen = squeue(slurm)
        reported = {w.workload.uid for w in client.list_workloads(states=["running"])}
        return all(seen[j]["job_state"] == "RUNNING" and f"slurm-{j}" in reported for j in placed)

    # Every job gpufair places starts at once: none waits for GPUs gpufair counts free.
    cycle_until(bridge, placed_jobs_run, max_cycles=6)
    seen = squeue(slurm)
    running = {w.workload.uid: w for w in client.list_workloads(states=["running"])}
    for job in placed:
        nodes = expand_hostlist(seen[job]["nodes"])
        used = [len(gpu_indices(d)) for d in seen[job]["gres_detail"]]
        pods = running[f"slurm-{job}"].pods
        assert list(zip(nodes, used, strict=True)) == [(p.node, 4) for p in pods]

    # The job of --gpus over two nodes waits, held, and says why.
    assert (seen[spread]["job_state"], seen[spread]["priority"]) == ("PENDING", 0)
    assert seen[spread]["comment"] == (
        "gpufair: not scheduled: --gpus=8 over 2 nodes: Slurm may give each node a different "
        "count; ask --gres=gpu:N per node"
    )
    assert f"slurm-{spread}" not in running
