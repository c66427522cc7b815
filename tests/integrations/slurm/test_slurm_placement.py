"""gpufair decides where Slurm runs jobs: GPU memory and GPU cost steer the node type, nodes are
kept in step with Slurm, and jobs that cannot be mapped stay held with the reason in their
Comment."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from slurm_support import (
    BRIDGE_YAML,
    ROOT,
    bridge_config,
    cluster_config,
    cycle_until,
    make_bridge,
    runs_of,
    sbatch,
    squeue,
)
from sqlalchemy import Engine

from gpufair.cli import main
from gpufair.client import GpufairClient, started, stopped
from gpufair.integrations.slurm.bridge import CycleReport
from gpufair.integrations.slurm.config import load_config
from gpufair.integrations.slurm.records import gpu_indices
from gpufair.v1 import cluster_pb2, ledger_pb2, scheduler_pb2


def test_big_memory_job_lands_on_a100_and_small_job_on_cheaper_rtx(
    slurm: Any, client: GpufairClient, db: Engine
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
    uid = f"slurm-{small}"
    cycle_until(bridge, lambda: client.explain(uid).state == "finished", max_cycles=5)
    cancelled = squeue(slurm)[small]
    assert cancelled["job_state"] == "CANCELLED"
    assert runs_of(db, uid) == [
        (
            float(cancelled["start_time"]),
            float(cancelled["end_time"]),
            2.0,
            "rtx4090-24gb",
            "stopped",
        )
    ]


def bridge_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "gpufair.slurm_bridge" and r.levelno >= logging.WARNING
    ]


def gpufair_nodes(client: GpufairClient) -> dict[str, tuple[str, int, bool]]:
    return {n.name: (n.gpu_type, n.gpu_count, n.ready) for n in client.get_config().config.nodes}


SLURM_NODES = {
    "a100-0": ("a100-80gb", 8, True),
    "a100-1": ("a100-80gb", 8, True),
    "rtx-0": ("rtx4090-24gb", 8, True),
    "rtx-1": ("rtx4090-24gb", 8, True),
}


def test_drained_node_is_not_ready_in_gpufair(
    slurm: Any, client: GpufairClient, db: Engine, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    client.apply_config(cluster_config("gpu"))
    config = tmp_path / "bridge.yaml"
    config.write_text(yaml.safe_dump(BRIDGE_YAML))
    once = ["slurm-bridge", "--config", str(config), "--once", "--address", client.address]
    bridge = make_bridge(client, bridge_config())
    slurm.run("scontrol", "update", "NodeName=rtx-1", "State=DRAIN", "Reason=test")
    try:
        # One cycle of the command, as a site would run it from cron or by hand: it makes the
        # nodes, the drained one not ready, and exits 0 as no step of it failed.
        with caplog.at_level(logging.INFO, logger="gpufair.slurm_bridge"):
            assert main(once) == 0
        assert bridge_warnings(caplog) == []
        assert gpufair_nodes(client) == {**SLURM_NODES, "rtx-1": ("rtx4090-24gb", 8, False)}
        # A job of 2 whole RTX nodes has only one ready RTX node: gpufair leaves it pending.
        job = sbatch(slurm, account="acct-a", nodes=2, gres="gpu:8", constraint="rtx4090")
        assert bridge.cycle().submitted == [f"slurm-{job}"]
        assert bridge.cycle().placed == {}
        assert squeue(slurm)[job]["job_state"] == "PENDING"
        explained = client.explain(f"slurm-{job}")
        assert (explained.state, explained.needs_cu) == ("pending", 32)
    finally:
        slurm.run("scontrol", "update", "NodeName=rtx-1", "State=RESUME")
    # Cancelled in Slurm before it ever ran: gpufair cancels the workload.
    slurm.run("scancel", str(job))
    reports: list[CycleReport] = []
    cycle_until(
        bridge,
        lambda: client.explain(f"slurm-{job}").state == "cancelled",
        max_cycles=3,
        reports=reports,
    )
    assert [r.cancelled for r in reports] == [[f"slurm-{job}"]]

    # A job submitted without a hold that Slurm starts before the bridge looks: gpufair learns
    # of it (submitted, never pinned), then of its start, on the node and GPUs Slurm chose.
    unheld = sbatch(slurm, account="acct-b", gres="gpu:1", seconds=30, hold=False)
    deadline = time.monotonic() + 20.0
    while squeue(slurm)[unheld]["job_state"] != "RUNNING":
        assert time.monotonic() < deadline, "Slurm did not start the job submitted unheld"
        time.sleep(0.2)
    uid = f"slurm-{unheld}"
    first = bridge.cycle()
    assert (first.submitted, first.placed, first.errors) == ([uid], {}, [])
    second = bridge.cycle()
    assert (second.events, second.errors) == ({"STORED": 1}, [])
    seen = squeue(slurm)[unheld]
    assert (seen["job_state"], seen["restart_cnt"]) == ("RUNNING", 0)
    running = {w.workload.uid: w for w in client.list_workloads(states=["running"])}
    assert [(p.node, list(p.gpu_indices)) for p in running[uid].pods] == [
        (seen["nodes"], gpu_indices(seen["gres_detail"][0]))
    ]
    assert [run[0] for run in runs_of(db, uid)] == [seen["start_time"]]

    # Resumed: Slurm reports it "not responding" for a moment, then idle; then it is ready again.
    cycle_until(bridge, lambda: gpufair_nodes(client) == SLURM_NODES, max_cycles=5)


def test_draining_node_keeps_its_running_job_counted_and_takes_no_new_work(
    slurm: Any, client: GpufairClient, db: Engine
) -> None:
    """Slurm 22.05 shows a node drained while a job runs there as `mixed` with the DRAIN flag
    (`sinfo`: draining), and as `idle` with DRAIN (drained) once the job ended. gpufair has it
    not ready in both, as after `gpufair drain`: the job there runs on and counts as its queue's
    (allocated CU, usage, its run's end in the ledger), no new work is bound on the node's free
    GPUs, and the capacity the fair share divides leaves out the node's free GPUs, and its
    running work's once that has ended (09d66cf), until Slurm resumes it."""
    client.apply_config(cluster_config("gpu"))
    bridge = make_bridge(client, bridge_config())
    bridge.cycle()
    mine = sbatch(slurm, account="acct-a", gres="gpu:2", constraint="a100", seconds=600)
    cycle_until(bridge, lambda: squeue(slurm)[mine]["job_state"] == "RUNNING", max_cycles=6)
    node = squeue(slurm)[mine]["nodes"]
    other = "a100-1" if node == "a100-0" else "a100-0"
    filler = sbatch(slurm, account="acct-b", gres="gpu:8", constraint="a100", seconds=600)
    cycle_until(bridge, lambda: squeue(slurm)[filler]["job_state"] == "RUNNING", max_cycles=6)
    assert squeue(slurm)[filler]["nodes"] == other
    uid = f"slurm-{mine}"
    cycle_until(bridge, lambda: client.explain(uid).state == "running", max_cycles=3)

    slurm.run("scontrol", "update", f"NodeName={node}", "State=DRAIN", "Reason=test")
    try:
        raw = {n["name"]: n for n in json.loads(slurm.run("sinfo", "--json").stdout)["nodes"]}
        assert (raw[node]["state"], raw[node]["state_flags"]) == ("mixed", ["DRAIN"])
        # 2 A100 GPUs that fit only on the draining node's 6 free ones: not placed there.
        waiting = sbatch(slurm, account="acct-b", gres="gpu:2", constraint="a100", seconds=5)
        for _ in range(3):
            report = bridge.cycle()
            assert (report.placed, report.errors) == ({}, [])
        assert gpufair_nodes(client)[node] == ("a100-80gb", 8, False)
        assert squeue(slurm)[waiting]["job_state"] == "PENDING"
        assert client.explain(f"slurm-{waiting}").state == "pending"
        [running] = [w for w in client.list_workloads(states=["running"]) if w.workload.uid == uid]
        assert [(p.node, list(p.gpu_indices)) for p in running.pods] == [(node, [0, 1])]
        shares = client.get_fair_share("gpu")
        # The other A100 node, the RTX nodes, and the 2 GPUs the job holds on the drained node.
        assert shares.capacity_cu == 8 * 10 + 16 * 2 + 2 * 10
        allocated = {q.queue: q.allocated_cu for q in shares.queues}
        assert allocated == {"team-a": 20, "team-b": 80}

        # The job ends: drained, still not ready; its run's end is in the ledger.
        slurm.run("scancel", str(mine))
        cycle_until(bridge, lambda: client.explain(uid).state == "finished", max_cycles=5)
        raw = {n["name"]: n for n in json.loads(slurm.run("sinfo", "--json").stdout)["nodes"]}
        assert (raw[node]["state"], raw[node]["state_flags"]) == ("idle", ["DRAIN"])
        assert bridge.cycle().placed == {}
        assert gpufair_nodes(client)[node] == ("a100-80gb", 8, False)
        ended = squeue(slurm)[mine]
        assert runs_of(db, uid) == [
            (ended["start_time"], ended["end_time"], 2.0, "a100-80gb", "stopped")
        ]
        # Its work ended: the drained node's GPUs are out of the capacity divided.
        cycle_until(
            bridge,
            lambda: client.get_fair_share("gpu").capacity_cu == 8 * 10 + 16 * 2,
            max_cycles=5,
        )
    finally:
        slurm.run("scontrol", "update", f"NodeName={node}", "State=RESUME")
    # Resumed: ready again, and the waiting job is placed there.
    cycle_until(bridge, lambda: squeue(slurm)[waiting]["job_state"] == "RUNNING", max_cycles=6)
    assert gpufair_nodes(client)[node] == ("a100-80gb", 8, True)
    assert squeue(slurm)[waiting]["nodes"] == node


def _run_of_another_system(
    client: GpufairClient,
    uid: str,
    node: str,
    gpu_type: str,
    gpu_count: int = 8,
    gpus: tuple[int, int] = (0, 1),
) -> None:
    """`node` stored in pool gpu as `gpu_count` GPUs of `gpu_type`, with workload `uid` running
    on two of them (`gpus`): work the bridge did not place."""
    stored = cluster_pb2.Node(
        name=node,
        pool="gpu",
        gpu_type=gpu_type,
        gpu_count=gpu_count,
        cpu_millicores=64_000,
        memory_mib=512_000,
        ready=True,
    )
    client.upsert_nodes([stored])
    work = scheduler_pb2.Workload(uid=uid, queue="team-a", pool="gpu", pods=1, gpus_per_pod=2)
    assert [r.accepted for r in client.submit_workloads([work]).results] == [True]
    on_it = [ledger_pb2.EventPod(node=node, gpu_indices=list(gpus), gpu_fraction=1.0)]
    stored_events = client.report_events([started(uid, on_it)]).results
    assert [r.status for r in stored_events] == [ledger_pb2.EVENT_STATUS_STORED]


def test_node_slurm_retypes_keeps_gpufairs_type_while_work_holds_it(
    slurm: Any, client: GpufairClient
) -> None:
    """gpufair has a100-0 as an RTX node with a run of another system on two of its GPUs; Slurm
    says it is an A100 node. gpufair refuses to change a node's GPU type under work, so before,
    the bridge's node update failed twice and the whole cycle with it, every cycle while the
    run lasted. Now the other nodes are updated, a100-0 keeps its type until the run ends, and
    the next cycle after that retypes it."""
    client.apply_config(cluster_config("gpu"))
    _run_of_another_system(client, "batch-8", "a100-0", "rtx4090-24gb")

    bridge = make_bridge(client, bridge_config())
    [error] = bridge.cycle().errors
    assert error.startswith(
        "nodes: not moved yet: cannot change the pool or GPU type of node a100-0. In use: "
        "running workload batch-8 uses node a100-0."
    )
    assert gpufair_nodes(client) == {**SLURM_NODES, "a100-0": ("rtx4090-24gb", 8, True)}

    assert [r.status for r in client.report_events([stopped("batch-8")]).results] == [
        ledger_pb2.EVENT_STATUS_STORED
    ]
    assert bridge.cycle().errors == []
    assert gpufair_nodes(client) == SLURM_NODES


def test_node_slurm_shrinks_keeps_gpufairs_gpus_while_work_holds_them(
    slurm: Any, client: GpufairClient
) -> None:
    """gpufair has a100-0 with 16 GPUs and a run of another system on GPUs 8 and 9; Slurm says
    it has 8. gpufair refuses a shrink that would take GPUs from work: the bridge updates the
    other nodes, keeps a100-0 at 16 while the run lasts, and shrinks it in the next cycle."""
    client.apply_config(cluster_config("gpu"))
    _run_of_another_system(client, "batch-9", "a100-0", "a100-80gb", gpu_count=16, gpus=(8, 9))

    bridge = make_bridge(client, bridge_config())
    [error] = bridge.cycle().errors
    assert error.startswith(
        "nodes: not moved yet: cannot shrink node a100-0 to 8 GPUs. In use: "
        "running workload batch-9 uses GPU 9 of node a100-0."
    )
    assert gpufair_nodes(client) == {**SLURM_NODES, "a100-0": ("a100-80gb", 16, True)}

    assert [r.status for r in client.report_events([stopped("batch-9")]).results] == [
        ledger_pb2.EVENT_STATUS_STORED
    ]
    assert bridge.cycle().errors == []
    assert gpufair_nodes(client) == SLURM_NODES


def test_a_refused_shrink_keeps_only_that_nodes_count(slurm: Any, client: GpufairClient) -> None:
    """gpufair has a100-0 and a100-1 with 16 GPUs each and rtx-0 as an A100 node; Slurm says 8,
    8 and RTX. Only a100-0 has work, a run of another system on GPUs 8 and 9, so gpufair refuses
    its shrink. Before, the bridge then kept gpufair's count, pool and type for every node Slurm
    had changed until that run ended: a100-1 at 16 GPUs, 8 that Slurm does not have, and rtx-0
    an A100 node. Now only a100-0 keeps its 16; the others are as Slurm has them at once."""
    client.apply_config(cluster_config("gpu"))
    stale = [
        cluster_pb2.Node(name="a100-1", gpu_type="a100-80gb", gpu_count=16),
        cluster_pb2.Node(name="rtx-0", gpu_type="a100-80gb", gpu_count=8),
    ]
    for node in stale:
        node.pool, node.cpu_millicores, node.memory_mib, node.ready = "gpu", 64_000, 512_000, True
    client.upsert_nodes(stale)
    _run_of_another_system(client, "batch-10", "a100-0", "a100-80gb", gpu_count=16, gpus=(8, 9))
    assert gpufair_nodes(client)["a100-1"] == ("a100-80gb", 16, True)

    bridge = make_bridge(client, bridge_config())
    [error] = bridge.cycle().errors
    assert error.startswith(
        "nodes: not moved yet: cannot shrink node a100-0 to 8 GPUs. In use: "
        "running workload batch-10 uses GPU 9 of node a100-0."
    )
    assert gpufair_nodes(client) == {**SLURM_NODES, "a100-0": ("a100-80gb", 16, True)}
    assert [r.status for r in client.report_events([stopped("batch-10")]).results] == [
        ledger_pb2.EVENT_STATUS_STORED
    ]
    assert bridge.cycle().errors == []
    assert gpufair_nodes(client) == SLURM_NODES


def test_node_gone_from_slurm_is_pruned_once_no_work_uses_it(
    slurm: Any, client: GpufairClient, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    client.apply_config(cluster_config("gpu"))
    config = tmp_path / "bridge.yaml"
    config.write_text(yaml.safe_dump(BRIDGE_YAML))
    once = ["slurm-bridge", "--config", str(config), "--once", "--address", client.address]
    # A node of the bridge's pool that Slurm no longer has, with a run of another system on it.
    _run_of_another_system(client, "batch-7", "a100-9", "a100-80gb")

    # The cycle updates Slurm's nodes but may not delete one that work uses: it says so, and
    # `--once` exits 1 for the step that failed.
    with caplog.at_level(logging.INFO, logger="gpufair.slurm_bridge"):
        assert main(once) == 1
    refused = (
        "nodes: not pruned yet: cannot delete node a100-9. In use: running workload batch-7 "
        "uses node a100-9. Nothing was changed."
    )
    assert bridge_warnings(caplog) == [refused]
    assert gpufair_nodes(client) == {**SLURM_NODES, "a100-9": ("a100-80gb", 8, True)}

    # A bridge that keeps running tries again each cycle, and prunes once the run has ended.
    bridge = make_bridge(client, bridge_config())
    assert bridge.cycle().errors == [refused]
    assert [r.status for r in client.report_events([stopped("batch-7")]).results] == [
        ledger_pb2.EVENT_STATUS_STORED
    ]
    assert bridge.cycle().errors == []
    assert gpufair_nodes(client) == SLURM_NODES
