"""gpufair decides where Slurm runs jobs: GPU memory and GPU cost steer the node type, nodes are
kept in step with Slurm, and jobs that cannot be mapped stay held with the reason in their
Comment."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from slurm_support import (
    BRIDGE_YAML,
    ROOT,
    bridge_config,
    cluster_config,
    cycle_until,
    make_bridge,
    sbatch,
    squeue,
)

from gpufair.cli import main
from gpufair.client import GpufairClient
from gpufair.integrations.slurm.config import load_config


def test_big_memory_job_lands_on_a100_and_small_job_on_cheaper_rtx(
    slurm: Any, client: GpufairClient
) -> None:
    # The example files: gpufair's side (no nodes) applied by the CLI, and the mapping file.
    example = ROOT / "examples" / "slurm"
    apply = ["apply", "-f", str(example / "cluster.yaml"), "--address", client.address]
    assert main([*apply, "--kinds", "gpu-type,pool,queue"]) == 0
    bridge = make_bridge(client, load_config(example / "bridge.yaml"))
    bridge.cycle()
    # Applied again once the bridge made the nodes: the file does not own them, they stay.
    assert main([*apply, "--kinds", "gpu-type,pool,queue"]) == 0
    nodes = {n.name: n for n in client.get_config().config.nodes}
    assert sorted(nodes) == ["a100-0", "a100-1", "rtx-0", "rtx-1"]
    assert {n.gpu_type for n in nodes.values()} == {"a100-80gb", "rtx4090-24gb"}
    assert all(n.gpu_count == 8 and n.pool == "gpu" and n.ready for n in nodes.values())
    assert nodes["a100-0"].cpu_millicores == 64_000 and nodes["rtx-0"].memory_mib == 128_000

    # 40 GiB per GPU: more than an RTX 4090 has. 2 GPUs of any type: the cheaper RTX serves.
    big = sbatch(slurm, account="acct-a", gres="gpu:2", constraint="gpumem40", seconds=30)
    small = sbatch(slurm, account="acct-b", gres="gpu:2", seconds=30)
    two_node = sbatch(slurm, account="acct-b", nodes=2, gres="gpu:4", seconds=30)
    lost = sbatch(slurm, account="acct-unknown", gres="gpu:1", seconds=30)

    def all_running() -> bool:
        jobs = squeue(slurm)
        return all(jobs[j]["job_state"] == "RUNNING" for j in (big, small, two_node))

    cycles = cycle_until(bridge, all_running, max_cycles=6)
    assert cycles <= 3  # submit + bind + release in one cycle; the start is seen in the next
    jobs = squeue(slurm)
    assert jobs[big]["nodes"] in ("a100-0", "a100-1")
    assert jobs[small]["nodes"] in ("rtx-0", "rtx-1")
    assert jobs[two_node]["nodes"] == "rtx-[0-1]"
    assert jobs[big]["gres_detail"] == ["gpu:a100:2(IDX:0-1)"]

    # The job of an account no queue is mapped to stays held, and says why.
    assert jobs[lost]["job_state"] == "PENDING" and jobs[lost]["priority"] == 0
    assert jobs[lost]["comment"] == (
        "gpufair: not scheduled: account 'acct-unknown' maps to no gpufair queue"
    )

    # gpufair counts what Slurm runs, with the GPU indices Slurm gave.
    bridge.cycle()
    running = {w.workload.uid: w for w in client.list_workloads(states=["running"])}
    assert set(running) == {f"slurm-{j}" for j in (big, small, two_node)}
    assert running[f"slurm-{big}"].gpu_type == "a100-80gb"
    assert [(p.node, list(p.gpu_indices)) for p in running[f"slurm-{big}"].pods] == [
        (jobs[big]["nodes"], [0, 1])
    ]

    # Cancelled in Slurm while running: stopped in gpufair at Slurm's end time.
    slurm.run("scancel", str(small))
    cycle_until(
        bridge,
        lambda: (
            not any(
                w.workload.uid == f"slurm-{small}"
                for w in client.list_workloads(states=["running"])
            )
        ),
        max_cycles=5,
    )


def test_drained_node_is_not_ready_in_gpufair(
    slurm: Any, client: GpufairClient, tmp_path: Path
) -> None:
    client.apply_config(cluster_config("gpu"))
    bridge = make_bridge(client, bridge_config())
    slurm.run("scontrol", "update", "NodeName=rtx-1", "State=DRAIN", "Reason=test")
    try:
        bridge.cycle()
        ready = {n.name: n.ready for n in client.get_config().config.nodes}
        assert ready == {"a100-0": True, "a100-1": True, "rtx-0": True, "rtx-1": False}
        # A job of 2 whole RTX nodes has only one ready RTX node: gpufair leaves it pending.
        job = sbatch(slurm, account="acct-a", nodes=2, gres="gpu:8", constraint="rtx4090")
        bridge.cycle()
        bridge.cycle()
        assert squeue(slurm)[job]["job_state"] == "PENDING"
        assert client.explain(f"slurm-{job}").state == "pending"
    finally:
        slurm.run("scontrol", "update", "NodeName=rtx-1", "State=RESUME")
    # One cycle of the command, as a site would run it from cron or by hand.
    config = tmp_path / "bridge.yaml"
    config.write_text(yaml.safe_dump(BRIDGE_YAML))
    assert (
        main(["slurm-bridge", "--config", str(config), "--once", "--address", client.address]) == 0
    )
    # A job submitted without a hold may start before the bridge holds it: gpufair counts it.
    unheld = sbatch(slurm, account="acct-b", gres="gpu:1", seconds=30, hold=False)
    cycle_until(
        bridge,
        lambda: (
            squeue(slurm)[unheld]["job_state"] == "RUNNING"
            and client.explain(f"slurm-{unheld}").state == "running"
        ),
        max_cycles=6,
    )
    # Resumed: Slurm reports it "not responding" for a moment, then idle; then it is ready again.
    cycle_until(
        bridge, lambda: all(n.ready for n in client.get_config().config.nodes), max_cycles=5
    )
