"""The Slurm commands the bridge issues and their order, with the command runner recording instead
of running (no Slurm needed): a failed pin is never followed by a release, and a requeue is
stamped into the job's Comment before it happens."""

from __future__ import annotations

from dataclasses import replace
from typing import Any, cast

from test_slurm_mapping import CONFIG, RAW_JOB

from gpufair.client import GpufairClient
from gpufair.integrations.slurm import events
from gpufair.integrations.slurm.bridge import Bridge, CycleReport
from gpufair.integrations.slurm.records import parse_job
from gpufair.integrations.slurm.slurmctl import SlurmCommandError, SlurmCtl
from gpufair.v1 import ledger_pb2, scheduler_pb2


class RecordingSlurm(SlurmCtl):
    """Records each command; `fail_on` names a scontrol verb that exits non-zero."""

    def __init__(self, fail_on: str = "") -> None:
        super().__init__()
        self.fail_on = fail_on
        self.commands: list[list[str]] = []

    def _run(self, program: str, *args: str) -> str:
        self.commands.append([program, *args])
        if args and args[0] == self.fail_on:
            raise SlurmCommandError(f"{program} {args[0]} exited 1: Invalid node name specified")
        return ""


def bridge(slurm: SlurmCtl) -> Bridge:
    # _place and _requeue talk to Slurm only; no gpufair call happens in them.
    return Bridge(CONFIG, cast(GpufairClient, None), slurm, clock=lambda: 1796136520.2503817)


PODS = [
    scheduler_pb2.PodBinding(pod_index=1, node="a100-1", gpu_indices=[0, 1, 2, 3]),
    scheduler_pb2.PodBinding(pod_index=0, node="a100-0", gpu_indices=[4, 5, 6, 7]),
]


def test_pin_then_release_in_pod_order() -> None:
    slurm = RecordingSlurm()
    report = CycleReport()
    bridge(slurm)._place(parse_job(RAW_JOB), "slurm-42", PODS, report)
    assert slurm.commands == [
        ["scontrol", "update", "JobId=42", "NodeList=a100-0,a100-1", "StartTime=now"],
        ["scontrol", "release", "42"],
    ]
    assert report.placed == {"slurm-42": ["a100-0", "a100-1"]} and not report.errors


def test_failed_pin_is_never_followed_by_a_release() -> None:
    slurm = RecordingSlurm(fail_on="update")
    report = CycleReport()
    bridge(slurm)._place(parse_job(RAW_JOB), "slurm-42", PODS, report)
    assert [c[1] for c in slurm.commands] == ["update"]
    assert report.placed == {}
    assert report.errors == ["slurm-42: scontrol update exited 1: Invalid node name specified"]


def test_two_pods_on_one_node_are_not_pinned_and_the_job_says_why() -> None:
    slurm = RecordingSlurm()
    report = CycleReport()
    same_node = [replace_node(p, "rtx-0") for p in PODS]
    bridge(slurm)._place(parse_job(RAW_JOB), "slurm-42", same_node, report)
    reason = "gpufair bound several pods to one node (rtx-0,rtx-0)"
    assert slurm.commands == [
        ["scontrol", "update", "JobId=42", f"Comment=gpufair: not scheduled: {reason}"]
    ]
    assert report.placed == {} and report.unmappable == {"slurm-42": reason}


def test_requeue_is_stamped_first_and_reported_at_the_stamp() -> None:
    slurm = RecordingSlurm()
    report = CycleReport()
    out: list[ledger_pb2.LedgerEvent] = []
    running = replace(parse_job(RAW_JOB), state="RUNNING", priority=1, restart_count=2)
    bridge(slurm)._requeue(running, "slurm-42", out, report)
    assert slurm.commands == [
        ["scontrol", "update", "JobId=42", "Comment=gpufair: requeued run 2 at 1796136520.250"],
        ["scontrol", "requeuehold", "42"],
    ]
    assert [(e.event_id, e.kind) for e in out] == [
        (events.event_id("slurm-42", 2, "preempted"), ledger_pb2.EVENT_KIND_PREEMPTED)
    ]
    assert out[0].occurred_at.ToMicroseconds() == 1796136520250000
    # A restarted bridge reads the stamp back and builds the same event.
    stamped = events.stamped_requeue_s(slurm.commands[0][3].removeprefix("Comment="), 2)
    assert stamped is not None
    assert events.ended("slurm-42", 2, stamped, ledger_pb2.EVENT_KIND_PREEMPTED) == out[0]


def test_failed_stamp_means_no_requeue() -> None:
    slurm = RecordingSlurm(fail_on="update")
    report = CycleReport()
    out: list[ledger_pb2.LedgerEvent] = []
    running = replace(parse_job(RAW_JOB), state="RUNNING", priority=1)
    bridge(slurm)._requeue(running, "slurm-42", out, report)
    assert [c[1] for c in slurm.commands] == ["update"]
    assert out == [] and report.requeued == []


def replace_node(pod: Any, node: str) -> scheduler_pb2.PodBinding:
    copy = scheduler_pb2.PodBinding()
    copy.CopyFrom(pod)
    copy.node = node
    return copy
