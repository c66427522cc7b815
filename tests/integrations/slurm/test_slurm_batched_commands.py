"""The bridge's holds and releases go to Slurm as lists (`scontrol uhold 1,2,3`, `scontrol release
1,2`), and Slurm's error for one job of a list is that job's alone: the other jobs are held,
submitted, pinned and released as one by one.

On the real Slurm: three jobs submitted without a hold wait behind jobs filling every node (in
partitions the bridge does not map); one is cancelled right before the bridge's hold list, and
one of the two left right before its release list (in the cycle gpufair binds them). The cycles
report one error for each, naming the job; the third job is held, submitted, placed and, once
the nodes are free, runs.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Sequence
from typing import Any

from slurm_support import bridge_config, cluster_config, cycle_until, sbatch, squeue

from gpufair.client import GpufairClient
from gpufair.integrations.slurm.bridge import Bridge
from gpufair.integrations.slurm.slurmctl import SlurmCommandError, SlurmCtl


class CancelsBeforeLists(SlurmCtl):
    """Slurm's commands, but the first job of the first hold list and of the first release list
    of several jobs is cancelled right before the list goes to Slurm (as a job ending
    meanwhile); every list is recorded."""

    def __init__(self, slurm: Any) -> None:
        super().__init__()
        self.slurm = slurm
        self.lists: list[tuple[str, list[int]]] = []
        self.cancelled: list[int] = []

    def _cancel_first(self, verb: str, job_ids: Sequence[int]) -> None:
        self.lists.append((verb, list(job_ids)))
        if len(job_ids) > 1 and verb not in {v for v, _ in self.lists[:-1]}:
            self.slurm.run("scancel", str(job_ids[0]))
            self.cancelled.append(job_ids[0])
            for _ in range(50):  # until Slurm shows it ended
                if squeue(self.slurm)[job_ids[0]]["job_state"] == "CANCELLED":
                    return
            raise AssertionError(f"job {job_ids[0]} not cancelled")

    def hold_many(self, job_ids: Sequence[int]) -> dict[int, SlurmCommandError]:
        self._cancel_first("uhold", job_ids)
        return super().hold_many(job_ids)

    def release_many(self, job_ids: Sequence[int]) -> dict[int, SlurmCommandError]:
        self._cancel_first("release", job_ids)
        return super().release_many(job_ids)


def fill_every_node(slurm: Any) -> list[str]:
    """A whole-node job on each node, in the unmapped partitions `a100` and `rtx`."""
    ids = []
    for node in ("a100-0", "a100-1", "rtx-0", "rtx-1"):
        partition = node.split("-")[0]
        out = slurm.run(
            "sbatch", "--parsable", "-p", partition, "-w", node, "--gres=gpu:8", "-o",
            "/dev/null", "--wrap", "sleep 600",
        ).stdout  # fmt: skip
        ids.append(out.strip().split(";")[0])
    return ids


def test_one_job_failing_in_a_hold_list_and_a_release_list_leaves_the_others_done(
    slurm: Any, client: GpufairClient
) -> None:
    client.apply_config(cluster_config("gpu"))
    ctl = CancelsBeforeLists(slurm)
    bridge = Bridge(bridge_config(), client, ctl)
    bridge.cycle()
    fillers = fill_every_node(slurm)
    cycle_until(
        bridge,
        lambda: all(squeue(slurm)[int(f)]["job_state"] == "RUNNING" for f in fillers),
        max_cycles=20,
    )
    jobs = [sbatch(slurm, account="acct-a", gres="gpu:1", seconds=60, hold=False) for _ in range(3)]
    seen = squeue(slurm)
    assert [(seen[j]["job_state"], seen[j]["priority"] > 0) for j in jobs] == [
        ("PENDING", True)
    ] * 3

    reports = [bridge.cycle()]  # the hold list; the release list in the cycle placing them
    while not any(verb == "release" for verb, _ in ctl.lists) and len(reports) < 10:
        time.sleep(1)
        reports.append(bridge.cycle())

    gone_at_hold, gone_at_release = ctl.cancelled
    assert [(verb, sorted(ids)) for verb, ids in ctl.lists] == [
        ("uhold", jobs),
        ("release", [j for j in jobs if j != gone_at_hold]),
    ]
    [survivor] = [j for j in jobs if j not in ctl.cancelled]
    assert [e for r in reports for e in r.errors] == [
        f"slurm-{gone_at_hold}: scontrol uhold {gone_at_hold} exited 1: "
        f"Job has already finished for job {gone_at_hold}",
        f"slurm-{gone_at_release}: scontrol release {gone_at_release} exited 1: "
        f"Job has already finished for job {gone_at_release}",
    ]
    assert sorted(reports[0].submitted) == sorted(f"slurm-{j}" for j in jobs if j != gone_at_hold)
    placed = {uid: nodes for r in reports for uid, nodes in r.placed.items()}
    assert list(placed) == [f"slurm-{survivor}"]
    after = squeue(slurm)
    assert after[survivor]["job_state"] == "PENDING" and after[survivor]["priority"] > 0
    assert after[survivor]["required_nodes"] == placed[f"slurm-{survivor}"][0]

    slurm.run("scancel", *fillers)
    cycle_until(bridge, lambda: squeue(slurm)[survivor]["job_state"] == "RUNNING", max_cycles=10)
    cycle_until(
        bridge, lambda: client.explain(f"slurm-{survivor}").state == "running", max_cycles=5
    )
    assert client.explain(f"slurm-{gone_at_release}").state == "cancelled"


def test_a_list_whose_failure_names_no_job_fails_every_job_of_it() -> None:
    """The controller unreachable: scontrol names no job; every job of the list failed."""

    class Unreachable(SlurmCtl):
        def _run_full(
            self, program: str, *args: str, check: bool = True
        ) -> subprocess.CompletedProcess[str]:
            said = "scontrol: error: Unable to contact slurm controller (connect failure)\n"
            return subprocess.CompletedProcess([program, *args], 1, "", said)

    failed = Unreachable().release_many([7, 8])
    assert sorted(failed) == [7, 8]
    assert str(failed[7]) == (
        "scontrol release (list of 2) exited 1: "
        "scontrol: error: Unable to contact slurm controller (connect failure)"
    )


def test_lists_are_split_and_only_named_jobs_fail() -> None:
    """501 jobs: two lists (500 ids at most); Slurm's line for one job fails that job alone."""

    class Recording(SlurmCtl):
        def __init__(self) -> None:
            super().__init__()
            self.argv: list[tuple[str, ...]] = []

        def _run_full(
            self, program: str, *args: str, check: bool = True
        ) -> subprocess.CompletedProcess[str]:
            self.argv.append((program, *args))
            if "3" in args[1].split(","):
                said = "Job has already finished for job 3\nslurm_suspend error: No error\n"
                return subprocess.CompletedProcess([program, *args], 1, "", said)
            return subprocess.CompletedProcess([program, *args], 0, "", "")

    ctl = Recording()
    failed = ctl.hold_many(list(range(1, 502)))
    assert [len(a[2].split(",")) for a in ctl.argv] == [500, 1]
    assert [a[:2] for a in ctl.argv] == [("scontrol", "uhold")] * 2
    assert {j: str(e) for j, e in failed.items()} == {
        3: "scontrol uhold 3 exited 1: Job has already finished for job 3"
    }
