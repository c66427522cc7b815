"""slurmctld stopped and started again while the bridge runs.

While the controller is down, Slurm's commands cannot say what the cluster holds. A cycle then
fails (and changes nothing in gpufair): it must not take "no answer" for "no jobs and no nodes",
which would cancel every waiting workload whose job Slurm still has. Once the controller is back
(its state restored from `StateSaveLocation`), the bridge carries on: the waiting job runs, and
the ledger holds Slurm's own start and end times.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest
from slurm_support import (
    bridge_config,
    cluster_config,
    cycle_until,
    make_bridge,
    runs_of,
    sbatch,
    squeue,
)
from sqlalchemy import Engine

from gpufair.client import GpufairClient
from gpufair.integrations.slurm.slurmctl import SlurmCommandError


def stop_controller(slurm: Any) -> None:
    pid = slurm.pids.pop("slurmctld")
    os.kill(pid, signal.SIGTERM)
    os.waitpid(pid, 0)


def start_controller(slurm: Any) -> None:
    from local_cluster import program

    slurm._spawn("slurmctld", [program("slurmctld"), "-D", "-i", "-f", str(slurm.conf)])
    deadline = time.monotonic() + 30
    while slurm.run("squeue", "-h", check=False).returncode != 0:
        assert time.monotonic() < deadline, slurm.logs_tail()
        time.sleep(0.3)


def state_of(client: GpufairClient, uid: str) -> str:
    return client.explain(uid).state


def test_controller_down_fails_the_cycle_and_cancels_nothing(
    slurm: Any, client: GpufairClient, db: Engine, tmp_path: Path
) -> None:
    client.apply_config(cluster_config("a100"))
    bridge = make_bridge(client, bridge_config(partitions={"a100": "a100"}))
    bridge.cycle()
    # The gang runs until the controller is back: a job that ends while slurmctld is down is
    # another story (its end may reach the controller late, or only as a node's registration
    # that no longer lists it), and a fixed length ran out on a loaded machine.
    go = tmp_path / "go"
    gang = sbatch(
        slurm, account="acct-a", partition="a100", nodes=2, gres="gpu:8",
        wrap=f"while [ ! -e {go} ]; do sleep 0.2; done",
    )  # fmt: skip
    cycle_until(bridge, lambda: state_of(client, f"slurm-{gang}") == "running", max_cycles=8)
    waiting = sbatch(slurm, account="acct-b", partition="a100", gres="gpu:4", seconds=3)
    assert bridge.cycle().submitted == [f"slurm-{waiting}"]
    assert state_of(client, f"slurm-{waiting}") == "pending"  # the gang holds every GPU

    stop_controller(slurm)
    try:
        for _ in range(2):
            with pytest.raises(SlurmCommandError):
                bridge.cycle()
        assert state_of(client, f"slurm-{waiting}") == "pending"
        assert state_of(client, f"slurm-{gang}") == "running"
        assert len(client.get_config().config.nodes) == 2
    finally:
        start_controller(slurm)
    go.touch()

    def all_done() -> bool:
        return {state_of(client, f"slurm-{j}") for j in (gang, waiting)} == {"finished"}

    try:
        cycle_until(bridge, all_done, max_cycles=60)
    except AssertionError as failure:  # what each side held, for a run that went wrong
        jobs = {j: (client.explain(f"slurm-{j}"), squeue(slurm).get(j)) for j in (gang, waiting)}
        nodes = slurm.run("sinfo", "-N", "-h", "-o", "%N %t %E", check=False).stdout
        raise AssertionError(f"{failure}\n{jobs}\n{nodes}\n{slurm.logs_tail(40)}") from None
    seen = squeue(slurm)
    for job in (gang, waiting):
        assert (seen[job]["job_state"], seen[job]["restart_cnt"]) == ("COMPLETED", 0)
    assert runs_of(db, f"slurm-{gang}") == [
        (seen[gang]["start_time"], seen[gang]["end_time"], 16.0, "a100-80gb", "stopped")
    ]
    assert runs_of(db, f"slurm-{waiting}") == [
        (seen[waiting]["start_time"], seen[waiting]["end_time"], 4.0, "a100-80gb", "stopped")
    ]
