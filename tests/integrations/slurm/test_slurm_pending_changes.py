"""Jobs changed while they wait, as Slurm users change them, against the real Slurm.

A job the bridge has submitted to gpufair may then be held by an operator or by its owner (whose
hold of a held job Slurm ignores: the cluster's job_submit.lua records it as a begin time), be
given a begin time by its owner (`scontrol update StartTime=`), wait for a dependency (on a job
or a whole array), or have its GPU count, partition, constraint or node count changed with
`scontrol update`. gpufair never places a job Slurm would not start now, or its user held (held
by an operator or its user, before its begin time, dependency not met, the minutes of
`after:N+m` counted on Slurm's clock), and a job whose request changed is placed by its new
request: a workload's uid names
one request for good, so the bridge submits the new one as the job's next revision
(`slurm-N.1`) and withdraws the old.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
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

from gpufair.client import GpufairClient
from gpufair.integrations.slurm.bridge import Bridge, CycleReport
from gpufair.integrations.slurm.job_states import OWNER_RELEASE_BEGIN_S, USER_HOLD_BEGIN_S
from gpufair.integrations.slurm.mapping import job_id_of
from gpufair.integrations.slurm.records import expand_hostlist, gpu_indices
from gpufair.integrations.slurm.slurmctl import SlurmCtl
from gpufair.v1 import cluster_pb2, scheduler_pb2


def active(client: GpufairClient, job_id: int) -> list[scheduler_pb2.WorkloadStatus]:
    """The job's waiting, bound or running workloads in gpufair."""
    config = bridge_config()
    return [w for w in client.list_workloads() if job_id_of(config, w.workload.uid) == job_id]


def fill_rtx(slurm: Any, bridge: Bridge) -> list[int]:
    """Two whole-node jobs, running on both RTX nodes."""
    blockers = [sbatch(slurm, account="acct-b", partition="rtx", gres="gpu:8", seconds=600)]
    blockers.append(sbatch(slurm, account="acct-b", partition="rtx", gres="gpu:8", seconds=600))
    cycle_until(bridge, lambda: running(slurm, *blockers), max_cycles=20)
    return blockers


def running(slurm: Any, *jobs: int) -> bool:
    seen = squeue(slurm)
    return all(seen[j]["job_state"] == "RUNNING" for j in jobs)


def rtx_bridge(client: GpufairClient) -> Bridge:
    client.apply_config(cluster_config("rtx"))
    bridge = make_bridge(client, bridge_config(partitions={"rtx": "rtx"}))
    bridge.cycle()
    return bridge


def waiting_job(slurm: Any, bridge: Bridge, client: GpufairClient, **options: Any) -> int:
    """A job submitted to gpufair that waits there for room."""
    job = sbatch(slurm, account="acct-a", partition="rtx", seconds=600, **options)
    assert not bridge.cycle().errors
    [status] = active(client, job)
    assert status.state == "pending", status
    return job


def gpus_where_it_runs(slurm: Any, job: int) -> list[tuple[str, int]]:
    seen = squeue(slurm)[job]
    used = [len(gpu_indices(d)) for d in seen["gres_detail"]]
    return list(zip(expand_hostlist(seen["nodes"]), used, strict=True))


def test_gpu_count_changed_while_waiting_runs_with_the_new_count(
    slurm: Any, client: GpufairClient
) -> None:
    bridge = rtx_bridge(client)
    blockers = fill_rtx(slurm, bridge)
    job = waiting_job(slurm, bridge, client, gres="gpu:1")
    slurm.run("scontrol", "update", f"JobId={job}", "Gres=gpu:6")
    report = bridge.cycle()
    assert not report.errors
    [status] = active(client, job)
    assert (status.workload.uid, status.workload.gpus_per_pod) == (f"slurm-{job}.1", 6)
    assert report.withdrawn.keys() == {f"slurm-{job}"}
    assert client.explain(f"slurm-{job}").state == "cancelled"
    slurm.run("scancel", str(blockers[0]))
    cycle_until(bridge, lambda: running(slurm, job), max_cycles=20)
    [(node, gpus)] = gpus_where_it_runs(slurm, job)
    assert gpus == 6
    cycle_until(bridge, lambda: active(client, job)[0].state == "running", max_cycles=5)
    [status] = active(client, job)
    assert [(p.node, len(p.gpu_indices)) for p in status.pods] == [(node, 6)]


def test_node_count_changed_while_waiting_runs_on_as_many_nodes(
    slurm: Any, client: GpufairClient
) -> None:
    bridge = rtx_bridge(client)
    blockers = fill_rtx(slurm, bridge)
    job = waiting_job(slurm, bridge, client, gres="gpu:2")
    slurm.run("scontrol", "update", f"JobId={job}", "NumNodes=2-2")
    assert not bridge.cycle().errors
    [status] = active(client, job)
    assert (status.workload.pods, status.workload.pods_on_distinct_nodes) == (2, True)
    slurm.run("scancel", *map(str, blockers))
    cycle_until(bridge, lambda: running(slurm, job), max_cycles=20)
    assert sorted(gpus_where_it_runs(slurm, job)) == [("rtx-0", 2), ("rtx-1", 2)]


def test_constraint_changed_while_waiting_runs_where_the_new_one_allows(
    slurm: Any, client: GpufairClient
) -> None:
    client.apply_config(cluster_config("gpu"))
    bridge = make_bridge(client, bridge_config())
    bridge.cycle()
    blockers = [
        sbatch(slurm, account="acct-b", gres="gpu:8", constraint="rtx4090", seconds=600)
        for _ in range(2)
    ]
    cycle_until(bridge, lambda: running(slurm, *blockers), max_cycles=20)
    job = sbatch(slurm, account="acct-a", gres="gpu:1", constraint="rtx4090", seconds=600)
    assert not bridge.cycle().errors
    assert [s.state for s in active(client, job)] == ["pending"]  # the RTX nodes are full
    slurm.run("scontrol", "update", f"JobId={job}", "Features=a100")
    cycle_until(bridge, lambda: running(slurm, job), max_cycles=20)
    [(node, _)] = gpus_where_it_runs(slurm, job)
    assert node.startswith("a100-")


def test_partition_changed_while_waiting_moves_to_the_new_pool(
    slurm: Any, client: GpufairClient
) -> None:
    config = cluster_config("rtx")
    config.pools.append(cluster_pb2.NodePool(name="a100", policy=config.pools[0].policy))
    for queue in config.queues:
        queue.quotas.append(cluster_pb2.QueueQuota(pool="a100", deserved_cu=0))
    client.apply_config(config)
    bridge = make_bridge(client, bridge_config(partitions={"rtx": "rtx", "a100": "a100"}))
    bridge.cycle()
    fill_rtx(slurm, bridge)
    job = waiting_job(slurm, bridge, client, gres="gpu:1")
    slurm.run("scontrol", "update", f"JobId={job}", "Partition=a100")
    cycle_until(bridge, lambda: running(slurm, job), max_cycles=20)
    [(node, _)] = gpus_where_it_runs(slurm, job)
    assert node.startswith("a100-")
    cycle_until(bridge, lambda: active(client, job)[0].state == "running", max_cycles=5)
    assert active(client, job)[0].workload.pool == "a100"


def test_job_held_by_an_operator_is_not_placed_until_released(
    slurm: Any, client: GpufairClient
) -> None:
    bridge = rtx_bridge(client)
    blockers = fill_rtx(slurm, bridge)
    job = waiting_job(slurm, bridge, client, gres="gpu:8")
    slurm.run("scontrol", "hold", str(job))
    assert squeue(slurm)[job]["state_reason"] == "JobHeldAdmin"
    report = bridge.cycle()
    assert report.withdrawn.keys() == {f"slurm-{job}"}
    assert active(client, job) == []
    # Room frees: the held job is not placed, cycle after cycle.
    slurm.run("scancel", str(blockers[0]))
    for _ in range(4):
        report = bridge.cycle()
        assert not report.errors and not report.placed and not report.submitted
    seen = squeue(slurm)[job]
    assert (seen["job_state"], seen["state_reason"]) == ("PENDING", "JobHeldAdmin")
    assert seen["comment"].startswith(f"gpufair: not scheduled (withdrew slurm-{job}): held by")
    # Handed back with a user hold (the hold stays, so Slurm cannot start it by itself): gpufair
    # places it, as a new revision (the old uid stays cancelled).
    slurm.run("scontrol", "uhold", str(job))
    assert squeue(slurm)[job]["state_reason"] == "JobHeldUser"
    reports: list[CycleReport] = []
    cycle_until(bridge, lambda: running(slurm, job), max_cycles=20, reports=reports)
    assert [uid for r in reports for uid in r.placed] == [f"slurm-{job}.1"]
    cycle_until(bridge, lambda: active(client, job)[0].state == "running", max_cycles=5)
    assert active(client, job)[0].workload.uid == f"slurm-{job}.1"


def test_a_job_handed_back_no_longer_says_not_scheduled_and_revisions_survive_restarts(
    slurm: Any, client: GpufairClient
) -> None:
    bridge = rtx_bridge(client)
    fill_rtx(slurm, bridge)
    job = waiting_job(slurm, bridge, client, gres="gpu:8")
    previous = f"slurm-{job}"
    for revision in (1, 2):
        slurm.run("scontrol", "hold", str(job))
        assert bridge.cycle().withdrawn.keys() == {previous}
        slurm.run("scontrol", "uhold", str(job))
        bridge = make_bridge(client, bridge_config(partitions={"rtx": "rtx"}))  # a restart
        report = bridge.cycle()
        assert (report.submitted, report.errors) == ([f"slurm-{job}.{revision}"], [])
        assert squeue(slurm)[job]["comment"] == (
            f"gpufair: submitted as slurm-{job}.{revision} (withdrew {previous})"
        )
        assert [s.workload.uid for s in active(client, job)] == [f"slurm-{job}.{revision}"]
        previous = f"slurm-{job}.{revision}"


def test_job_waiting_for_a_dependency_is_not_placed_until_it_is_met(
    slurm: Any, client: GpufairClient
) -> None:
    bridge = rtx_bridge(client)
    first = sbatch(slurm, account="acct-a", partition="rtx", gres="gpu:1", seconds=6)
    cycle_until(bridge, lambda: running(slurm, first), max_cycles=20)
    args = ["sbatch", "--parsable", "--hold", "-p", "rtx", "-A", "acct-a", "--gres=gpu:1"]
    args += ["-o", "/dev/null", f"--dependency=afterok:{first}", "--wrap", "sleep 600"]
    then = int(slurm.run(*args).stdout.strip())
    # Free GPUs, but `then` waits for `first` to complete.
    report = bridge.cycle()
    assert not report.errors and f"slurm-{then}" not in report.placed
    assert active(client, then) == []
    assert squeue(slurm)[then]["comment"] == (
        f"gpufair: not scheduled: waits for dependency afterok:{first} (job {first} RUNNING)"
    )
    cycle_until(bridge, lambda: running(slurm, then), max_cycles=30)
    assert squeue(slurm)[first]["job_state"] == "COMPLETED"

    # A dependency that can never be met: never placed.
    doomed = sbatch(slurm, account="acct-a", partition="rtx", gres="gpu:1", seconds=600)
    slurm.run("scontrol", "update", f"JobId={doomed}", "Dependency=")
    later = int(
        slurm.run(*args[:-3], f"--dependency=afterok:{doomed}", "--wrap", "true").stdout.strip()
    )
    slurm.run("scancel", str(doomed))
    for _ in range(3):
        assert not bridge.cycle().errors
    assert active(client, later) == []
    assert squeue(slurm)[later]["comment"] == (
        f"gpufair: not scheduled: dependency afterok:{doomed} can never be met "
        f"(job {doomed} CANCELLED)"
    )


def test_dependency_added_while_waiting_withdraws_the_workload(
    slurm: Any, client: GpufairClient
) -> None:
    bridge = rtx_bridge(client)
    blockers = fill_rtx(slurm, bridge)
    job = waiting_job(slurm, bridge, client, gres="gpu:8")
    slurm.run("scontrol", "update", f"JobId={job}", f"Dependency=afterany:{blockers[1]}")
    assert bridge.cycle().withdrawn.keys() == {f"slurm-{job}"}
    slurm.run("scancel", str(blockers[0]))  # room, but the dependency is not met
    for _ in range(3):
        report = bridge.cycle()
        assert not report.errors and not report.placed
    slurm.run("scancel", str(blockers[1]))
    cycle_until(bridge, lambda: running(slurm, job), max_cycles=20)


def submit(slurm: Any, *options: str, script: str = "sleep 600", hold: bool = True) -> int:
    """An `rtx` job of acct-a, one GPU, running `script`; held unless told."""
    args = ["sbatch", "--parsable", *(["--hold"] if hold else []), "-p", "rtx", "-A", "acct-a"]
    args += ["--gres=gpu:1", "-o", "/dev/null", *options, "--wrap", script]
    return int(slurm.run(*args).stdout.strip())


def state_of(slurm: Any, job: int) -> str:
    return str(squeue(slurm)[job]["job_state"])


def placed_when(slurm: Any, bridge: Bridge, job: int, other: int, *, max_cycles: int) -> str:
    """Cycles until the bridge places `job`; the other job's Slurm state right after that cycle
    (states only move on, so a rule it breaks then was broken when the job was placed)."""
    reports: list[CycleReport] = []
    cycle_until(
        bridge, lambda: any(f"slurm-{job}" in r.placed for r in reports), max_cycles=max_cycles,
        reports=reports,
    )  # fmt: skip
    return state_of(slurm, other)


def not_placed_for(bridge: Bridge, client: GpufairClient, job: int, cycles: int = 3) -> None:
    for _ in range(cycles):
        report = bridge.cycle()
        assert not report.errors and f"slurm-{job}" not in report.placed
    assert active(client, job) == []


def test_afterany_waits_for_any_end_of_the_other_job(slurm: Any, client: GpufairClient) -> None:
    bridge = rtx_bridge(client)
    first = submit(slurm, script="sleep 6; exit 1")
    cycle_until(bridge, lambda: running(slurm, first), max_cycles=20)
    then = submit(slurm, f"--dependency=afterany:{first}")
    not_placed_for(bridge, client, then)
    assert squeue(slurm)[then]["comment"] == (
        f"gpufair: not scheduled: waits for dependency afterany:{first} (job {first} RUNNING)"
    )
    assert placed_when(slurm, bridge, then, first, max_cycles=20) == "FAILED"
    cycle_until(bridge, lambda: running(slurm, then), max_cycles=10)
    assert squeue(slurm)[then]["comment"] == ""  # no longer "not scheduled"


def test_afternotok_waits_for_a_failed_end_and_never_runs_after_success(
    slurm: Any, client: GpufairClient
) -> None:
    bridge = rtx_bridge(client)
    failing = submit(slurm, script="sleep 6; exit 1")
    passing = submit(slurm, script="sleep 6")
    cycle_until(bridge, lambda: running(slurm, failing, passing), max_cycles=20)
    on_failure = submit(slurm, f"--dependency=afternotok:{failing}")
    on_success = submit(slurm, f"--dependency=afternotok:{passing}")
    not_placed_for(bridge, client, on_failure)
    assert placed_when(slurm, bridge, on_failure, failing, max_cycles=20) == "FAILED"
    cycle_until(bridge, lambda: state_of(slurm, passing) == "COMPLETED", max_cycles=10)
    not_placed_for(bridge, client, on_success)
    never = (
        f"gpufair: not scheduled: dependency afternotok:{passing} can never be met "
        f"(job {passing} COMPLETED)"
    )
    assert squeue(slurm)[on_success]["comment"] == never

    # Slurm's own dependency pass (about once a minute) then marks the dependency failed and
    # gives the job, held with priority 0, the reason JobHeldAdmin: what squeue shows from then
    # on. No operator held it: the Comment still says why it will never run.
    def slurm_judged() -> bool:
        seen = squeue(slurm)[on_success]
        return (seen["dependency"], seen["state_reason"]) == (
            f"afternotok:{passing}(failed)",
            "JobHeldAdmin",
        )

    cycle_until(bridge, slurm_judged, max_cycles=150)
    not_placed_for(bridge, client, on_success)
    assert squeue(slurm)[on_success]["comment"] == never


def test_after_waits_for_the_other_job_to_start_not_to_end(
    slurm: Any, client: GpufairClient
) -> None:
    bridge = rtx_bridge(client)
    # Held in a partition the bridge does not map: it starts when released, by Slurm.
    first = int(
        slurm.run(
            "sbatch", "--parsable", "--hold", "-p", "a100", "-A", "acct-a", "--gres=gpu:1",
            "-o", "/dev/null", "--wrap", "sleep 600",
        ).stdout.strip()
    )  # fmt: skip
    then = submit(slurm, f"--dependency=after:{first}")
    not_placed_for(bridge, client, then)
    assert squeue(slurm)[then]["comment"] == (
        f"gpufair: not scheduled: waits for dependency after:{first} (job {first} PENDING)"
    )
    slurm.run("scontrol", "release", str(first))
    assert placed_when(slurm, bridge, then, first, max_cycles=20) == "RUNNING"
    cycle_until(bridge, lambda: running(slurm, then, first), max_cycles=10)


def test_any_of_runs_once_one_part_is_met(slurm: Any, client: GpufairClient) -> None:
    bridge = rtx_bridge(client)
    long, short = submit(slurm), submit(slurm, script="sleep 6")
    cycle_until(bridge, lambda: running(slurm, long, short), max_cycles=20)
    then = submit(slurm, f"--dependency=afterok:{long}?afterok:{short}")
    not_placed_for(bridge, client, then)
    assert placed_when(slurm, bridge, then, short, max_cycles=20) == "COMPLETED"
    cycle_until(bridge, lambda: running(slurm, then), max_cycles=10)
    assert state_of(slurm, long) == "RUNNING"


def test_a_dependency_on_a_job_slurm_does_not_know_is_met_as_slurm_says(
    slurm: Any, client: GpufairClient
) -> None:
    """Slurm accepts `afterok:999999` (no such job) and lifts it: not held, the job runs."""
    bridge = rtx_bridge(client)
    alone = int(
        slurm.run(
            "sbatch", "--parsable", "-p", "a100", "-A", "acct-a", "--gres=gpu:1",
            "-o", "/dev/null", "--dependency=afterok:999999", "--wrap", "sleep 600",
        ).stdout.strip()
    )  # fmt: skip
    then = submit(slurm, "--dependency=afterok:999999")
    cycle_until(bridge, lambda: running(slurm, alone, then), max_cycles=10)


@pytest.fixture
def as_user(slurm: Any) -> Iterator[Callable[..., str]]:
    """Runs a Slurm command as `nobody`, a user who is not an operator (the tests run as root,
    which is one), and gives its output. The user reads a copy of slurm.conf: the cluster's
    folder is root's alone."""
    with tempfile.TemporaryDirectory() as folder:
        os.chmod(folder, 0o755)
        conf = Path(folder) / "slurm.conf"
        shutil.copyfile(slurm.conf, conf)
        conf.chmod(0o644)
        env = {**slurm.env, "SLURM_CONF": str(conf)}

        def run(*args: str) -> str:
            argv = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", *args]
            done = subprocess.run(
                argv, env=env, capture_output=True, text=True, timeout=30, check=False
            )
            assert done.returncode == 0, done.stderr
            return done.stdout

        yield run


def users_waiting_job(slurm: Any, bridge: Bridge, client: GpufairClient, user: Any) -> int:
    """A job of `nobody` (not an operator), submitted held, that waits in gpufair for room."""
    out = user(
        "sbatch", "--parsable", "--hold", "-p", "rtx", "-A", "acct-a", "--gres=gpu:8",
        "--chdir=/", "-o", "/dev/null", "--wrap", "sleep 600",
    )  # fmt: skip
    job = int(out.strip())
    assert not bridge.cycle().errors
    assert [s.state for s in active(client, job)] == ["pending"]
    return job


def test_a_users_own_hold_is_honoured_until_the_user_releases_it(
    slurm: Any, client: GpufairClient, as_user: Callable[..., str]
) -> None:
    """The job's owner, not an operator, holds a job that waits in gpufair. Slurm ignores that
    hold of a held job (it records nothing: the job is held by the bridge already), so before,
    gpufair bound the job once room came and the bridge released it. The site's job_submit.lua
    (examples/slurm/job_submit.lua, which the test cluster runs) records the owner's hold as the
    begin time 2100-01-01: the bridge withdraws the job, and no cycle places it, after a restart
    too. The owner's release is Slurm's own release, with the begin time 2099-12-31 the script
    sets, so Slurm does not start the job: the bridge holds it back, gpufair places it (the next
    revision) and the bridge releases it there."""
    bridge = rtx_bridge(client)
    # Both RTX nodes full with work of the job's own queue (team-a), so that gpufair reclaims
    # nothing for it: the job just waits.
    blockers = [sbatch(slurm, account="acct-a", partition="rtx", gres="gpu:8", seconds=600)]
    blockers.append(sbatch(slurm, account="acct-a", partition="rtx", gres="gpu:8", seconds=600))
    cycle_until(bridge, lambda: running(slurm, *blockers), max_cycles=20)
    job = users_waiting_job(slurm, bridge, client, as_user)
    as_user("scontrol", "hold", str(job))
    report = bridge.cycle()
    assert (report.withdrawn.keys(), report.errors) == ({f"slurm-{job}"}, [])
    seen = squeue(slurm)[job]
    assert (seen["priority"], seen["state_reason"], seen["eligible_time"]) == (
        0,
        "JobHeldUser",
        USER_HOLD_BEGIN_S,
    )
    assert seen["comment"] == (
        f"gpufair: not scheduled (withdrew slurm-{job}): held by its user (scontrol hold); "
        f"scontrol release {job} hands it back to gpufair"
    )
    # Room frees: the held job is not placed, cycle after cycle, by a restarted bridge too.
    slurm.run("scancel", str(blockers[0]))
    bridge = make_bridge(client, bridge_config(partitions={"rtx": "rtx"}))
    for _ in range(4):
        report = bridge.cycle()
        assert not report.errors and not report.placed and not report.submitted
    assert active(client, job) == []
    assert (squeue(slurm)[job]["job_state"], squeue(slurm)[job]["priority"]) == ("PENDING", 0)
    # `uhold` is the same hold; the owner's release hands it back, and Slurm does not start it.
    as_user("scontrol", "uhold", str(job))
    assert bridge.cycle().placed == {}
    as_user("scontrol", "release", str(job))
    seen = squeue(slurm)[job]
    assert (seen["job_state"], seen["eligible_time"]) == ("PENDING", OWNER_RELEASE_BEGIN_S)
    reports: list[CycleReport] = []

    def started() -> bool:
        # Started where gpufair put it. (Run as `nobody`, the script then fails at once: the
        # cluster's spool folder is root's alone.)
        return bool(squeue(slurm)[job]["start_time"]) and state_of(slurm, job) != "PENDING"

    cycle_until(bridge, started, max_cycles=20, reports=reports)
    placed = {uid: nodes for r in reports for uid, nodes in r.placed.items()}
    assert placed == {f"slurm-{job}.1": [squeue(slurm)[job]["nodes"]]}


def test_a_user_makes_a_waiting_job_wait_with_a_begin_time_and_hands_it_back(
    slurm: Any, client: GpufairClient, as_user: Callable[..., str]
) -> None:
    """The job's owner, not an operator, gives a job the bridge holds a begin time (`scontrol
    update StartTime=`): Slurm keeps it, and gpufair does not place the job before it;
    `StartTime=now` hands it back."""
    bridge = rtx_bridge(client)
    blockers = fill_rtx(slurm, bridge)
    job = users_waiting_job(slurm, bridge, client, as_user)
    as_user("scontrol", "update", f"JobId={job}", "StartTime=now+1hour")
    assert squeue(slurm)[job]["priority"] == 0  # still held by the bridge
    assert bridge.cycle().withdrawn.keys() == {f"slurm-{job}"}
    slurm.run("scancel", str(blockers[0]))  # room: the job is not placed
    for _ in range(4):
        report = bridge.cycle()
        assert not report.errors and not report.placed and not report.submitted
    assert active(client, job) == []
    comment = squeue(slurm)[job]["comment"]
    assert comment.startswith(f"gpufair: not scheduled (withdrew slurm-{job}): waits for its ")
    assert comment.endswith(f"scontrol update JobId={job} StartTime=now hands it back to gpufair")
    as_user("scontrol", "update", f"JobId={job}", "StartTime=now")
    reports: list[CycleReport] = []

    def started() -> bool:
        # Started where gpufair put it. (Run as `nobody`, the script then fails at once: the
        # cluster's spool folder is root's alone.)
        return bool(squeue(slurm)[job]["start_time"]) and state_of(slurm, job) != "PENDING"

    cycle_until(bridge, started, max_cycles=20, reports=reports)
    placed = {uid: nodes for r in reports for uid, nodes in r.placed.items()}
    assert placed == {f"slurm-{job}.1": [squeue(slurm)[job]["nodes"]]}


def test_a_job_submitted_with_a_begin_time_is_not_placed_before_it(
    slurm: Any, client: GpufairClient
) -> None:
    """`sbatch --begin`: gpufair's pin (`StartTime=now`) must not clear the user's begin time."""
    bridge = rtx_bridge(client)
    job = submit(slurm, "--begin=now+1hour")
    not_placed_for(bridge, client, job)
    assert squeue(slurm)[job]["comment"].startswith("gpufair: not scheduled: waits for its begin")
    slurm.run("scontrol", "update", f"JobId={job}", "StartTime=now+3")
    begin = squeue(slurm)[job]["eligible_time"]
    cycle_until(bridge, lambda: running(slurm, job), max_cycles=15)
    assert squeue(slurm)[job]["start_time"] >= begin


def test_a_dependency_on_an_array_waits_for_every_task(slurm: Any, client: GpufairClient) -> None:
    """Slurm makes `afterok:A` of an array `afterok:A_*` and judges it over all tasks: task 1
    fails early, and neither `afternotok` nor `afterok` is decided until tasks 0 and 2 end."""
    bridge = rtx_bridge(client)
    script = "if [ $SLURM_ARRAY_TASK_ID = 1 ]; then sleep 1; exit 1; fi; sleep 12"
    out = slurm.run(
        "sbatch", "--parsable", "--array=0-2", "-p", "a100", "-A", "acct-a", "--gres=gpu:1",
        "-o", "/dev/null", "--wrap", script,
    ).stdout  # fmt: skip
    array = int(out.strip())
    on_failure = submit(slurm, f"--dependency=afternotok:{array}")
    on_success = submit(slurm, f"--dependency=afterok:{array}")
    assert squeue(slurm)[on_failure]["dependency"] == f"afternotok:{array}_*(unfulfilled)"

    def tasks() -> list[dict[str, Any]]:
        return [j for j in squeue(slurm).values() if j["array_job_id"] == array]

    def task_failed() -> bool:
        return any(t["job_state"] == "FAILED" for t in tasks())

    cycle_until(bridge, task_failed, max_cycles=20)
    not_placed_for(bridge, client, on_failure)
    assert {t["job_state"] for t in tasks()} == {"FAILED", "RUNNING"}
    assert squeue(slurm)[on_failure]["comment"] == (
        f"gpufair: not scheduled: waits for dependency afternotok:{array}_* "
        f"(array {array} tasks FAILED, RUNNING)"
    )
    placed_when(slurm, bridge, on_failure, array, max_cycles=30)
    assert sorted(t["job_state"] for t in tasks()) == ["COMPLETED", "COMPLETED", "FAILED"]
    not_placed_for(bridge, client, on_success)
    assert squeue(slurm)[on_success]["comment"].startswith(
        f"gpufair: not scheduled: dependency afterok:{array}_* can never be met"
    )


def test_after_plus_minutes_counts_on_slurms_clock_not_the_bridges(
    slurm: Any, client: GpufairClient
) -> None:
    """`after:N+1`: a minute from N's start as Slurm reports it, on Slurm's clock (sdiag), with
    the bridge's own clock ten minutes ahead."""
    client.apply_config(cluster_config("rtx"))
    config = bridge_config(partitions={"rtx": "rtx"})
    bridge = Bridge(config, client, SlurmCtl(config.slurm_bin), clock=lambda: time.time() + 600)
    bridge.cycle()
    first = int(
        slurm.run(
            "sbatch", "--parsable", "-p", "a100", "-A", "acct-a", "--gres=gpu:1",
            "-o", "/dev/null", "--wrap", "sleep 600",
        ).stdout.strip()
    )  # fmt: skip
    then = submit(slurm, f"--dependency=after:{first}+1")
    cycle_until(bridge, lambda: running(slurm, first), max_cycles=10)
    started = squeue(slurm)[first]["start_time"]
    not_placed_for(bridge, client, then)
    assert squeue(slurm)[then]["comment"] == (
        f"gpufair: not scheduled: waits for dependency after:{first}+1 "
        f"(job {first} started at {started})"
    )
    placed_when(slurm, bridge, then, first, max_cycles=90)
    assert SlurmCtl().now() >= started + 60


def test_job_array_stays_held_with_why(slurm: Any, client: GpufairClient) -> None:
    bridge = rtx_bridge(client)
    out = slurm.run(
        "sbatch", "--parsable", "--hold", "--array=0-3", "-p", "rtx", "-A", "acct-a",
        "--gres=gpu:1", "-o", "/dev/null", "--wrap", "sleep 600",
    ).stdout  # fmt: skip
    array = int(out.strip().split(";")[0])
    for _ in range(3):
        report = bridge.cycle()
        assert not report.errors and not report.placed and not report.submitted
    assert active(client, array) == []
    seen = squeue(slurm)[array]
    assert (seen["job_state"], seen["priority"], seen["array_task_string"]) == ("PENDING", 0, "0-3")
    assert seen["comment"] == (
        "gpufair: not scheduled: job arrays are not supported; submit one job per task"
    )
