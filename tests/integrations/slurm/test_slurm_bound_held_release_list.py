"""Held jobs that gpufair already binds (the row "pending, held | bound": binds no cycle pinned,
as when the bridge stopped between `Schedule` and its pins) are pinned one `scontrol update`
each and released in one `scontrol release` list, as the binds of `Schedule` are.

On the real Slurm: three held 1-GPU jobs are submitted and bound by a cycle whose pins and
releases never reach Slurm (the bridge "killed" right after `Schedule`). A new bridge's first
cycle finds them held and bound: three pins to the bound nodes and one release of all three
(three `scontrol release` processes before), and each job then runs on its bound node.
"""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from typing import Any

from slurm_support import bridge_config, cluster_config, cycle_until, sbatch, squeue

from gpufair.client import GpufairClient
from gpufair.integrations.slurm.bridge import Bridge
from gpufair.integrations.slurm.slurmctl import SlurmCommandError, SlurmCtl


class StopsAfterSchedule(SlurmCtl):
    """Slurm's reads, but no pin and no release reaches Slurm (a bridge gone before them)."""

    def pin(self, job_id: int, nodes: Sequence[str], *, start_now: bool) -> None:
        """Never sent: the job stays held and unpinned in Slurm."""

    def release_many(self, job_ids: Sequence[int]) -> dict[int, SlurmCommandError]:
        return {}

    def release(self, job_id: int) -> None:
        """Never sent: the job stays held in Slurm."""


class Records(SlurmCtl):
    """Slurm's commands, each `scontrol` one recorded as run."""

    def __init__(self) -> None:
        super().__init__()
        self.scontrol: list[list[str]] = []

    def _run_full(
        self, program: str, *args: str, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        if program == "scontrol":
            self.scontrol.append(list(args))
        return super()._run_full(program, *args, check=check)


def test_held_jobs_found_bound_are_released_in_one_list(slurm: Any, client: GpufairClient) -> None:
    client.apply_config(cluster_config("gpu"))
    first = Bridge(bridge_config(), client, StopsAfterSchedule())
    first.cycle()
    jobs = [sbatch(slurm, account="acct-a", gres="gpu:1", seconds=60) for _ in range(3)]
    report = first.cycle()
    assert not report.errors, report.errors
    assert sorted(report.submitted) == sorted(f"slurm-{j}" for j in jobs)
    assert [client.explain(f"slurm-{j}").state for j in jobs] == ["bound"] * 3
    nodes = {j: report.placed[f"slurm-{j}"] for j in jobs}  # bound there, never pinned
    assert [len(n) for n in nodes.values()] == [1, 1, 1]
    seen = squeue(slurm)
    assert [(seen[j]["job_state"], seen[j]["priority"]) for j in jobs] == [("PENDING", 0)] * 3

    ctl = Records()
    report = Bridge(bridge_config(), client, ctl).cycle()
    assert not report.errors, report.errors
    assert report.placed == {f"slurm-{j}": nodes[j] for j in jobs}
    pins = sorted(args for args in ctl.scontrol if args[0] == "update")
    assert pins == sorted(["update", f"JobId={j}", f"NodeList={nodes[j][0]}"] for j in jobs)
    releases = [args for args in ctl.scontrol if args[0] == "release"]
    assert [[a[0], sorted(map(int, a[1].split(",")))] for a in releases] == [
        ["release", sorted(jobs)]
    ]
    assert len(ctl.scontrol) == 4  # three pins, one release: no hold, nothing else

    later = Bridge(bridge_config(), client, SlurmCtl())
    cycle_until(
        later,
        lambda: all(squeue(slurm)[j]["job_state"] == "RUNNING" for j in jobs),
        max_cycles=15,
    )
    after = squeue(slurm)
    assert {j: after[j]["nodes"] for j in jobs} == {j: nodes[j][0] for j in jobs}
    cycle_until(
        later,
        lambda: all(client.explain(f"slurm-{j}").state == "running" for j in jobs),
        max_cycles=5,
    )
