"""`--constraint` alternatives of GPU types and GPU memory (`a100|gpumem40`) against the real
Slurm: gpufair admits exactly the nodes Slurm accepts for every OR of the cluster's features, and
places such jobs only where Slurm then runs them."""

from __future__ import annotations

from itertools import combinations
from typing import Any

from slurm_support import bridge_config, cluster_config, cycle_until, make_bridge, sbatch, squeue

from gpufair.client import GpufairClient
from gpufair.integrations.slurm.bridge import Bridge, CycleReport

# The local cluster's node features: a100-* have a100, gpumem40, gpumem80; rtx-* have rtx4090.
FEATURES = {"gpumem40": {"min_gpu_memory_gib": 40}, "gpumem80": {"min_gpu_memory_gib": 80}}
NAMES = ("a100", "rtx4090", "gpumem40", "gpumem80")
NODES = ("a100-0", "a100-1", "rtx-0", "rtx-1")
EVERY_STATE = ["pending", "bound", "running", "finished", "cancelled"]


def slurm_accepts(slurm: Any, constraint: str) -> set[str]:
    """The nodes Slurm itself would run a 1-GPU job of `constraint` on (`sbatch --test-only`)."""
    accepted = set()
    for node in NODES:
        args = ["sbatch", "--test-only", "-p", "gpu", "-A", "acct-a", "-w", node, "--gres=gpu:1"]
        probe = slurm.run(*args, f"--constraint={constraint}", "--wrap", "true", check=False)
        if probe.returncode == 0:
            accepted.add(node)
        else:
            assert "Requested node configuration is not available" in probe.stderr, probe.stderr
    return accepted


def gpufair_admits(client: GpufairClient, uid: str) -> set[str]:
    """The nodes whose GPU type and GPU memory the workload's fields let gpufair use."""
    config = client.get_config().config
    memory = {t.name: t.memory_gib for t in config.gpu_types}
    (status,) = [s for s in client.list_workloads(states=EVERY_STATE) if s.workload.uid == uid]
    workload = status.workload
    return {
        n.name
        for n in config.nodes
        if (not workload.allowed_gpu_types or n.gpu_type in workload.allowed_gpu_types)
        and memory[n.gpu_type] >= workload.min_gpu_memory_gib
    }


def placed_where_slurm_runs(reports: list[CycleReport], slurm: Any) -> dict[str, str]:
    """Every job the bridge placed, with the node Slurm ran it on: the node it was pinned to (the
    tests cancel jobs, none ends by itself)."""
    jobs = squeue(slurm)
    where: dict[str, str] = {}
    for report in reports:
        for uid, nodes in report.placed.items():
            job = jobs[int(uid.removeprefix("slurm-"))]
            assert job["job_state"] in ("RUNNING", "CANCELLED"), (uid, job["job_state"])
            assert [job["nodes"]] == nodes, (uid, job["nodes"], nodes)
            where[uid] = job["nodes"]
    return where


def test_every_or_of_the_clusters_features_admits_the_nodes_slurm_accepts(
    slurm: Any, client: GpufairClient
) -> None:
    client.apply_config(cluster_config("gpu"))
    bridge = make_bridge(client, bridge_config(features=FEATURES))
    constraints = ["|".join(c) for size in (1, 2, 3, 4) for c in combinations(NAMES, size)]
    jobs = {
        c: sbatch(slurm, account="acct-a", gres="gpu:1", constraint=c, seconds=600)
        for c in constraints
    }
    refused = sbatch(slurm, account="acct-a", gres="gpu:1", constraint="a100&gpumem40")
    reports: list[CycleReport] = []

    def all_running() -> bool:
        seen = squeue(slurm)
        return all(seen[j]["job_state"] == "RUNNING" for j in jobs.values())

    cycle_until(bridge, all_running, max_cycles=6, reports=reports)
    where = placed_where_slurm_runs(reports, slurm)
    mixed = 0
    for constraint, job_id in jobs.items():
        accepted = slurm_accepts(slurm, constraint)
        assert gpufair_admits(client, f"slurm-{job_id}") == accepted, constraint
        assert where[f"slurm-{job_id}"] in accepted, constraint
        mixed += "gpumem" in constraint and any(t in constraint for t in ("a100", "rtx"))
    assert mixed == 9  # of the 15: held before, as no (types, memory) says them
    assert slurm_accepts(slurm, "a100|gpumem40") == {"a100-0", "a100-1"}
    assert slurm_accepts(slurm, "rtx4090|gpumem80") == set(NODES)

    # What one workload still cannot say stays held, with why.
    held = squeue(slurm)[refused]
    assert (held["job_state"], held["priority"]) == ("PENDING", 0)
    assert held["comment"] == (
        "gpufair: not scheduled: constraint 'a100&gpumem40': only one feature or 'a|b' is supported"
    )


def run_until(bridge: Bridge, slurm: Any, running: list[int], reports: list[CycleReport]) -> None:
    def done() -> bool:
        seen = squeue(slurm)
        return all(seen[j]["job_state"] == "RUNNING" for j in running)

    cycle_until(bridge, done, max_cycles=8, reports=reports)


def test_type_or_memory_jobs_run_only_where_slurm_accepts_them(
    slurm: Any, client: GpufairClient
) -> None:
    client.apply_config(cluster_config("gpu"))
    bridge = make_bridge(client, bridge_config(features=FEATURES))
    reports: list[CycleReport] = []

    # An A100, or any GPU of 40 GiB: the A100 nodes only, though the RTX nodes are free and
    # cheaper. The third whole-node job waits, as Slurm would make it wait.
    a1, a2, a3 = (
        sbatch(slurm, account="acct-a", gres="gpu:8", constraint="a100|gpumem40", seconds=600)
        for _ in range(3)
    )
    run_until(bridge, slurm, [a1, a2], reports)
    for _ in range(2):
        reports.append(bridge.cycle())
        assert reports[-1].errors == []
    where = placed_where_slurm_runs(reports, slurm)
    assert {where[f"slurm-{a1}"], where[f"slurm-{a2}"]} == {"a100-0", "a100-1"}
    assert f"slurm-{a3}" not in where
    assert squeue(slurm)[a3]["job_state"] == "PENDING"
    assert client.explain(f"slurm-{a3}").state == "pending"
    idle = {n.name for n in client.get_config().config.nodes} - set(where.values())
    assert idle == {"rtx-0", "rtx-1"}
    assert slurm_accepts(slurm, "a100|gpumem40") & idle == set()

    # An A100 frees: the waiting job runs there.
    slurm.run("scancel", str(a1))
    run_until(bridge, slurm, [a3], reports)
    assert placed_where_slurm_runs(reports, slurm)[f"slurm-{a3}"] == where[f"slurm-{a1}"]

    # An RTX 4090, or any GPU of 80 GiB: the RTX nodes first (cheaper), then an A100 once one
    # frees, which a job of `rtx4090` alone would never get.
    r1, r2, r3 = (
        sbatch(slurm, account="acct-a", gres="gpu:8", constraint="rtx4090|gpumem80", seconds=600)
        for _ in range(3)
    )
    run_until(bridge, slurm, [r1, r2], reports)
    where = placed_where_slurm_runs(reports, slurm)
    assert {where[f"slurm-{r1}"], where[f"slurm-{r2}"]} == {"rtx-0", "rtx-1"}
    assert squeue(slurm)[r3]["job_state"] == "PENDING"
    slurm.run("scancel", str(a2))
    run_until(bridge, slurm, [r3], reports)
    assert placed_where_slurm_runs(reports, slurm)[f"slurm-{r3}"] == where[f"slurm-{a2}"]
    running = {w.workload.uid: w.gpu_type for w in client.list_workloads(states=["running"])}
    assert running == {
        f"slurm-{a3}": "a100-80gb",
        f"slurm-{r1}": "rtx4090-24gb",
        f"slurm-{r2}": "rtx4090-24gb",
        f"slurm-{r3}": "a100-80gb",
    }
