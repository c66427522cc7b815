"""The Slurm commands the bridge issues and their order, and its table of (Slurm state, gpufair
state) -> action, with the command runner recording instead of running (no Slurm needed): a failed
pin is never followed by a release, a requeue is stamped into the job's Comment before it happens,
and a restarted bridge picks up every half-done step from what Slurm and gpufair show (every row
of the table in bridge.py). Then whole cycles against a real gpufair with Slurm's answers set by
the test: a workload gpufair refuses, workloads whose job Slurm forgot, heartbeats, a refused event.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any, cast

import pytest
from slurm_support import cluster_config
from sqlalchemy import Engine, text
from test_slurm_mapping import CONFIG, RAW_JOB

from gpufair.client import GpufairClient
from gpufair.integrations.slurm import events
from gpufair.integrations.slurm.bridge import Bridge, CycleReport
from gpufair.integrations.slurm.job_states import OWNER_RELEASE_BEGIN_S
from gpufair.integrations.slurm.mapping import Unmappable, map_job
from gpufair.integrations.slurm.records import SlurmJob, SlurmNode, parse_job, parse_node
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


class RecordingClient:
    """The one gpufair call `_reconcile` makes itself, recorded: CancelWorkload."""

    def __init__(self) -> None:
        self.cancelled: list[str] = []

    def cancel_workload(self, uid: str) -> scheduler_pb2.CancelWorkloadResponse:
        self.cancelled.append(uid)
        return scheduler_pb2.CancelWorkloadResponse()


NOW_S = 1796136520.2503817


def bridge(slurm: SlurmCtl, client: RecordingClient | None = None, now_s: float = NOW_S) -> Bridge:
    # _place and _requeue talk to Slurm only; _reconcile calls gpufair only to cancel.
    return Bridge(CONFIG, cast(GpufairClient, client), slurm, clock=lambda: now_s)


PODS = [
    scheduler_pb2.PodBinding(pod_index=1, node="a100-1", gpu_indices=[0, 1, 2, 3]),
    scheduler_pb2.PodBinding(pod_index=0, node="a100-0", gpu_indices=[4, 5, 6, 7]),
]


def test_pin_then_release_in_pod_order() -> None:
    """A job with no begin time to clear is pinned without `StartTime=` (which would overwrite a
    begin time set since the read: an owner's hold); a requeued one with Slurm's delay, and one
    its owner released (the 2099 mark), with `StartTime=now`. The requeued one only once
    Slurm's clock (`sdiag`) is 2 s past its requeue."""
    job = parse_job(RAW_JOB)
    requeued = replace(
        job, restart_count=1, submit_time=SLURM_NOW_S - 10, eligible_time=SLURM_NOW_S + 111
    )
    released = replace(job, eligible_time=OWNER_RELEASE_BEGIN_S)
    late_begin = replace(job, restart_count=1, eligible_time=job.submit_time + 3600)
    cases: tuple[tuple[SlurmJob, list[str], list[list[str]]], ...] = (
        (job, [], []),
        (requeued, ["StartTime=now"], [["sdiag"]]),
        (released, ["StartTime=now"], []),
    )
    for placed, start, clock in cases:
        slurm = SlurmWithClock()
        report = CycleReport()
        bridge(slurm)._placement.place(placed, "slurm-42", PODS, report)
        assert slurm.commands == [
            *clock,
            ["scontrol", "update", "JobId=42", "NodeList=a100-0,a100-1", *start],
            ["scontrol", "release", "42"],
        ]
        assert report.placed == {"slurm-42": ["a100-0", "a100-1"]} and not report.errors
    later = RecordingSlurm()
    bridge(later)._placement.place(late_begin, "slurm-42", PODS, CycleReport())
    assert later.commands[0] == ["scontrol", "update", "JobId=42", "NodeList=a100-0,a100-1"]


def test_failed_pin_is_never_followed_by_a_release() -> None:
    slurm = RecordingSlurm(fail_on="update")
    report = CycleReport()
    bridge(slurm)._placement.place(parse_job(RAW_JOB), "slurm-42", PODS, report)
    assert [c[1] for c in slurm.commands] == ["update"]
    assert report.placed == {}
    assert report.errors == ["slurm-42: scontrol update exited 1: Invalid node name specified"]


def test_two_pods_on_one_node_are_not_pinned_and_the_job_says_why() -> None:
    slurm = RecordingSlurm()
    report = CycleReport()
    same_node = [replace_node(p, "rtx-0") for p in PODS]
    bridge(slurm)._placement.place(parse_job(RAW_JOB), "slurm-42", same_node, report)
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
    bridge(slurm)._placement.requeue(running, "slurm-42", out, report)
    assert slurm.commands == [
        ["scontrol", "update", "JobId=42", "Comment=gpufair: requeued run 2 at 1796136520.250"],
        ["scontrol", "uhold", "42"],
        ["scontrol", "requeue", "42"],
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
    bridge(slurm)._placement.requeue(running, "slurm-42", out, report)
    assert [c[1] for c in slurm.commands] == ["update"]
    assert out == [] and report.requeued == []


def test_failed_hold_means_no_requeue() -> None:
    """The eviction holds the running job before it requeues it: a hold that failed (the job
    ended meanwhile) is not followed by a requeue, which would leave the job pending and not
    held, for Slurm to start by itself once the requeue's begin time has passed."""
    slurm = RecordingSlurm(fail_on="uhold")
    report = CycleReport()
    out: list[ledger_pb2.LedgerEvent] = []
    running = replace(parse_job(RAW_JOB), state="RUNNING", priority=1)
    bridge(slurm)._placement.requeue(running, "slurm-42", out, report)
    assert [c[1] for c in slurm.commands] == ["update", "uhold"]
    assert out == [] and report.requeued == []
    assert report.errors == ["slurm-42: scontrol uhold exited 1: Invalid node name specified"]


def test_bridge_stopped_between_the_hold_and_the_requeue_requeues_the_held_job_next() -> None:
    """A bridge that dies after the eviction's `uhold` and before its `requeue` (here: the
    requeue fails) leaves the job running, held (priority 0, as Slurm 22.05 shows a running job
    after `uhold`), and gpufair evicting it. The next cycle's row requeues it: stamped again,
    held again, requeued, its run ended at the new stamp (it ran until then), once."""
    slurm = RecordingSlurm(fail_on="requeue")
    running = replace(parse_job(RAW_JOB), state="RUNNING", priority=1, start_time=1796136500)
    out, _, report = reconcile(running, status("running", evicting=True), slurm)
    assert [c[1] for c in slurm.commands] == ["update", "uhold", "requeue"]
    assert out == [] and report.requeued == []
    stamped = slurm.commands[0][3].removeprefix("Comment=")
    held_running = replace(running, priority=0, state_reason="JobHeldUser", comment=stamped)
    again = RecordingSlurm()
    later_s = NOW_S + 7
    out, _, report = reconcile(held_running, status("running", evicting=True), again, None, later_s)
    assert again.commands == [
        ["scontrol", "update", "JobId=42", "Comment=gpufair: requeued run 0 at 1796136527.250"],
        ["scontrol", "uhold", "42"],
        ["scontrol", "requeue", "42"],
    ]
    assert report.requeued == ["slurm-42"]
    assert out == [events.ended("slurm-42", 0, 1796136527.25, ledger_pb2.EVENT_KIND_PREEMPTED)]
    # Slurm then shows it pending, still held by the bridge's user hold: no hold, no second end
    # for the row that finds gpufair still running it (a lost report), at the stamp.
    requeued = replace(
        held_running,
        state="PENDING",
        restart_count=1,
        comment=again.commands[0][3].removeprefix("Comment="),
    )
    last = RecordingSlurm()
    out, _, _ = reconcile(requeued, status("running", evicting=True), last, None, later_s + 2)
    assert last.commands == []
    assert out == [events.ended("slurm-42", 0, 1796136527.25, ledger_pb2.EVENT_KIND_PREEMPTED)]


def replace_node(pod: Any, node: str) -> scheduler_pb2.PodBinding:
    copy = scheduler_pb2.PodBinding()
    copy.CopyFrom(pod)
    copy.node = node
    return copy


def status(state: str, *, evicting: bool = False) -> scheduler_pb2.WorkloadStatus:
    """gpufair's view of job 42's workload, as submitted from RAW_JOB."""
    workload = map_job(CONFIG, parse_job(RAW_JOB))
    assert not isinstance(workload, Unmappable)
    return scheduler_pb2.WorkloadStatus(
        workload=workload, state=state, pods=PODS, evicting=evicting
    )


def reconcile(
    job: Any,
    state: scheduler_pb2.WorkloadStatus | None,
    slurm: RecordingSlurm,
    client: RecordingClient | None = None,
    now_s: float = NOW_S,
) -> tuple[list[ledger_pb2.LedgerEvent], list[Any], CycleReport]:
    out: list[ledger_pb2.LedgerEvent] = []
    to_submit: list[Any] = []
    report = CycleReport()
    bridge(slurm, client, now_s)._reconciler.reconcile(job, state, out, to_submit, report)
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
    assert slurm.commands == [["scontrol", "uhold", "42"]]


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
    assert slurm.commands == [
        ["scontrol", "update", "JobId=42", "Comment=gpufair: requeued run 0 at 1796136520.250"],
        ["scontrol", "uhold", "42"],
        ["scontrol", "requeue", "42"],
    ]
    assert report.requeued == ["slurm-42"]
    assert out == [events.ended("slurm-42", 0, 1796136520.25, ledger_pb2.EVENT_KIND_PREEMPTED)]


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


def test_a_requeued_job_still_completing_is_not_a_new_start() -> None:
    """Right after `requeuehold`, Slurm 22.05 shows the job COMPLETING with restart count 1,
    priority 0, its node, no GPU indices and the old run's start time, until its processes are
    gone (seen with `squeue --json` at once after the requeue, then pending), while gpufair has
    the run's end (pending again, or bound anew by a later cycle). Before, the bridge took it
    for run 1 starting: with gpufair's workload pending, a `started` event without pods that
    gpufair refused (`a started event needs the pods it runs on`, an error of the cycle seen
    against the real Slurm); with it bound, a `started` event of run 1 on the new binding at the
    old run's start time. Now nothing is reported until Slurm shows it pending (or ended)."""
    completing = replace(
        parse_job(RAW_JOB),
        state="COMPLETING",
        priority=0,
        restart_count=1,
        comment=events.requeue_stamp(0, 1796136510.5),
        start_time=1796136500,
        nodes=("a100-0",),
        gpu_indices=(),
    )
    for state in ("pending", "bound"):
        slurm = RecordingSlurm()
        out, to_submit, report = reconcile(completing, status(state), slurm)
        assert (out, to_submit, slurm.commands, report.errors) == ([], [], [], []), state
    # Once Slurm shows it pending and held, it waits in gpufair as any requeued job.
    pending = replace(completing, state="PENDING", nodes=())
    out, _, _ = reconcile(pending, status("pending"), RecordingSlurm())
    assert out == []


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


def test_requeue_without_a_stamp_is_reported_at_slurms_submit_time() -> None:
    # Requeued by someone else (or the stamp is of another run): the end is the second Slurm
    # made the job pending again (its submit time, which the requeue sets), not when the bridge
    # saw it (NOW_S, 12 s later); the bridge's clock only when Slurm shows no submit time.
    for comment in ("", events.requeue_stamp(1, 1796136510.5)):
        for submit_s, end_s in ((1796136508, 1796136508.0), (0, NOW_S)):
            requeued = replace(
                parse_job(RAW_JOB), restart_count=1, comment=comment, submit_time=submit_s
            )
            slurm = RecordingSlurm()
            out, to_submit, _ = reconcile(requeued, status("running"), slurm)
            assert slurm.commands == [] and to_submit == []
            assert out == [events.ended("slurm-42", 0, end_s, ledger_pb2.EVENT_KIND_PREEMPTED)]


def test_running_job_gets_one_heartbeat_at_the_start_of_each_period_after_the_first() -> None:
    running = replace(parse_job(RAW_JOB), state="RUNNING", priority=1, start_time=1796136400)
    # 1796136485 is 5 s into the period that began at 1796136480 (= 29935608 x 60).
    slurm = RecordingSlurm()
    out, to_submit, _ = reconcile(running, status("running"), slurm, now_s=1796136485.0)
    assert slurm.commands == [] and to_submit == []
    assert [(e.event_id, e.kind, e.occurred_at.ToSeconds()) for e in out] == [
        (
            events.event_id("slurm-42", 0, "heartbeat-29935608"),
            ledger_pb2.EVENT_KIND_HEARTBEAT,
            1796136480,
        )
    ]
    # 40 s into that period (its first two 5 s cycles are past), or 35 s into the run: none.
    assert reconcile(running, status("running"), slurm, now_s=1796136520.25)[0] == []
    recent = replace(running, start_time=1796136450)
    assert reconcile(recent, status("running"), slurm, now_s=1796136485.0)[0] == []


def test_job_slurm_started_itself_is_submitted_and_not_held() -> None:
    running = replace(parse_job(RAW_JOB), state="RUNNING", priority=1, start_time=1796136500)
    slurm = RecordingSlurm()
    out, to_submit, report = reconcile(running, None, slurm)
    assert slurm.commands == [] and out == [] and report.submitted == []
    assert [(w.uid, w.queue, w.pool, w.pods, w.gpus_per_pod) for _, w in to_submit] == [
        ("slurm-42", "vision-train", "main", 2, 4)
    ]


def test_job_that_ended_without_a_run_is_cancelled_in_gpufair() -> None:
    never_ran = replace(parse_job(RAW_JOB), state="CANCELLED", end_time=1796136530)
    for state in ("pending", "bound"):
        slurm, client = RecordingSlurm(), RecordingClient()
        out, _, report = reconcile(never_ran, status(state), slurm, client)
        assert client.cancelled == ["slurm-42"] and report.cancelled == ["slurm-42"], state
        assert out == [] and slurm.commands == []


def test_run_gpufair_never_saw_start_is_reported_whole_when_the_job_has_ended() -> None:
    # Ended with its GPU indices no longer shown: the nodes and GPUs of gpufair's binding.
    completed = replace(
        parse_job(RAW_JOB),
        state="COMPLETED",
        priority=1,
        nodes=("a100-1", "a100-0"),
        start_time=1796136500,
        end_time=1796136530,
    )
    client = RecordingClient()
    out, _, report = reconcile(completed, status("bound"), RecordingSlurm(), client)
    assert out == [
        events.started(
            "slurm-42", 0, 1796136500, ["a100-1", "a100-0"], [[0, 1, 2, 3], [4, 5, 6, 7]]
        ),
        events.ended("slurm-42", 0, 1796136530, ledger_pb2.EVENT_KIND_STOPPED),
    ]
    assert client.cancelled == [] and report.cancelled == []
    # Failed with the indices still shown: Slurm's, and the end is a failure.
    failed = replace(
        completed, state="NODE_FAIL", nodes=("a100-0", "a100-1"), gpu_indices=((0, 1), (2, 3))
    )
    out, _, _ = reconcile(failed, status("pending"), RecordingSlurm(), client)
    assert out == [
        events.started("slurm-42", 0, 1796136500, ["a100-0", "a100-1"], [[0, 1], [2, 3]]),
        events.ended("slurm-42", 0, 1796136530, ledger_pb2.EVENT_KIND_FAILED),
    ]
    assert client.cancelled == []


# ---- whole cycles against gpufair, Slurm's answers set by the test ------------------------------


class CannedSlurm(RecordingSlurm):
    """`squeue` and `sinfo` answer what the test sets; the other commands are recorded."""

    def __init__(self, nodes: list[SlurmNode]) -> None:
        super().__init__()
        self.node_list = nodes
        self.job_list: list[SlurmJob] = []

    def jobs(self, *, gpu_indices: bool = False) -> list[SlurmJob]:
        return list(self.job_list)

    def nodes(self) -> list[SlurmNode]:
        return list(self.node_list)


def slurm_node(name: str, gres: str = "gpu:a100:8") -> SlurmNode:
    raw = {"name": name, "partitions": ["gpu"], "gres": gres, "cpus": 64, "real_memory": 512000}
    return parse_node({**raw, "state": "idle", "state_flags": [], "features": ""})


def held_job(job_id: int, **changes: Any) -> SlurmJob:
    return replace(
        parse_job(RAW_JOB), job_id=job_id, submit_time=int(time.time()) - 600 + job_id, **changes
    )


def states(client: GpufairClient) -> dict[str, str]:
    every = ["pending", "bound", "running", "finished", "cancelled"]
    return {w.workload.uid: w.state for w in client.list_workloads(states=every)}


def test_refused_workload_says_why_in_its_comment_and_vanished_ones_are_cancelled(
    client: GpufairClient,
) -> None:
    client.apply_config(cluster_config("main"))
    config = replace(CONFIG, accounts={"vision": "team-a", "finance": "team-c"})
    slurm = CannedSlurm([slurm_node("a100-0"), slurm_node("a100-1")])
    # 2 x 4 GPUs; an account whose queue gpufair lacks; 2 x 8 GPUs, which waits for the first.
    slurm.job_list = [held_job(42), held_job(43, account="finance"), held_job(44)]
    slurm.job_list[2] = replace(slurm.job_list[2], tres_per_node="gres:gpu:8")
    live = Bridge(config, client, slurm)
    first = live.cycle()
    assert first.submitted == ["slurm-42", "slurm-44"]
    assert first.unmappable == {"slurm-43": "unknown queue 'team-c'"}
    assert first.placed == {"slurm-42": ["a100-0", "a100-1"]}
    assert (first.cancelled, first.errors) == ([], [])
    refused = "Comment=gpufair: not scheduled: unknown queue 'team-c'"
    assert slurm.commands == [
        ["scontrol", "update", "JobId=43", refused],
        ["scontrol", "update", "JobId=42", "NodeList=a100-0,a100-1"],
        ["scontrol", "release", "42"],
    ]
    assert states(client) == {"slurm-42": "bound", "slurm-44": "pending"}

    # Slurm forgets both jobs (purged before they started): gpufair cancels them; the refused
    # job's Comment already says why, so nothing is written again.
    slurm.commands.clear()
    slurm.job_list = [replace(slurm.job_list[1], comment=refused.removeprefix("Comment="))]
    second = live.cycle()
    assert sorted(second.cancelled) == ["slurm-42", "slurm-44"]
    assert second.unmappable == {"slurm-43": "unknown queue 'team-c'"}
    assert (second.submitted, second.placed, second.errors) == ([], {}, [])
    assert slurm.commands == []
    assert states(client) == {"slurm-42": "cancelled", "slurm-44": "cancelled"}


def test_running_job_start_and_heartbeats_reach_the_ledger(
    client: GpufairClient, db: Engine
) -> None:
    client.apply_config(cluster_config("main"))
    config = replace(CONFIG, accounts={"vision": "team-a"})
    slurm = CannedSlurm([slurm_node("a100-0"), slurm_node("a100-1")])
    minute_s = (int(time.time()) // 60 - 3) * 60  # a period's start, 3 to 4 minutes ago
    now = [float(minute_s)]
    live = Bridge(config, client, slurm, clock=lambda: now[0])
    slurm.job_list = [held_job(42, node_count=1, max_nodes=1)]
    assert live.cycle().placed == {"slurm-42": ["a100-0"]}
    [bound] = client.list_workloads(states=["bound"])
    indices = tuple(bound.pods[0].gpu_indices)
    assert len(indices) == 4
    running = replace(
        slurm.job_list[0],
        state="RUNNING",
        priority=1,
        nodes=("a100-0",),
        gpu_indices=(indices,),
        start_time=minute_s + 1,
    )
    slurm.job_list = [running]
    # A cycle each: the start; the run's first period over, the heartbeat at the period's
    # start; the next cycle resends it (a duplicate); later in the period, none.
    sent = []
    for at_s in (minute_s + 30, minute_s + 63, minute_s + 68, minute_s + 75):
        now[0] = float(at_s)
        report = live.cycle()
        assert report.errors == []
        sent.append(report.events)
    assert sent == [{"STORED": 1}, {"STORED": 1}, {"DUPLICATE": 1}, {}]
    with db.connect() as conn:
        stored = conn.execute(
            text(
                "SELECT kind, extract(epoch FROM occurred_at)::float8 FROM ledger_events "
                "WHERE workload_uid = 'slurm-42' ORDER BY occurred_at"
            )
        ).all()
    assert [tuple(r) for r in stored] == [("started", minute_s + 1), ("heartbeat", minute_s + 60)]
    assert states(client) == {"slurm-42": "running"}


def test_event_gpufair_refuses_is_an_error_of_the_cycle(client: GpufairClient) -> None:
    client.apply_config(cluster_config("main"))
    config = replace(CONFIG, accounts={"vision": "team-a"})
    # An H100 node in the partition: its GPU type is not mapped, so gpufair does not have it.
    slurm = CannedSlurm([slurm_node("a100-0"), slurm_node("h100-0", gres="gpu:h100:8")])
    started_s = int(time.time()) - 30
    slurm.job_list = [
        held_job(45, node_count=1, max_nodes=1, tres_per_node="gres:gpu:1", priority=1)
    ]
    slurm.job_list[0] = replace(
        slurm.job_list[0],
        state="RUNNING",
        nodes=("h100-0",),
        gpu_indices=((3,),),
        start_time=started_s,
    )
    live = Bridge(config, client, slurm)
    assert live.cycle().submitted == ["slurm-45"]  # Slurm started it itself
    report = live.cycle()
    assert report.events == {"REJECTED": 1}
    assert report.errors == ["slurm-45: event refused: pods[0]: unknown node 'h100-0'"]
    assert states(client)["slurm-45"] in ("pending", "bound")


# ---- a begin time, on Slurm's clock -------------------------------------------------------------

SLURM_NOW_S = 1796136000  # Slurm's clock, 520 s behind the bridge's (NOW_S)
SDIAG = (
    "*******************************************************\n"
    f"sdiag output at Tue Dec 01 14:40:00 2026 ({SLURM_NOW_S})\n"
    "Data since      Tue Dec 01 14:38:20 2026 (1796135900)\n"
)


class SlurmWithClock(RecordingSlurm):
    """Answers `sdiag` with SDIAG (or fails it)."""

    def __init__(self, *, sdiag_fails: bool = False) -> None:
        super().__init__()
        self.sdiag_fails = sdiag_fails

    def _run(self, program: str, *args: str) -> str:
        if program != "sdiag":
            return super()._run(program, *args)
        self.commands.append([program])
        if self.sdiag_fails:
            raise SlurmCommandError("sdiag exited 1: Unable to contact slurm controller")
        return SDIAG


def test_slurms_time_is_read_from_sdiag() -> None:
    assert SlurmWithClock().now() == SLURM_NOW_S
    with pytest.raises(SlurmCommandError, match="no time"):
        RecordingSlurm().now()


def test_a_begin_time_ahead_on_slurms_clock_withdraws_the_job_asking_slurm_once() -> None:
    """A begin time 100 s ahead of Slurm's clock, though 420 s behind the bridge's: the job waits
    (the pin would clear the user's begin time), its workload withdrawn; Slurm's time is read once
    for the cycle's jobs."""
    ahead = replace(parse_job(RAW_JOB), eligible_time=SLURM_NOW_S + 100)
    slurm, client = SlurmWithClock(), RecordingClient()
    one = bridge(slurm, client)
    for _ in range(2):
        one._reconciler.reconcile(ahead, status("bound"), [], [], CycleReport())
    assert [c for c in slurm.commands if c[0] == "sdiag"] == [["sdiag"]]
    assert ["release"] not in [c[1:2] for c in slurm.commands]
    assert client.cancelled == ["slurm-42", "slurm-42"]
    assert slurm.commands[1] == [
        "scontrol", "update", "JobId=42",
        "Comment=gpufair: not scheduled (withdrew slurm-42): waits for its begin time "
        "2026-12-01T14:41:40Z (StartTime); scontrol update JobId=42 StartTime=now hands it back "
        "to gpufair",
    ]  # fmt: skip


def test_a_begin_time_reached_on_slurms_clock_lets_the_job_be_placed() -> None:
    reached = replace(parse_job(RAW_JOB), eligible_time=SLURM_NOW_S)
    slurm = SlurmWithClock()
    reconcile(reached, status("bound"), slurm)
    assert [c[:2] for c in slurm.commands] == [
        ["sdiag"],
        ["scontrol", "update"],
        ["scontrol", "release"],
    ]


def test_the_delay_a_requeue_sets_is_not_a_users_begin_time() -> None:
    """Slurm's requeue: submit time = the requeue's instant, begin time 121 s later. gpufair
    places the job again at once (the pin clears the delay); a later begin time is the user's."""
    requeued = replace(
        parse_job(RAW_JOB),
        restart_count=1,
        submit_time=SLURM_NOW_S - 10,
        eligible_time=SLURM_NOW_S + 111,
    )
    slurm = SlurmWithClock()
    reconcile(requeued, status("bound"), slurm)
    assert [c[1] for c in slurm.commands[1:]] == ["update", "release"]
    assert slurm.commands[0] == ["sdiag"]
    slurm, client = SlurmWithClock(), RecordingClient()
    reconcile(replace(requeued, eligible_time=SLURM_NOW_S + 3600), status("bound"), slurm, client)
    assert "release" not in [c[1] for c in slurm.commands if len(c) > 1]
    assert client.cancelled == ["slurm-42"]


def test_a_requeued_job_is_not_released_within_2_s_of_its_requeue() -> None:
    """The requeue revoked the job's launch credential as of its second (or the next), and Slurm
    kills a job launched within it ("Job credential revoked"). Bound 1 s after the requeue by
    Slurm's clock, the job stays held, not pinned (a later cycle places it); 2 s after, it is
    pinned and released."""
    requeued = replace(
        parse_job(RAW_JOB),
        restart_count=1,
        submit_time=SLURM_NOW_S - 1,
        eligible_time=SLURM_NOW_S + 120,
    )
    slurm = SlurmWithClock()
    report = CycleReport()
    bridge(slurm)._placement.place(requeued, "slurm-42", PODS, report)
    assert (slurm.commands, report.placed, report.errors) == ([["sdiag"]], {}, [])

    slurm = SlurmWithClock()
    later = replace(requeued, submit_time=SLURM_NOW_S - 2)
    bridge(slurm)._placement.place(later, "slurm-42", PODS, report)
    assert [c[:2] for c in slurm.commands] == [
        ["sdiag"],
        ["scontrol", "update"],
        ["scontrol", "release"],
    ]
    assert report.placed == {"slurm-42": ["a100-0", "a100-1"]}


def test_a_requeued_job_is_not_released_onto_a_node_back_less_than_2_s_ago() -> None:
    """A node that registers again has Slurm abort the steps of jobs requeued off it, revoking
    their launch credentials there as of that second: a requeued job bound there is pinned and
    released 2 s after the bridge first read the node ready again, by its clock; a job never
    requeued at once, and so is a requeued one onto a node ready since the bridge's first cycle
    (whose past it does not know)."""

    class NodesSlurm(SlurmWithClock):
        def __init__(self, nodes: list[SlurmNode]) -> None:
            super().__init__()
            self.node_list = nodes

        def nodes(self) -> list[SlurmNode]:
            return list(self.node_list)

    class NodesClient(RecordingClient):
        def upsert_nodes(self, nodes: Any, **_: Any) -> None:
            pass  # what gpufair is told of the nodes plays no part here

    down = replace(slurm_node("a100-0"), state="down")
    slurm = NodesSlurm([down, slurm_node("a100-1")])
    now = [NOW_S]
    live = Bridge(CONFIG, cast(GpufairClient, NodesClient()), slurm, clock=lambda: now[0])
    requeued = replace(
        parse_job(RAW_JOB),
        restart_count=1,
        submit_time=SLURM_NOW_S - 600,
        eligible_time=SLURM_NOW_S - 479,  # the requeue's delay, past
    )
    live._nodes.sync(CycleReport())  # the first cycle: a100-0 down, a100-1 ready
    slurm.node_list = [slurm_node("a100-0"), slurm_node("a100-1")]
    now[0] += 5
    live._nodes.sync(CycleReport())  # a100-0 back
    one_node = [scheduler_pb2.PodBinding(pod_index=0, node="a100-0", gpu_indices=[0, 1])]

    report = CycleReport()
    now[0] += 1.9
    live._placement.place(requeued, "slurm-42", one_node, report)
    assert (slurm.commands, report.placed) == ([], {})
    live._placement.place(
        replace(requeued, job_id=43, restart_count=0), "slurm-43", one_node, report
    )
    other = [scheduler_pb2.PodBinding(pod_index=0, node="a100-1", gpu_indices=[0, 1])]
    live._placement.place(replace(requeued, job_id=44), "slurm-44", other, report)
    assert report.placed == {"slurm-43": ["a100-0"], "slurm-44": ["a100-1"]}

    now[0] += 0.1
    live._placement.place(requeued, "slurm-42", one_node, report)
    assert report.placed["slurm-42"] == ["a100-0"]
    assert slurm.commands[-2:] == [
        ["scontrol", "update", "JobId=42", "NodeList=a100-0", "StartTime=now"],
        ["scontrol", "release", "42"],
    ]


def test_a_failed_read_of_slurms_time_fails_the_job_and_is_not_repeated_in_the_cycle() -> None:
    ahead = replace(parse_job(RAW_JOB), eligible_time=SLURM_NOW_S + 100)
    slurm = SlurmWithClock(sdiag_fails=True)
    one = bridge(slurm, RecordingClient())
    for _ in range(3):
        with pytest.raises(SlurmCommandError, match="sdiag"):
            one._reconciler.reconcile(ahead, status("bound"), [], [], CycleReport())
    assert slurm.commands == [["sdiag"]]


def test_a_run_requeued_by_someone_else_ends_while_slurm_still_shows_it_completing() -> None:
    """After an operator's `scontrol requeue`, Slurm 22.05 shows the job COMPLETING (restart
    count 1, no GPU indices, start time Slurm's now, end time that plus the time limit) until
    its processes are gone, seconds later for a job slow to die. The run gpufair has running
    ends now, at the bridge's clock (the stamp, had the bridge requeued it), as run 0; no
    heartbeat of run 1. A run that ended shows its end time, at most Slurm's time now: no
    requeue, nothing reported while it completes."""
    requeued = replace(
        parse_job(RAW_JOB),
        state="COMPLETING",
        restart_count=1,
        start_time=int(SLURM_NOW_S),
        end_time=int(SLURM_NOW_S) + 3600,  # `--time=60`
        nodes=("a100-0",),
        gpu_indices=(),
    )
    slurm = SlurmWithClock()
    out, _, report = reconcile(requeued, status("running"), slurm, now_s=SLURM_NOW_S + 1e6)
    preempted = events.ended("slurm-42", 0, SLURM_NOW_S + 1e6, ledger_pb2.EVENT_KIND_PREEMPTED)
    assert (out, report.errors, slurm.commands) == ([preempted], [], [["sdiag"]])
    no_limit = replace(requeued, end_time=0)
    out, _, _ = reconcile(no_limit, status("running"), RecordingSlurm(), now_s=SLURM_NOW_S + 1e6)
    assert out == [preempted]

    ending = replace(requeued, start_time=int(SLURM_NOW_S) - 600, end_time=int(SLURM_NOW_S) - 1)
    out, _, _ = reconcile(ending, status("running"), SlurmWithClock(), now_s=SLURM_NOW_S + 1e6)
    assert out == []


def test_a_released_job_whose_node_is_lost_is_given_back_and_a_requeued_one_is_pinned() -> None:
    """Released to a100-0 and a100-1 (gpufair's binding), not started: with a100-0 drained,
    down or not responding in this cycle's `sinfo`, Slurm keeps it pending (`ReqNodeNotAvail`)
    until the node is back; the bridge holds it and withdraws the workload, so gpufair places the
    next revision elsewhere. Released and bound with every node ready: left to start. Bound
    while Slurm still showed a foreign requeue COMPLETING (never pinned), then pending with the
    requeue's begin time: held, pinned (which clears that time) and released."""
    released = replace(parse_job(RAW_JOB), priority=4294901742, state_reason="ReqNodeNotAvail")
    slurm, client = RecordingSlurm(), RecordingClient()
    lost = bridge(slurm, client)
    lost._nodes.ready = {"a100-0": False, "a100-1": True}
    out: list[ledger_pb2.LedgerEvent] = []
    report = CycleReport()
    lost._reconciler.reconcile(released, status("bound"), out, [], report)
    assert slurm.commands[0] == ["scontrol", "uhold", "42"]
    assert [c[:3] for c in slurm.commands[1:]] == [["scontrol", "update", "JobId=42"]]
    assert slurm.commands[1][3].startswith("Comment=gpufair: not scheduled (withdrew slurm-42): ")
    assert "bound to a100-0, which Slurm cannot start it on" in slurm.commands[1][3]
    assert (client.cancelled, list(report.withdrawn), out) == (["slurm-42"], ["slurm-42"], [])

    slurm = SlurmWithClock()
    ready = bridge(slurm)
    ready._nodes.ready = {"a100-0": True, "a100-1": True}
    ready._reconciler.reconcile(
        replace(released, state_reason="Resources"), status("bound"), [], [], report
    )
    assert slurm.commands == []

    requeued = replace(
        released,
        state_reason="BeginTime",
        restart_count=1,
        submit_time=SLURM_NOW_S - 10,
        eligible_time=SLURM_NOW_S + 111,
    )
    ready._reconciler.reconcile(requeued, status("bound"), [], [], report)
    assert slurm.commands[0] == ["scontrol", "uhold", "42"]
    assert slurm.commands[1:] == [
        ["sdiag"],
        ["scontrol", "update", "JobId=42", "NodeList=a100-0,a100-1", "StartTime=now"],
        ["scontrol", "release", "42"],
    ]


def test_a_job_its_owner_released_is_held_again_and_placed_not_kept_waiting() -> None:
    """The owner's release goes to Slurm as a release (job_submit.lua), with the begin time
    2099-12-31 (`OWNER_RELEASE_BEGIN_S`) that keeps Slurm from starting the job: not a wait. A
    bound job is held again, pinned (the pin's `StartTime=now` clears that begin time) and
    released; one gpufair does not have (withdrawn while its user held it) is held and submitted.
    Neither reads Slurm's clock nor withdraws anything."""
    released = replace(
        parse_job(RAW_JOB),
        priority=4294901756,
        state_reason="BeginTime",
        eligible_time=OWNER_RELEASE_BEGIN_S,
    )
    slurm, client = SlurmWithClock(), RecordingClient()
    out, to_submit, report = reconcile(released, status("bound"), slurm, client)
    assert [c[:2] for c in slurm.commands] == [
        ["scontrol", "uhold"],
        ["scontrol", "update"],
        ["scontrol", "release"],
    ]
    assert "StartTime=now" in slurm.commands[1]
    assert (out, to_submit, report.withdrawn, client.cancelled) == ([], [], {}, [])
    slurm = SlurmWithClock()
    out, to_submit, report = reconcile(released, None, slurm, client)
    assert slurm.commands == [["scontrol", "uhold", "42"]]
    assert [w.uid for _, w in to_submit] == ["slurm-42"]
    assert (report.withdrawn, report.unmappable, client.cancelled) == ({}, {}, [])
