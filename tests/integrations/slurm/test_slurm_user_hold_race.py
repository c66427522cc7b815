"""A job's owner holds it while the bridge is placing it, and owners' releases, on the real Slurm.

The owner's `scontrol hold` of a job the bridge holds is recorded by the site's job_submit.lua
(examples/slurm/job_submit.lua) as the begin time 2100-01-01, the bridge's "held by its user".
A cycle reads `squeue`, then asks gpufair, then pins each job gpufair bound (`scontrol update
NodeList=... StartTime=now`) and releases it. Checked on Slurm 22.05 before the script kept the
mark: a hold landing after the read lost it, the pin's `StartTime=now` (or the release, which
set the begin time to now) overwrote the begin time, and Slurm started the job within a second.
Now the script remembers the begin time an owner set, the pin (an operator's update naming
nodes) keeps it, and an operator's release leaves the begin time alone: Slurm cannot start the
job, and the next cycle holds it back and withdraws it. An operator's own release keeps the
owner's hold the same way; an operator's `StartTime=now` (naming no nodes) hands the job back.

The owner's release goes to Slurm as a release, so Slurm judges it as it does without the
bridge: refused for a job an operator held, allowed for the bridge's user hold, with the begin
time 2099-12-31 that keeps Slurm from starting the job until the bridge holds it back and
gpufair places it.
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
from slurm_support import bridge_config, cluster_config, cycle_until, sbatch, squeue

from gpufair.client import GpufairClient
from gpufair.integrations.slurm.bridge import Bridge, CycleReport
from gpufair.integrations.slurm.job_states import OWNER_RELEASE_BEGIN_S, USER_HOLD_BEGIN_S
from gpufair.integrations.slurm.mapping import job_id_of
from gpufair.integrations.slurm.slurmctl import SlurmCtl
from gpufair.v1 import scheduler_pb2

User = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture
def as_user(slurm: Any) -> Iterator[User]:
    """Runs a Slurm command as `nobody` (not an operator), with a copy of slurm.conf it can
    read; the completed process, whatever its exit code. Its jobs are cancelled after the test
    (the cluster's cleanup cancels root's, and waits for every job to end)."""
    with tempfile.TemporaryDirectory() as folder:
        os.chmod(folder, 0o755)
        conf = Path(folder) / "slurm.conf"
        shutil.copyfile(slurm.conf, conf)
        conf.chmod(0o644)
        env = {**slurm.env, "SLURM_CONF": str(conf)}

        def run(*args: str) -> subprocess.CompletedProcess[str]:
            argv = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", *args]
            return subprocess.run(
                argv, env=env, capture_output=True, text=True, timeout=30, check=False
            )

        yield run
        slurm.run("scancel", "--user", "nobody", check=False)


class _HoldInWindow(SlurmCtl):
    """Slurm's commands, with the owner's hold of a job run in the cycle that places it: right
    before the bridge pins it (after the cycle's `squeue` read) or right after, once each."""

    def __init__(self, user: User) -> None:
        super().__init__()
        self.user = user
        self.before_pin: set[int] = set()
        self.after_pin: set[int] = set()
        self.forget: Path | None = None  # the script to touch with a hold before a pin
        self.pins: list[tuple[int, bool]] = []  # (job, with StartTime=now)

    def _hold(self, job_id: int) -> None:
        done = self.user("scontrol", "hold", str(job_id))
        assert done.returncode == 0, done.stderr

    def pin(self, job_id: int, nodes: Any, *, start_now: bool) -> None:
        self.pins.append((job_id, start_now))
        if job_id in self.before_pin:
            self.before_pin.discard(job_id)
            self._hold(job_id)
            if self.forget:
                # Slurm loads a changed script again, with nothing remembered (as after a
                # restart of slurmctld), at its next call: the pin.
                now = time.time()
                os.utime(self.forget, (now, now))
        super().pin(job_id, nodes, start_now=start_now)
        if job_id in self.after_pin:
            self.after_pin.discard(job_id)
            self._hold(job_id)


def active(client: GpufairClient, job_id: int) -> list[scheduler_pb2.WorkloadStatus]:
    config = bridge_config()
    return [w for w in client.list_workloads() if job_id_of(config, w.workload.uid) == job_id]


def started(slurm: Any, job: int) -> bool:
    """Slurm started the job. (Run as `nobody`, its script then fails at once: the cluster's
    spool folder is root's alone.)"""
    seen = squeue(slurm)[job]
    return bool(seen["start_time"]) and seen["job_state"] != "PENDING"


def users_job(slurm: Any, user: User) -> int:
    """A job of `nobody`, submitted held, 8 RTX GPUs."""
    done = user(
        "sbatch", "--parsable", "--hold", "-p", "rtx", "-A", "acct-a", "--gres=gpu:8",
        "--chdir=/", "-o", "/dev/null", "--wrap", "sleep 600",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return int(done.stdout.strip())


def rtx_bridge(client: GpufairClient, slurm_ctl: SlurmCtl) -> Bridge:
    client.apply_config(cluster_config("rtx"))
    bridge = Bridge(bridge_config(partitions={"rtx": "rtx"}), client, slurm_ctl)
    bridge.cycle()
    return bridge


def test_an_owners_hold_during_the_placing_cycle_is_kept(
    slurm: Any, client: GpufairClient, as_user: User
) -> None:
    window = _HoldInWindow(as_user)
    bridge = rtx_bridge(client, window)
    # Both RTX nodes full with work of the jobs' own queue: the two jobs wait in gpufair.
    blockers = [sbatch(slurm, account="acct-a", partition="rtx", gres="gpu:8", seconds=600)]
    blockers.append(sbatch(slurm, account="acct-a", partition="rtx", gres="gpu:8", seconds=600))
    cycle_until(
        bridge,
        lambda: all(squeue(slurm)[b]["job_state"] == "RUNNING" for b in blockers),
        max_cycles=20,
    )
    read_job, pin_job = users_job(slurm, as_user), users_job(slurm, as_user)
    assert not bridge.cycle().errors
    assert [s.state for s in active(client, read_job) + active(client, pin_job)] == ["pending"] * 2

    # Room for both: the cycle that sees the blockers end binds both; one owner holds after
    # that cycle's read, one after the pin.
    window.before_pin, window.after_pin = {read_job}, {pin_job}
    for blocker in blockers:
        slurm.run("scancel", str(blocker))
    reports: list[CycleReport] = []
    cycle_until(bridge, lambda: len([u for r in reports for u in r.placed]) >= 2, max_cycles=10,
                reports=reports)  # fmt: skip
    assert sorted(u for r in reports for u in r.placed) == sorted(
        [f"slurm-{read_job}", f"slurm-{pin_job}"]
    )
    assert window.before_pin == window.after_pin == set()
    for job in (read_job, pin_job):
        seen = squeue(slurm)[job]
        # Pinned and released by the bridge, but the owner's begin time is kept: not started.
        assert (seen["job_state"], seen["eligible_time"]) == ("PENDING", USER_HOLD_BEGIN_S), seen
    # A next cycle holds each back and withdraws it; no later cycle places them.
    both = {f"slurm-{read_job}", f"slurm-{pin_job}"}
    cycle_until(bridge, lambda: {u for r in reports for u in r.withdrawn} == both, max_cycles=3,
                reports=reports)  # fmt: skip
    for _ in range(3):
        report = bridge.cycle()
        assert not report.errors and not report.placed and not report.submitted
    for job in (read_job, pin_job):
        seen = squeue(slurm)[job]
        assert (seen["job_state"], seen["priority"], seen["restart_cnt"]) == ("PENDING", 0, 0)
        assert seen["comment"] == (
            f"gpufair: not scheduled (withdrew slurm-{job}): held by its user (scontrol hold); "
            f"scontrol release {job} hands it back to gpufair"
        )
        assert active(client, job) == []

    # The owner's release hands one back: gpufair places the next revision and it runs there.
    done = as_user("scontrol", "release", str(read_job))
    assert done.returncode == 0, done.stderr
    seen = squeue(slurm)[read_job]
    assert (seen["job_state"], seen["eligible_time"]) == ("PENDING", OWNER_RELEASE_BEGIN_S)
    reports = []
    cycle_until(bridge, lambda: started(slurm, read_job), max_cycles=10, reports=reports)
    placed = {uid: nodes for r in reports for uid, nodes in r.placed.items()}
    assert placed == {f"slurm-{read_job}.1": [squeue(slurm)[read_job]["nodes"]]}

    # An operator's release leaves the owner's hold: released, not started, held back again.
    slurm.run("scontrol", "release", str(pin_job))
    seen = squeue(slurm)[pin_job]
    assert (seen["job_state"], seen["eligible_time"], seen["priority"] > 0) == (
        "PENDING",
        USER_HOLD_BEGIN_S,
        True,
    )
    for _ in range(2):
        report = bridge.cycle()
        assert not report.errors and not report.placed and not report.submitted
    assert (squeue(slurm)[pin_job]["job_state"], squeue(slurm)[pin_job]["priority"]) == (
        "PENDING",
        0,
    )
    # An operator's begin time naming no nodes hands it back.
    slurm.run("scontrol", "update", f"JobId={pin_job}", "StartTime=now")
    reports = []
    cycle_until(bridge, lambda: started(slurm, pin_job), max_cycles=10, reports=reports)
    placed = {uid: nodes for r in reports for uid, nodes in r.placed.items()}
    assert placed == {f"slurm-{pin_job}.1": [squeue(slurm)[pin_job]["nodes"]]}


def test_an_owners_release_of_a_job_an_operator_held_is_refused_as_slurm_refuses_it(
    slurm: Any, client: GpufairClient, as_user: User
) -> None:
    """Without the script Slurm refuses a user's release of an operator's hold (exit 1,
    `Access/permission denied`); the script once turned it into a no-op with exit 0."""
    bridge = rtx_bridge(client, SlurmCtl())
    job = users_job(slurm, as_user)
    first = bridge.cycle()
    assert not first.errors
    assert [s.workload.uid for s in active(client, job)] == [f"slurm-{job}"]
    slurm.run("scontrol", "hold", str(job))
    before = squeue(slurm)[job]
    # Once (a loaded run of the whole suite) the job had already started and failed here (its
    # script fails at once as `nobody`): what the first cycle did and Slurm's record, to tell why.
    record = {
        k: before.get(k) for k in ("job_state", "start_time", "nodes", "eligible_time", "comment")
    }
    # The message a string, so pytest prints it whole (a tuple's repr is cut short).
    assert (before["state_reason"], before["priority"]) == ("JobHeldAdmin", 0), (
        f"first cycle placed {first.placed!r}, submitted {first.submitted!r}, sent "
        f"{first.events!r}; Slurm's record {record!r}"
    )
    done = as_user("scontrol", "release", str(job))
    assert done.returncode == 1
    assert "Access/permission denied" in done.stderr
    after = squeue(slurm)[job]
    assert {k: after[k] for k in ("state_reason", "priority", "eligible_time", "job_state")} == {
        k: before[k] for k in ("state_reason", "priority", "eligible_time", "job_state")
    }
    for _ in range(2):
        report = bridge.cycle()
        assert not report.placed and not report.submitted and not report.errors
    assert active(client, job) == []
    assert squeue(slurm)[job]["comment"].startswith(
        f"gpufair: not scheduled (withdrew slurm-{job}): held by an operator"
    )
    # Once an operator turns it into a user hold, the owner's release hands it to gpufair.
    slurm.run("scontrol", "uhold", str(job))
    done = as_user("scontrol", "release", str(job))
    assert done.returncode == 0, done.stderr
    reports: list[CycleReport] = []
    cycle_until(bridge, lambda: started(slurm, job), max_cycles=10, reports=reports)
    placed = {uid: nodes for r in reports for uid, nodes in r.placed.items()}
    assert placed == {f"slurm-{job}.1": [squeue(slurm)[job]["nodes"]]}


def test_an_owners_hold_during_the_placing_cycle_is_kept_when_the_script_forgot_what_it_knew(
    slurm: Any, client: GpufairClient, as_user: User
) -> None:
    """The script's memory of owners' begin times is gone (Slurm loaded it again, as after a
    restart of slurmctld) when the bridge pins a job its owner held after the cycle's read. The
    pin of a job with no begin time to clear names no `StartTime`, so Slurm keeps the mark:
    before, the pin's `StartTime=now` overwrote it and Slurm started the job. A pin that must
    clear a begin time (here the mark of the owner's release) relies on the script's memory."""
    window = _HoldInWindow(as_user)
    bridge = rtx_bridge(client, window)
    job = users_job(slurm, as_user)
    window.before_pin, window.forget = {job}, slurm.root / "job_submit.lua"
    report = bridge.cycle()  # submitted, bound and placed in one cycle
    assert (report.submitted, list(report.placed), report.errors) == (
        [f"slurm-{job}"],
        [f"slurm-{job}"],
        [],
    )
    assert window.pins == [(job, False)]
    seen = squeue(slurm)[job]
    assert (seen["job_state"], seen["eligible_time"]) == ("PENDING", USER_HOLD_BEGIN_S), seen
    cycle_until(bridge, lambda: squeue(slurm)[job]["priority"] == 0, max_cycles=3)
    seen = squeue(slurm)[job]
    assert (seen["job_state"], seen["eligible_time"]) == ("PENDING", USER_HOLD_BEGIN_S)
    assert active(client, job) == []

    # Released by its owner (the 2099 begin time, which the pin must clear), then held again by
    # its owner right before that pin: the script, which remembers this hold, keeps the mark.
    assert as_user("scontrol", "release", str(job)).returncode == 0
    window.before_pin, window.forget = {job}, None
    cycle_until(bridge, lambda: len(window.pins) == 2, max_cycles=4)
    assert window.pins[1] == (job, True)
    seen = squeue(slurm)[job]
    assert (seen["job_state"], seen["eligible_time"]) == ("PENDING", USER_HOLD_BEGIN_S), seen
    cycle_until(bridge, lambda: squeue(slurm)[job]["priority"] == 0, max_cycles=3)
    assert squeue(slurm)[job]["eligible_time"] == USER_HOLD_BEGIN_S
    assert active(client, job) == []
