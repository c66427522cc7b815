"""The Slurm commands the bridge issues and their order, and its table of (Slurm state, gpufair
state) -> action, with the command runner recording instead of running (no Slurm needed): a failed
pin is never followed by a release, a requeue is stamped into the job's Comment before it happens,
and a restarted bridge picks up every half-done step from what Slurm and gpufair show."""

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


def status(state: str, *, evicting: bool = False) -> scheduler_pb2.WorkloadStatus:
    return scheduler_pb2.WorkloadStatus(
        workload=scheduler_pb2.Workload(uid="slurm-42"), state=state, pods=PODS, evicting=evicting
    )


def reconcile(
    job: Any, state: scheduler_pb2.WorkloadStatus | None, slurm: RecordingSlurm
) -> tuple[list[ledger_pb2.LedgerEvent], list[Any], CycleReport]:
    out: list[ledger_pb2.LedgerEvent] = []
    to_submit: list[Any] = []
    report = CycleReport()
    bridge(slurm)._reconcile(job, state, out, to_submit, report)
    return out, to_submit, report


def test_restarted_bridge_pins_a_bound_job_still_held() -> None:
    slurm = RecordingSlurm()
    out, to_submit, _ = reconcile(parse_job(RAW_JOB), status("bound"), slurm)
    assert [c[1] for c in slurm.commands] == ["update", "release"]
    assert out == [] and to_submit == []


def test_released_job_waiting_to_start_is_left_alone_and_an_unbound_one_is_held_back() -> None:
    released = replace(parse_job(RAW_JOB), priority=4294901742)
    slurm = RecordingSlurm()
    reconcile(released, status("bound"), slurm)
    assert slurm.commands == []
    reconcile(released, status("pending"), slurm)
    assert slurm.commands == [["scontrol", "hold", "42"]]


def test_requeue_whose_report_was_lost_is_reported_at_its_stamp() -> None:
    requeued = replace(
        parse_job(RAW_JOB), restart_count=1, comment=events.requeue_stamp(0, 1796136510.5)
    )
    slurm = RecordingSlurm()
    out, _, _ = reconcile(requeued, status("running", evicting=True), slurm)
    assert slurm.commands == []
    assert out == [events.ended("slurm-42", 0, 1796136510.5, ledger_pb2.EVENT_KIND_PREEMPTED)]


def test_evicted_job_still_running_is_requeued() -> None:
    running = replace(parse_job(RAW_JOB), state="RUNNING", priority=1, start_time=1796136500)
    slurm = RecordingSlurm()
    out, _, report = reconcile(running, status("running", evicting=True), slurm)
    assert [c[1] for c in slurm.commands] == ["update", "requeuehold"]
    assert report.requeued == ["slurm-42"] and len(out) == 1


def test_start_is_reported_with_slurms_time_nodes_and_gpu_indices() -> None:
    running = replace(
        parse_job(RAW_JOB),
        state="RUNNING",
        priority=1,
        start_time=1796136500,
        nodes=("a100-0", "a100-1"),
        gpu_indices=((0, 1, 2, 3), (4, 5, 6, 7)),
    )
    out, _, _ = reconcile(running, status("bound"), RecordingSlurm())
    assert out == [
        events.started(
            "slurm-42", 0, 1796136500, ["a100-0", "a100-1"], [[0, 1, 2, 3], [4, 5, 6, 7]]
        )
    ]


def test_end_is_reported_at_slurms_end_time_with_its_kind() -> None:
    ended = {
        "COMPLETED": ledger_pb2.EVENT_KIND_STOPPED,
        "CANCELLED": ledger_pb2.EVENT_KIND_STOPPED,
        "TIMEOUT": ledger_pb2.EVENT_KIND_FAILED,
        "NODE_FAIL": ledger_pb2.EVENT_KIND_FAILED,
    }
    for state, kind in ended.items():
        job = replace(parse_job(RAW_JOB), state=state, start_time=1796136500, end_time=1796136530)
        out, _, _ = reconcile(job, status("running"), RecordingSlurm())
        assert out == [events.ended("slurm-42", 0, 1796136530, kind)], state


def test_unknown_held_job_is_mapped_for_submission_and_an_unmappable_one_says_why() -> None:
    slurm = RecordingSlurm()
    _, to_submit, _ = reconcile(parse_job(RAW_JOB), None, slurm)
    assert [w.uid for _, w in to_submit] == ["slurm-42"]
    lost = replace(parse_job(RAW_JOB), account="finance")
    _, to_submit, report = reconcile(lost, None, slurm)
    assert to_submit == [] and report.unmappable == {
        "slurm-42": "account 'finance' maps to no gpufair queue"
    }
    assert slurm.commands == [
        [
            "scontrol",
            "update",
            "JobId=42",
            "Comment=gpufair: not scheduled: account 'finance' maps to no gpufair queue",
        ]
    ]
    # Written once: the next cycle sees the Comment already says so.
    again = RecordingSlurm()
    reconcile(replace(lost, comment=slurm.commands[0][3].removeprefix("Comment=")), None, again)
    assert again.commands == []
