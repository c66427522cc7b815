"""`--constraint` expressions of GPU types and GPU memory against the real Slurm: for every OR of
the cluster's features (`a100|gpumem40`), and for ANDs and mixes of ANDs, ORs and parentheses
(`a100&gpumem80`, `rtx4090|a100&gpumem80`, `rtx4090|(a100&gpumem80)`), gpufair admits exactly the
nodes Slurm accepts, and places such jobs only where Slurm then runs them."""

from __future__ import annotations

from itertools import combinations, permutations, product
from typing import Any

from slurm_support import bridge_config, cluster_config, cycle_until, make_bridge, sbatch, squeue

from gpufair.client import GpufairClient
from gpufair.integrations.slurm.bridge import Bridge, CycleReport
from gpufair.integrations.slurm.constraints import gpu_choice
from gpufair.v1 import scheduler_pb2

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
    reports: list[CycleReport] = []

    def all_running() -> bool:
        seen = squeue(slurm)
        return all(seen[j]["job_state"] == "RUNNING" for j in jobs.values())

    cycle_until(bridge, all_running, max_cycles=20, reports=reports)
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


def and_and_mixed_expressions() -> list[str]:
    """Every expression of 2 to 4 of the cluster's features, in every order, joined left to
    right by & and | with at least one &; 3 features with parentheses either side; commas; an
    operator at the end. 12 + 72 + 168 + 96 + 4 = 352 expressions."""
    found = [f"{a}&{b}" for a, b in permutations(NAMES, 2)]
    for size in (3, 4):
        for names, ops in product(permutations(NAMES, size), product("&|", repeat=size - 1)):
            if "&" in ops:
                found.append(names[0] + "".join(o + n for o, n in zip(ops, names[1:], strict=True)))
    for (a, b, c), (o1, o2) in product(permutations(NAMES, 3), [("&", "|"), ("|", "&")]):
        found += [f"{a}{o1}({b}{o2}{c})", f"({a}{o1}{b}){o2}{c}"]
    found += ["a100,gpumem80", "rtx4090,gpumem40", "a100&", "rtx4090|"]
    return found


def admitted_nodes(client: GpufairClient, workload: Any) -> set[str]:
    """The nodes whose GPU type and GPU memory a workload's fields let gpufair use."""
    config = client.get_config().config
    memory = {t.name: t.memory_gib for t in config.gpu_types}
    return {
        n.name
        for n in config.nodes
        if (not workload.allowed_gpu_types or n.gpu_type in workload.allowed_gpu_types)
        and memory[n.gpu_type] >= workload.min_gpu_memory_gib
    }


def test_every_and_and_mixed_form_admits_the_nodes_slurm_accepts(
    slurm: Any, client: GpufairClient
) -> None:
    client.apply_config(cluster_config("gpu"))
    config = bridge_config(features=FEATURES)
    bridge = make_bridge(client, config)
    expressions = and_and_mixed_expressions()
    assert len(set(expressions)) == len(expressions) == 352
    accepted = {e: slurm_accepts(slurm, e) for e in expressions}
    # Slurm reads left to right: `rtx4090|a100&gpumem80` is (rtx4090|a100)&gpumem80.
    assert accepted["rtx4090|a100&gpumem80"] == {"a100-0", "a100-1"}
    assert accepted["rtx4090|(a100&gpumem80)"] == set(NODES)
    assert accepted["a100&gpumem80|rtx4090"] == set(NODES)

    # What Slurm refuses at submission (no node meets it): gpufair admits no node either.
    memory = {t.name: t.memory_gib for t in client.get_config().config.gpu_types}
    nowhere = [e for e in expressions if not accepted[e]]
    for expression in nowhere:
        choice = gpu_choice(config, expression, lambda: memory)
        if not isinstance(choice, str):
            fields = scheduler_pb2.Workload(
                allowed_gpu_types=sorted(choice.types), min_gpu_memory_gib=choice.min_memory_gib
            )
            assert admitted_nodes(client, fields) == set(), expression

    # The rest run as jobs: gpufair admits exactly Slurm's nodes, and each runs on one of them.
    jobs = {
        e: sbatch(slurm, account="acct-a", gres="gpu:1", constraint=e, seconds=600)
        for e in expressions
        if accepted[e]
    }
    assert len(jobs) + len(nowhere) == len(expressions)
    assert 100 < len(jobs) < len(expressions)
    reports: list[CycleReport] = []
    ran: dict[str, str] = {}
    placed: set[str] = set()

    def round_done() -> bool:
        """The last cycle placed nothing more, and everything placed runs (or ran)."""
        placed.update(reports[-1].placed)
        seen = squeue(slurm)
        started = all(
            seen[int(uid.removeprefix("slurm-"))]["job_state"] in ("RUNNING", "CANCELLED")
            for uid in placed
        )
        return not reports[-1].placed and started

    # Rounds: the 16 A100 GPUs hold 16 of the many A100-only 1-GPU jobs at a time; each round
    # runs what fits, then cancels it.
    for _ in range(40):
        cycle_until(bridge, round_done, max_cycles=8, reports=reports)
        ran.update(placed_where_slurm_runs(reports, slurm))
        seen = squeue(slurm)
        running = [j for j in jobs.values() if seen[j]["job_state"] == "RUNNING"]
        if running:
            slurm.run("scancel", *map(str, running))
        if len(ran) == len(jobs):
            break
    statuses = {s.workload.uid: s.workload for s in client.list_workloads(states=EVERY_STATE)}
    for expression, job_id in jobs.items():
        uid = f"slurm-{job_id}"
        assert admitted_nodes(client, statuses[uid]) == accepted[expression], expression
        assert ran[uid] in accepted[expression], expression
    print(f"{len(expressions)} expressions: {len(jobs)} ran, {len(nowhere)} refused by Slurm")


def test_what_a_workload_cannot_say_stays_held_with_why(slurm: Any, client: GpufairClient) -> None:
    client.apply_config(cluster_config("gpu"))
    bridge = make_bridge(client, bridge_config(features=FEATURES))
    held = {
        c: sbatch(slurm, account="acct-a", gres="gpu:1", constraint=c)
        for c in ("[a100|rtx4090]", "a100*1")
    }
    reports = [bridge.cycle()]
    assert reports[0].errors == []
    seen = squeue(slurm)
    for job_id in held.values():
        assert (seen[job_id]["job_state"], seen[job_id]["priority"]) == ("PENDING", 0)
    assert seen[held["[a100|rtx4090]"]]["comment"] == (
        "gpufair: not scheduled: constraint '[a100|rtx4090]': brackets are not supported: they "
        "ask for one alternative shared by all the job's nodes or a count of nodes per feature, "
        "and a workload asks the same GPUs of every pod"
    )
    assert seen[held["a100*1"]]["comment"] == (
        "gpufair: not scheduled: constraint 'a100*1': node counts ('*N') are not supported: they "
        "ask for a mix of nodes, and a workload asks the same GPUs of every pod"
    )


def run_until(bridge: Bridge, slurm: Any, running: list[int], reports: list[CycleReport]) -> None:
    def done() -> bool:
        seen = squeue(slurm)
        return all(seen[j]["job_state"] == "RUNNING" for j in running)

    # Slurm starts jobs on its own one-second tick, slower on a loaded machine.
    cycle_until(bridge, done, max_cycles=20, reports=reports)


def test_type_or_memory_jobs_run_only_where_slurm_accepts_them(
    slurm: Any, client: GpufairClient
) -> None:
    client.apply_config(cluster_config("gpu"))
    bridge = make_bridge(client, bridge_config(features=FEATURES))
    reports: list[CycleReport] = []

    # An A100, or any GPU of 40 GiB: the A100 nodes only, though the RTX nodes are free and
    # cheaper. The third whole-node job waits, as Slurm would make it wait.
    # Submitted in one second, they go in job-id order (the bridge's submit times): the first
    # two run, even when their ids cross a power of ten (9, 10, 11).
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
    # A start Slurm made after the last cycle's look is reported by the next one.
    reports.append(bridge.cycle())
    assert reports[-1].errors == []
    running = {w.workload.uid: w.gpu_type for w in client.list_workloads(states=["running"])}
    assert running == {
        f"slurm-{a3}": "a100-80gb",
        f"slurm-{r1}": "rtx4090-24gb",
        f"slurm-{r2}": "rtx4090-24gb",
        f"slurm-{r3}": "a100-80gb",
    }
