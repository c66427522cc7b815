"""A job gpufair bound and the bridge released, pinned to its node, that cannot start there: the
node is drained or taken down between the pin and the start. Slurm keeps such a job pending
(reason `ReqNodeNotAvail`, checked on 22.05) until the node comes back, with gpufair's binding
reserved until it expires (`bind_timeout_s`, 300 s by default). The bridge sees the node not
ready in the next cycle's `sinfo`, holds the job again and withdraws the workload, and gpufair
places the next revision on another node.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import pytest
from slurm_support import bridge_config, cluster_config, cycle_until, runs_of, sbatch, squeue
from sqlalchemy import Engine

from gpufair.client import GpufairClient
from gpufair.integrations.slurm.bridge import Bridge
from gpufair.integrations.slurm.slurmctl import SlurmCtl


class NodeLostBeforeStart(SlurmCtl):
    """Slurm's commands, but the first node the bridge pins a job to is set to `state` (by an
    operator, as it were) right before the job is released."""

    def __init__(self, state: str) -> None:
        super().__init__()
        self.state = state
        self.lost: str = ""
        self._pinned: list[str] = []

    def pin(self, job_id: int, nodes: Sequence[str], *, start_now: bool) -> None:
        super().pin(job_id, nodes, start_now=start_now)
        self._pinned = list(nodes)

    def release(self, job_id: int) -> None:
        if not self.lost:
            self.lost = self._pinned[0]
            self._run(
                "scontrol", "update", f"NodeName={self.lost}", f"State={self.state}",
                "Reason=gpufair-test",
            )  # fmt: skip
        super().release(job_id)


@pytest.mark.parametrize("state", ["DRAIN", "DOWN"])
def test_a_job_pinned_to_a_node_lost_before_it_started_is_placed_elsewhere(
    slurm: Any, client: GpufairClient, db: Engine, state: str
) -> None:
    client.apply_config(cluster_config("gpu"))
    ctl = NodeLostBeforeStart(state)
    bridge = Bridge(bridge_config(), client, ctl)
    try:
        bridge.cycle()
        job = sbatch(slurm, account="acct-a", gres="gpu:a100:2", seconds=60)
        uid = f"slurm-{job}"
        cycle_until(bridge, lambda: bool(ctl.lost), max_cycles=8)
        stuck = squeue(slurm)[job]
        assert (stuck["job_state"], stuck["priority"] > 0) == ("PENDING", True)
        assert stuck["required_nodes"] == ctl.lost

        # Far fewer cycles than the binding's 300 s.
        cycle_until(bridge, lambda: squeue(slurm)[job]["job_state"] == "RUNNING", max_cycles=10)
        ran = squeue(slurm)[job]
        assert ran["nodes"] != ctl.lost and ran["nodes"].startswith("a100-")
        assert client.explain(uid).state == "cancelled"
        cycle_until(bridge, lambda: len(runs_of(db, f"{uid}.1")) == 1, max_cycles=5)
        [(start, end, gpus, gpu_type, _)] = runs_of(db, f"{uid}.1")
        assert (start, end, gpus, gpu_type) == (ran["start_time"], None, 2.0, "a100-80gb")
        assert runs_of(db, uid) == []
        assert ran["comment"] == f"gpufair: submitted as {uid}.1 (withdrew {uid})"
    finally:
        if ctl.lost:
            slurm.run("scontrol", "update", f"NodeName={ctl.lost}", "State=RESUME")
            nodes = json.loads(slurm.run("sinfo", "--json").stdout)["nodes"]
            assert {n["name"]: n["state"] for n in nodes}[ctl.lost] in ("idle", "mixed")
