"""A node's slurmd dies and nobody touches the node, on the real Slurm.

Unlike test_slurm_node_failure.py, no operator sets the node DOWN: Slurm finds out itself. On
22.05 (seen in slurmctld.log with SlurmctldDebug=debug, MessageTimeout 10 s) slurmctld pings a
node a third of SlurmdTimeout after its last answer; a ping of the dead slurmd fails only after
about 11 s of connection attempts, and the next pass marks the node not responding (`mixed*`,
`NOT_RESPONDING` in `sinfo --json`). The next ping, to every node, again takes about 11 s; the
pass after it sets the node DOWN once it has not answered for SlurmdTimeout ("Nodes a100-0 not
responding, setting DOWN"), requeuing a `--requeue` job ("requeue job JobId=N due to failure of
node a100-0") and failing one without (NODE_FAIL, "Killing JobId=N on failed node a100-0"), both
at that second. With SlurmdTimeout=20 the node showed not responding 19-21 s after the kill and
went DOWN 30-33 s after it: its jobs stay RUNNING, the node not responding, for about 11 s.

The test runs its own cluster with SlurmdTimeout=20 (the shared cluster of conftest.py has
60 s, and a dead slurmd there would disturb the tests sharing it), in an xdist group of its
own, so that under `--dist loadgroup` it runs beside the shared cluster's tests, not after
them. Every wait for Slurm is a generous bound on bridge cycles; the only times compared are
Slurm's own.

What it shows: while the node does not respond, the bridge tells gpufair it is not ready (its
80 CU out of the pool) and ends no run; a job that fits only there, submitted then, stays
pending in gpufair and held in Slurm. When Slurm sets the node DOWN, the ledger gets one end per
run at Slurm's second: `preempted` for the requeued job, whose next run gpufair places on the
other A100 node (released at once, not after the requeue's 121 s delay), and `failed` for the
other. When slurmd comes back the node returns (ReturnToService=2), gpufair counts it again and
places the waiting job there; the requeued job's stale step there is killed and its new run
goes on.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from slurm_support import (
    bridge_config,
    cluster_config,
    cycle_until,
    make_bridge,
    own_cluster,
    runs_of,
    sbatch,
    squeue,
)
from sqlalchemy import Engine, text

from gpufair.client import GpufairClient
from gpufair.integrations.slurm.bridge import Bridge, CycleReport
from gpufair.integrations.slurm.records import SlurmNode
from gpufair.integrations.slurm.slurmctl import SlurmCtl

pytestmark = pytest.mark.xdist_group("slurmd_lost")

SLURMD_TIMEOUT_S = 20
# From the kill to DOWN: up to a ping interval (a third of SlurmdTimeout) and two failed pings
# of about 11 s each, 30-33 s here. In bridge cycles of 1 s or more, with room for a loaded machine.
CYCLES_TO_DOWN = 4 * SLURMD_TIMEOUT_S + 60


class WatchedSlurm(SlurmCtl):
    """The bridge's Slurm commands, keeping each `sinfo` read: what the bridge saw of the nodes."""

    def __init__(self) -> None:
        super().__init__()
        self.node_reads: list[dict[str, SlurmNode]] = []

    def nodes(self) -> list[SlurmNode]:
        nodes = super().nodes()
        self.node_reads.append({n.name: n for n in nodes})
        return nodes


@pytest.fixture
def lossy_slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A cluster of this test's own, with SlurmdTimeout 20 s."""
    with own_cluster(
        Path(tmp_path_factory.mktemp("slurmd-lost")), slurmd_timeout_s=SLURMD_TIMEOUT_S
    ) as cluster:
        yield cluster


def sinfo_state(cluster: Any, name: str) -> str:
    """The node's state as `sinfo` prints it: `mix`, `mix*` (not responding), `down*`."""
    return str(cluster.run("sinfo", "-h", "-N", "-n", name, "-o", "%t").stdout.split()[0])


def capacity_cu(db: Engine, pool: str) -> float:
    """The pool's capacity in CU now (its last change)."""
    with db.connect() as conn:
        value = conn.execute(
            text(
                "SELECT capacity_cu FROM pool_capacity_changes WHERE pool = :pool"
                " ORDER BY changed_at DESC LIMIT 1"
            ),
            {"pool": pool},
        ).scalar_one()
    return float(value)


def ends_of(db: Engine, uid: str) -> list[tuple[str, float]]:
    """The workload's end events in the ledger: (kind, time)."""
    with db.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT kind, extract(epoch FROM occurred_at)::float8 FROM ledger_events"
                " WHERE workload_uid = :uid AND kind IN ('stopped', 'preempted', 'failed')"
                " ORDER BY occurred_at"
            ),
            {"uid": uid},
        ).all()
    return [(str(r[0]), float(r[1])) for r in rows]


def logged_s(cluster: Any, needle: str, *, after_s: float = 0.0) -> float:
    """When slurmctld.log first has a line containing `needle` (its local-time stamp), from
    `after_s` on."""
    for line in (cluster.root / "log" / "slurmctld.log").read_text().splitlines():
        if needle in line:
            stamp = line[1 : line.index("]")]
            at_s = datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%S.%f").timestamp()
            if at_s >= after_s:
                return at_s
    raise AssertionError(f"no {needle!r} in slurmctld.log")


def submit(cluster: Any, *, account: str, gres: str, requeue: bool) -> int:
    out = cluster.run(
        "sbatch", "--parsable", "--hold", "--requeue" if requeue else "--no-requeue",
        "-p", "gpu", "-A", account, "-N1", f"--gres={gres}", "-o", "/dev/null",
        "--wrap", "sleep 600",
    ).stdout  # fmt: skip
    return int(out.strip().split(";")[0])


def test_a_node_whose_slurmd_dies_is_not_ready_then_down_and_back(
    lossy_slurm: Any, client: GpufairClient, db: Engine
) -> None:
    slurm = lossy_slurm
    client.apply_config(cluster_config("gpu"))
    watched = WatchedSlurm()
    bridge = Bridge(bridge_config(), client, watched)
    bridge.cycle()
    running = client.list_workloads

    def runs(*uids: str) -> bool:
        return {s.workload.uid for s in running(states=["running"])} >= set(uids)

    # Two jobs of 2 A100 on one node (gpufair packs them), 6 A100 on the other: the first
    # node keeps 4 GPUs free, the second 2.
    requeued = submit(slurm, account="acct-a", gres="gpu:a100:2", requeue=True)
    req_uid = f"slurm-{requeued}"
    cycle_until(bridge, lambda: runs(req_uid), max_cycles=10)
    failed = submit(slurm, account="acct-b", gres="gpu:a100:2", requeue=False)
    fail_uid = f"slurm-{failed}"
    cycle_until(bridge, lambda: runs(fail_uid), max_cycles=10)
    filler = sbatch(slurm, account="acct-b", gres="gpu:a100:6", seconds=600)
    cycle_until(bridge, lambda: runs(f"slurm-{filler}"), max_cycles=10)
    jobs = squeue(slurm)
    lost = jobs[requeued]["nodes"]
    [spare] = {"a100-0", "a100-1"} - {lost}
    assert (jobs[failed]["nodes"], jobs[filler]["nodes"]) == (lost, spare)
    first, fail_run = jobs[requeued], jobs[failed]
    assert capacity_cu(db, "gpu") == 192.0  # 2 x 8 A100 (10 CU each), 2 x 8 RTX 4090 (2 CU)

    slurm.kill_node(lost)
    try:
        # Not responding: the bridge tells gpufair the node is not ready.
        def not_ready() -> bool:
            [node] = [n for n in client.get_config().config.nodes if n.name == lost]
            return not node.ready

        cycle_until(bridge, not_ready, max_cycles=CYCLES_TO_DOWN)
        seen = watched.node_reads[-1][lost]
        assert (seen.state, "NOT_RESPONDING" in seen.state_flags) == ("mixed", True)
        assert capacity_cu(db, "gpu") == 112.0
        # Slurm has not acted on the jobs yet, nor has the bridge: both runs are open.
        before_down_s = time.time()
        jobs = squeue(slurm)
        assert (jobs[requeued]["job_state"], jobs[failed]["job_state"]) == ("RUNNING", "RUNNING")
        assert runs_of(db, req_uid) == [(first["start_time"], None, 2.0, "a100-80gb", None)]
        assert runs_of(db, fail_uid) == [(fail_run["start_time"], None, 2.0, "a100-80gb", None)]

        # A job of 4 A100 fits only on the node not responding: gpufair places it nowhere.
        waiting = submit(slurm, account="acct-b", gres="gpu:a100:4", requeue=True)
        wait_uid = f"slurm-{waiting}"
        # Up to 3 cycles while the bridge reads the node not responding; the first submits the
        # job and asks gpufair to place it. A cycle that reads it down goes with those below.
        window: list[CycleReport] = []
        reports: list[CycleReport] = []
        while len(window) < 3:
            report = bridge.cycle()
            read = watched.node_reads[-1][lost]
            if (read.state, "NOT_RESPONDING" in read.state_flags) != ("mixed", True):
                assert not report.errors, report.errors
                reports.append(report)
                break
            window.append(report)
        assert window, f"Slurm set {lost} down before a cycle saw it not responding"
        assert wait_uid in window[0].submitted
        assert all(not r.errors and not r.placed and not r.requeued for r in window), window
        explained = client.explain(wait_uid)
        assert explained.state == "pending"
        # Of the A100 nodes, the one with room is not ready, the other has too few GPUs free.
        filters = {f.filter: f.nodes_failed for f in explained.filters}
        assert (filters["not_ready"], filters["free_gpus"], filters["gpu_type"]) == (1, 1, 2)
        assert squeue(slurm)[waiting]["job_state"] == "PENDING"
        assert squeue(slurm)[waiting]["priority"] == 0  # held

        # Slurm sets the node DOWN: the requeued job's next run goes to the spare node.
        down_seen: list[float] = []

        def requeued_runs_again() -> bool:
            if not down_seen and sinfo_state(slurm, lost).startswith("down"):
                down_seen.append(time.time())
            job = squeue(slurm)[requeued]
            return job["job_state"] == "RUNNING" and len(runs_of(db, req_uid)) == 2

        cycle_until(bridge, requeued_runs_again, max_cycles=CYCLES_TO_DOWN, reports=reports)
        jobs = squeue(slurm)
        second, ended = jobs[requeued], jobs[failed]
        assert (second["nodes"], second["restart_cnt"]) == (spare, 1)
        assert (ended["job_state"], ended["state_reason"]) == ("NODE_FAIL", "NodeDown")
        down_s = logged_s(slurm, f"Nodes {lost} not responding, setting DOWN")
        requeue_s = logged_s(slurm, f"requeue job JobId={requeued} due to failure of node {lost}")
        assert logged_s(slurm, f"Killing JobId={failed} on failed node {lost}") >= requeue_s
        # Slurm's second of the DOWN: the failed job's end, and the requeued job's run end.
        end_s = float(ended["end_time"])
        assert int(before_down_s) <= end_s <= requeue_s <= down_s < end_s + 5
        [(start0, end0, gpus0, type0, kind0), later] = runs_of(db, req_uid)
        assert (start0, end0, gpus0, type0, kind0) == (
            first["start_time"],
            end_s,
            2.0,
            "a100-80gb",
            "preempted",
        )
        assert later == (second["start_time"], None, 2.0, "a100-80gb", None)
        assert ends_of(db, req_uid) == [("preempted", end_s)]  # one end, of run 0
        assert runs_of(db, fail_uid) == [
            (fail_run["start_time"], end_s, 2.0, "a100-80gb", "failed")
        ]
        assert ends_of(db, fail_uid) == [("failed", end_s)]
        # Placed by gpufair, once, on the spare node, not started by Slurm after its delay.
        assert [r.placed for r in reports if r.placed] == [{req_uid: [spare]}]
        assert second["start_time"] < end_s + 120
        assert [u for r in reports for u in r.requeued] == []  # the bridge evicted nothing
        # Still not ready, the waiting job pending.
        assert capacity_cu(db, "gpu") == 112.0
        assert client.explain(wait_uid).state == "pending"
        assert down_seen and down_seen[0] >= end_s
    finally:
        slurm.start_node(lost)
    # Back (ReturnToService=2): gpufair counts the node again and places the waiting job there.
    back: list[CycleReport] = []
    cycle_until(
        bridge,
        lambda: squeue(slurm)[waiting]["job_state"] == "RUNNING",
        max_cycles=20,
        reports=back,
    )
    assert squeue(slurm)[waiting]["nodes"] == lost
    assert capacity_cu(db, "gpu") == 192.0
    assert [r.placed for r in back if r.placed] == [{wait_uid: [lost]}]
    # The requeued job's stale step on the returned node is Slurm's to kill; its new run goes on.
    jobs = squeue(slurm)
    assert (jobs[requeued]["job_state"], jobs[requeued]["nodes"]) == ("RUNNING", spare)
    assert runs_of(db, req_uid)[1] == later
    assert ends_of(db, req_uid) == [("preempted", end_s)]
    assert ends_of(db, fail_uid) == [("failed", end_s)]


def test_a_job_requeued_off_a_lost_node_is_not_released_there_as_it_returns(
    lossy_slurm: Any, client: GpufairClient, db: Engine
) -> None:
    """The requeued job fits only on the node it was requeued off (the other A100 node is full):
    gpufair binds it there as soon as the node is back. slurmd is started at the start of a
    second (it registers within a few ms) and cycles run every 0.2 s from when Slurm shows the
    node idle, as a bridge's cycle may follow a node's return. The bridge must not release the
    job there within RELAUNCH_AFTER_S of the node's return, by Slurm's clock (slurmctld.log's
    "Node a100-1 now responding"). Before the bridge waited for a node's return
    (`_too_soon_after_return`), 3 of 3 runs released it 0.1 to 1.1 s after the registration, and
    Slurm killed the job in 2 of them ("Job credential revoked")."""
    slurm = lossy_slurm
    client.apply_config(cluster_config("gpu"))
    bridge = make_bridge(client, bridge_config())
    bridge.cycle()
    filler = sbatch(slurm, account="acct-b", gres="gpu:a100:8", seconds=600)
    cycle_until(bridge, lambda: squeue(slurm)[filler]["job_state"] == "RUNNING", max_cycles=10)
    spare = squeue(slurm)[filler]["nodes"]
    [lost] = {"a100-0", "a100-1"} - {spare}
    job = submit(slurm, account="acct-a", gres="gpu:a100:2", requeue=True)
    uid = f"slurm-{job}"
    cycle_until(bridge, lambda: squeue(slurm)[job]["job_state"] == "RUNNING", max_cycles=10)
    assert squeue(slurm)[job]["nodes"] == lost
    first = squeue(slurm)[job]

    slurm.kill_node(lost)
    try:
        # Slurm sets the node DOWN and requeues the job; the bridge ends its run and holds it.
        cycle_until(
            bridge,
            lambda: len(runs_of(db, uid)) == 1 and runs_of(db, uid)[0][1] is not None,
            max_cycles=CYCLES_TO_DOWN,
        )
        requeued = squeue(slurm)[job]
        assert (requeued["job_state"], requeued["restart_cnt"], requeued["priority"]) == (
            "PENDING",
            1,
            0,
        )
        assert sinfo_state(slurm, lost).startswith("down")
        for _ in range(2):
            report = bridge.cycle()
            assert not report.errors and not report.placed, report
    finally:
        time.sleep(1.02 - time.time() % 1)
        slurm.start_node(lost, poll_s=0.02)
    # Cycles every 0.2 s until the ledger has the next run (running, or killed by Slurm).
    reports: list[CycleReport] = []
    cycle_until(
        bridge, lambda: len(runs_of(db, uid)) == 2, max_cycles=100, period_s=0.2, reports=reports
    )
    assert [r.placed for r in reports if r.placed] == [{uid: [lost]}]
    registered_s = logged_s(slurm, f"Node {lost} now responding")
    released_s = logged_s(slurm, f"release hold on JobId={job} ", after_s=registered_s)
    # The defect: released there within a second of its return (by Slurm's clock, as the
    # requeue's RELAUNCH_AFTER_S is), so it may start in the second its credential was revoked.
    assert int(released_s) >= int(registered_s) + 2, (registered_s, released_s)
    second = squeue(slurm)[job]
    assert (second["job_state"], second["restart_cnt"], second["nodes"]) == ("RUNNING", 1, lost)
    assert second["start_time"] > int(registered_s)
    assert runs_of(db, uid) == [
        (first["start_time"], requeued["submit_time"], 2.0, "a100-80gb", "preempted"),
        (second["start_time"], None, 2.0, "a100-80gb", None),
    ]
