"""What the bridge reads from a Slurm job's state: the Slurm states and begin times that mean
something to it, and the judgements of a job (why it would not start, whether a requeue is
ending, whether its row reads its GPU indices) that step 2's rows (reconcile.py) act on."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime

from gpufair.integrations.slurm import dependencies
from gpufair.integrations.slurm.records import SlurmJob
from gpufair.integrations.slurm.slurmctl import SlurmCommandError
from gpufair.v1 import ledger_pb2, scheduler_pb2

RUNNING_STATES = ("RUNNING", "COMPLETING", "SUSPENDED", "CONFIGURING")
END_KINDS = {
    "COMPLETED": ledger_pb2.EVENT_KIND_STOPPED,
    "CANCELLED": ledger_pb2.EVENT_KIND_STOPPED,
    "PREEMPTED": ledger_pb2.EVENT_KIND_PREEMPTED,
}
HELD_BY_OPERATOR = "JobHeldAdmin"
# The begin time that means "held by its user" (2100-01-01T00:00:00Z): a site's job_submit.lua
# (examples/slurm/job_submit.lua) sets it when a job's owner holds it, since Slurm records nothing
# of a non-operator's hold of a held job, and sets the begin time to now when it is released.
USER_HOLD_BEGIN_S = 4_102_444_800
# The begin time that means "released by its owner" (2099-12-31T00:00:00Z): the script lets the
# owner's release through to Slurm, which judges it (it refuses one of an operator's hold), and
# sets this begin time with it, so that Slurm does not start the released job by itself. No wait:
# the bridge holds the job again and gpufair places it (the pin's `StartTime=now` clears it).
OWNER_RELEASE_BEGIN_S = 4_102_358_400
# A requeue sets the job's submit time to its instant and its begin time `cred_expire` + 1 s
# later (121 s by default): a begin time that close after a requeue is Slurm's delay, which the
# pin's `StartTime=now` clears, not a wait the user asked for.
REQUEUE_DELAY_MAX_S = 300


def needs_gpu_indices(job: SlurmJob, state: str | None) -> bool:
    """Whether `Reconciler.reconcile` of this job, its workload in gpufair `state`, reads its GPU
    indices (`Reconciler._started`, `requeue_completing`)."""
    if state == "running":
        return job.state == "COMPLETING" and job.restart_count > 0
    if state not in ("pending", "bound") or job.state == "PENDING":
        return False
    if job.state in RUNNING_STATES:
        return job.state != "COMPLETING"
    return bool(job.nodes and job.start_time)  # ended: its run reported, if Slurm shows one


def requeue_delay(job: SlurmJob) -> bool:
    """The job's begin time is the one Slurm's requeue set (or one set within 5 minutes of it)."""
    return job.restart_count > 0 and job.eligible_time - job.submit_time <= REQUEUE_DELAY_MAX_S


def check_gpu_indices_read(job: SlurmJob) -> None:
    """A record without GPU indices here is a cycle that skipped `squeue --json` wrongly
    (`Reconciler.needs_gpu_indices`): an error of the job's row, never a start with the wrong
    GPUs."""
    if not job.gpu_indices_read:
        raise SlurmCommandError(f"job {job.job_id}: read without its GPU indices")


def pending_again_s(job: SlurmJob, clock: Callable[[], float]) -> float:
    """When the run of a job requeued by someone else ended, for a job Slurm shows pending
    again: its submit time, which the requeue sets to the second Slurm made the job pending
    (the requeue's own second for a job whose processes die at once: an admin's `scontrol
    requeue`, a node set DOWN; seen on 22.05), in Slurm's clock as the run's start is, and the
    same in every cycle and after a restart of the bridge, however late it looks. The
    bridge's clock only when Slurm shows none. (`squeue` has nothing better: sacct needs
    accounting, and the COMPLETING record's start time is Slurm's time of the read.)"""
    return float(job.submit_time) if job.submit_time else clock()


def requeue_completing(job: SlurmJob, slurm_now: Callable[[], float]) -> bool:
    """Slurm shows a running job it has just requeued (seen on 22.05 after `scontrol
    requeue`) COMPLETING until its processes are gone: restart count already raised, no GPU
    indices, start time Slurm's time now and end time that plus the time limit (unset, 0
    here, without one). A run that ended shows the same but its end time, at most Slurm's
    time now; Slurm's clock is read only for a job with a time limit."""
    if job.state != "COMPLETING" or job.restart_count == 0:
        return False
    check_gpu_indices_read(job)
    if any(job.gpu_indices):
        return False
    return job.end_time == 0 or job.end_time > slurm_now()


def cannot_start(
    job: SlurmJob, status: scheduler_pb2.WorkloadStatus, ready: dict[str, bool]
) -> str | None:
    """Why a job released to gpufair's nodes cannot start there: one of them is drained,
    down or not responding in Slurm (not ready in this cycle's `sinfo`). Slurm
    keeps such a job pending (reason `ReqNodeNotAvail`) until the node comes back."""
    lost = sorted({p.node for p in status.pods if not ready.get(p.node, True)})
    if not lost:
        return None
    return (
        f"bound to {','.join(lost)}, which Slurm cannot start it on (drained, down or not "
        f"responding; {job.state_reason or 'pending'}): gpufair places it again"
    )


def blocked(
    job: SlurmJob, all_jobs: dependencies.Jobs, slurm_now: Callable[[], float]
) -> str | None:
    """Why Slurm would not start this pending job now, apart from the bridge's own hold.

    A dependency that can never be met comes first, before an operator's hold: Slurm's own
    dependency pass (about once a minute, seen on 22.05) marks such a dependency `(failed)`
    and turns the reason of a job with priority 0, the bridge's user hold too, into
    `JobHeldAdmin`, as if an operator had held it. A hold by the job's owner is told from
    the bridge's by the begin time the site's job_submit.lua gives it (`USER_HOLD_BEGIN_S`):
    the hold itself is the same user hold as the bridge's."""
    unmet = dependencies.unmet(job, all_jobs, slurm_now)
    if unmet is not None and unmet.never:
        return unmet.reason
    if job.held and job.state_reason == HELD_BY_OPERATOR:
        return (
            f"held by an operator (scontrol hold); scontrol uhold {job.job_id} hands it back "
            "to gpufair"
        )
    if job.eligible_time == USER_HOLD_BEGIN_S:
        return (
            f"held by its user (scontrol hold); scontrol release {job.job_id} hands it back "
            "to gpufair"
        )
    if (
        job.eligible_time
        and job.eligible_time != OWNER_RELEASE_BEGIN_S
        and not requeue_delay(job)
        and job.eligible_time > slurm_now()
    ):
        begin = datetime.fromtimestamp(job.eligible_time, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        return (
            f"waits for its begin time {begin} (StartTime); scontrol update "
            f"JobId={job.job_id} StartTime=now hands it back to gpufair"
        )
    return None if unmet is None else unmet.reason
