"""Step 2 of a cycle (bridge.py): each job of a mapped partition against its workload in
gpufair, by (Slurm state, gpufair state), as the table in bridge.py sets out; the workloads
submitted, withdrawn and cancelled as those rows decide."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from gpufair.integrations.slurm import comments, dependencies, events, job_states
from gpufair.integrations.slurm.bridge_part import BridgePart
from gpufair.integrations.slurm.mapping import (
    Unmappable,
    job_id_of,
    map_job,
    parse_uid,
    same_request,
    uid_of,
)
from gpufair.integrations.slurm.node_sync import NodeSync
from gpufair.integrations.slurm.placement import Placement
from gpufair.integrations.slurm.records import SlurmJob
from gpufair.integrations.slurm.slurmctl import SlurmCommandError
from gpufair.v1 import ledger_pb2, scheduler_pb2

if TYPE_CHECKING:
    from gpufair.integrations.slurm.bridge import CycleReport


@dataclass(eq=False)
class Reconciler(BridgePart):
    nodes: NodeSync  # this cycle's ready nodes (`job_states.cannot_start`)
    placement: Placement
    gpu_memory: Callable[[], dict[str, float]]  # gpufair's GPU types, read at most once per cycle
    slurm_now: Callable[[], float]  # Slurm's clock, read at most once per cycle
    # This cycle's view: every job Slurm lists (dependencies may name any), and the uid of
    # each job's newest active workload.
    all_jobs: dependencies.Jobs = field(default_factory=lambda: dependencies.Jobs({}), init=False)
    current: dict[int, str] = field(default_factory=dict, init=False)
    # new uid -> old uid
    withdraw_after_submit: dict[str, tuple[str, SlurmJob]] = field(default_factory=dict, init=False)
    # In a cycle, the held jobs whose workload is already bound (by an earlier cycle that did
    # not pin them, e.g. before a restart of the bridge): placed together after the rows.
    # None outside a cycle: a row run on its own places its job at once.
    bound_held: list[tuple[SlurmJob, str, Sequence[scheduler_pb2.PodBinding]]] | None = field(
        default=None, init=False
    )

    def hold_first(
        self,
        jobs: dict[int, SlurmJob],
        statuses: dict[str, scheduler_pb2.WorkloadStatus],
        report: CycleReport,
    ) -> tuple[dict[int, SlurmJob], set[int]]:
        """Hold, in one `scontrol uhold` list, every pending job that step 2's rows would hold
        whatever else they find: one not held whose workload is not bound (a bound one, released
        to its nodes, is held only when it cannot start there, which its row decides). The jobs,
        those held here shown held (the rows go on from there, and a bind of this cycle places
        them), and the jobs whose hold failed, each with its error in the report: nothing else
        is done for them this cycle, as when a row's own hold fails."""
        wanted: dict[int, str] = {}
        for job in jobs.values():
            uid = self.current.get(job.job_id, uid_of(self.config, job.job_id))
            status = statuses.get(uid)
            if (
                job.state == "PENDING"
                and not job.held
                and (status is None or status.state != "bound")
            ):
                wanted[job.job_id] = uid
        if not wanted:
            return jobs, set()
        failed = self.slurm.hold_many(list(wanted))
        for job_id, exc in failed.items():
            report.errors.append(f"{wanted[job_id]}: {exc}")
        held = {
            i: replace(j, priority=0) for i, j in jobs.items() if i in wanted and i not in failed
        }
        return {**jobs, **held}, set(failed)

    def needs_gpu_indices(
        self, jobs: dict[int, SlurmJob], statuses: dict[str, scheduler_pb2.WorkloadStatus]
    ) -> bool:
        """Whether a job read without its GPU indices (a record of `SlurmCtl.jobs`' text read
        whose `scontrol -d` detail was not clear) meets a row of step 2 that reads them: a
        start to report (`_started`: running, or ended with a run Slurm shows, while gpufair
        has it pending or bound) or a COMPLETING job gpufair has running, restarted
        (`job_states.requeue_completing`). Those rows need `squeue --json`; the others do not,
        nor do these rows of a job whose indices the text read gave."""
        rows = self._rows_reading_gpu_indices(jobs, statuses)
        return any(not job.gpu_indices_read for job in rows)

    def _rows_reading_gpu_indices(
        self, jobs: dict[int, SlurmJob], statuses: dict[str, scheduler_pb2.WorkloadStatus]
    ) -> Iterator[SlurmJob]:
        """The jobs whose row of step 2 reads their GPU indices (`needs_gpu_indices`)."""
        for job in jobs.values():
            uid = self.current.get(job.job_id, uid_of(self.config, job.job_id))
            status = statuses.get(uid)
            if job_states.needs_gpu_indices(job, status.state if status is not None else None):
                yield job

    def job_of(self, uid: str, jobs: dict[int, SlurmJob]) -> SlurmJob | None:
        """The job of a decision's uid, if that uid is the job's workload now (never a
        revision the job's request has replaced)."""
        job_id = job_id_of(self.config, uid)
        if job_id is None or self.current.get(job_id, uid) != uid:
            return None
        return jobs.get(job_id)

    def reconcile(
        self,
        job: SlurmJob,
        status: scheduler_pb2.WorkloadStatus | None,
        out: list[ledger_pb2.LedgerEvent],
        to_submit: list[tuple[SlurmJob, scheduler_pb2.Workload]],
        report: CycleReport,
    ) -> None:
        uid = status.workload.uid if status is not None else uid_of(self.config, job.job_id)
        state = status.state if status is not None else None
        if job.state == "PENDING" and state != "running":
            self._reconcile_waiting(job, uid, status, to_submit, report)
            return
        if job.state == "PENDING":
            if state == "running" and job.restart_count > 0:
                # Requeued (by this bridge or anyone): the previous run ended. A requeue not made
                # by this bridge leaves the job unheld, to start by itself once Slurm's eligible
                # time (about two minutes) has passed: hold it first, so that gpufair places the
                # next run like any other (pinned and released by a later cycle).
                if not job.held:
                    self.slurm.hold(job.job_id)
                run = job.restart_count - 1
                at_s = events.stamped_requeue_s(job.comment, run) or job_states.pending_again_s(
                    job, self.clock
                )
                out.append(events.ended(uid, run, at_s, ledger_pb2.EVENT_KIND_PREEMPTED))
                return
            if not job.held:
                self.slurm.hold(job.job_id)  # gpufair decides where it runs, not Slurm
            return
        run = job.restart_count
        if job.state in job_states.RUNNING_STATES:
            if state == "running" and job_states.requeue_completing(job, self.slurm_now):
                # Requeued by someone else while it ran: the run ended at the requeue, not when
                # its processes are gone (a job that ignores SIGTERM stays COMPLETING for Slurm's
                # KillWait and more). Reported now, once; no heartbeat of the raised restart
                # count, which names a run that has not started. The job is held once pending.
                run = job.restart_count - 1
                at_s = events.stamped_requeue_s(job.comment, run) or self.clock()
                out.append(events.ended(uid, run, at_s, ledger_pb2.EVENT_KIND_PREEMPTED))
                return
            if state in ("pending", "bound") and job.state == "COMPLETING":
                # A run gpufair has not seen start is ending, or the run a requeue ended is:
                # Slurm shows a requeued job COMPLETING, its restart count already raised, until
                # its processes are gone, then pending. Nothing is reported until Slurm says how
                # it ended (then its start and end together) or that it is pending again.
                return
            if state in ("pending", "bound"):
                out.append(self._started(job, uid, status))
            elif state == "running" and status is not None and status.evicting:
                self.placement.requeue(job, uid, out, report)
            elif state == "running":
                self._heartbeat(job, uid, out)
            elif state is None:
                # Started by Slurm itself (submitted without a hold): gpufair learns of it, and
                # the next cycle reports the start, so its GPUs are counted.
                self._map(job, uid, to_submit, report)
            return
        # Ended.
        kind = job_states.END_KINDS.get(job.state, ledger_pb2.EVENT_KIND_FAILED)
        if state == "running":
            out.append(events.ended(uid, run, max(job.end_time, job.start_time), kind))
        elif state in ("pending", "bound"):
            if job.nodes and job.start_time and status is not None:
                out.append(self._started(job, uid, status))
                out.append(events.ended(uid, run, max(job.end_time, job.start_time), kind))
            else:
                self.client.cancel_workload(uid)
                report.cancelled.append(uid)

    def _reconcile_waiting(
        self,
        job: SlurmJob,
        uid: str,
        status: scheduler_pb2.WorkloadStatus | None,
        to_submit: list[tuple[SlurmJob, scheduler_pb2.Workload]],
        report: CycleReport,
    ) -> None:
        """A pending job whose workload is not running: submit, withdraw, resubmit or place."""
        state = status.state if status is not None else None
        blocked = job_states.blocked(job, self.all_jobs, self.slurm_now)
        active = status is not None and state in ("pending", "bound")
        mapped: scheduler_pb2.Workload | Unmappable | None = None
        if blocked is None:
            # A new request takes the revision after the active one, or after the one last
            # withdrawn (none: -1, so the first workload is the plain `slurm-42`).
            parsed = parse_uid(self.config, uid)
            last = (
                (parsed[1] if parsed else 0)
                if active
                else comments.withdrawn_revision(self.config, job)
            )
            mapped = map_job(self.config, job, gpu_memory=self.gpu_memory, revision=last + 1)
        changed = (
            status is not None
            and active
            and (
                blocked is not None
                or isinstance(mapped, Unmappable)
                or (mapped is not None and not same_request(status.workload, mapped))
            )
        )
        if not job.held:
            if state == "bound" and not changed and status is not None:
                stuck = job_states.cannot_start(job, status, self.nodes.ready)
                if stuck is None and job.state_reason != "BeginTime":
                    return  # released to its nodes; starting
                self.slurm.hold(job.job_id)
                if stuck is not None:
                    # Given back: gpufair places the next revision elsewhere, this cycle or next.
                    self._withdraw(job, uid, stuck, report)
                    return
                # Requeued by someone else and bound before Slurm showed it pending: never
                # pinned, it waits for the requeue's begin time, then Slurm would place it.
                job = replace(job, priority=0)
            else:
                self.slurm.hold(job.job_id)  # gpufair decides where it runs, not Slurm
        if blocked is not None:
            if active:
                self._withdraw(job, uid, blocked, report)
            else:
                comments.explain(self.config, self.slurm, job, uid, blocked, report)
            return
        assert mapped is not None
        if isinstance(mapped, Unmappable):
            if active:
                self._withdraw(job, uid, mapped.reason, report)
            else:
                comments.explain(self.config, self.slurm, job, uid, mapped.reason, report)
            return
        if state is None:
            to_submit.append((job, mapped))
        elif changed:
            # The job asks otherwise now: the new request first, then the old one withdrawn,
            # so that a crash in between leaves two revisions, of which the next cycle keeps
            # the newer, never none.
            to_submit.append((job, mapped))
            self.withdraw_after_submit[mapped.uid] = (uid, job)
        elif active:
            # A Comment a failed write left stale.
            comments.note_submitted(self.config, self.slurm, job, uid)
            if state == "bound" and status is not None and not status.evicting:
                if self.bound_held is None:
                    self.placement.place(job, uid, status.pods, report)
                else:  # pinned and released after the rows, with the others: one release list
                    self.bound_held.append((job, uid, status.pods))

    def _withdraw(self, job: SlurmJob, uid: str, reason: str, report: CycleReport) -> None:
        """Cancel the job's waiting workload, its uid first written into the Comment (the next
        revision is numbered from it, after a restart too)."""
        comments.explain(self.config, self.slurm, job, uid, reason, report, withdrew=uid)
        self.client.cancel_workload(uid)
        report.withdrawn[uid] = reason

    def withdraw_replaced(self, report: CycleReport) -> None:
        for new_uid, (old_uid, job) in self.withdraw_after_submit.items():
            if new_uid in report.submitted:
                self.client.cancel_workload(old_uid)
                report.withdrawn[old_uid] = f"replaced by {new_uid}: the job's request changed"
                self.current[job.job_id] = new_uid
            else:
                try:  # refused (explained in the Comment): the old request must not run either
                    reason = report.unmappable.get(new_uid, "the changed request was refused")
                    self._withdraw(job, old_uid, reason, report)
                except SlurmCommandError as exc:
                    report.errors.append(f"{old_uid}: {exc}")

    def _heartbeat(self, job: SlurmJob, uid: str, out: list[ledger_pb2.LedgerEvent]) -> None:
        now_s, period_s = self.clock(), self.config.heartbeat_s
        if events.heartbeat_due(job.start_time, now_s, period_s, self.config.cycle_s):
            out.append(events.heartbeat(uid, job.restart_count, job.start_time, now_s, period_s))

    def _started(
        self, job: SlurmJob, uid: str, status: scheduler_pb2.WorkloadStatus | None
    ) -> ledger_pb2.LedgerEvent:
        job_states.check_gpu_indices_read(job)
        if len(job.gpu_indices) == len(job.nodes) and all(job.gpu_indices):
            return events.started(
                uid, job.restart_count, job.start_time, job.nodes, job.gpu_indices
            )
        # Slurm no longer shows the indices (the job ended): the nodes it was pinned to.
        pods = list(status.pods) if status is not None else []
        return events.started_from_binding(uid, job.restart_count, job.start_time, pods)

    def _map(
        self,
        job: SlurmJob,
        uid: str,
        to_submit: list[tuple[SlurmJob, scheduler_pb2.Workload]],
        report: CycleReport,
    ) -> None:
        revision = comments.withdrawn_revision(self.config, job) + 1
        mapped = map_job(self.config, job, gpu_memory=self.gpu_memory, revision=revision)
        if isinstance(mapped, Unmappable):
            comments.explain(self.config, self.slurm, job, uid, mapped.reason, report)
        else:
            to_submit.append((job, mapped))

    def submit(
        self, to_submit: Sequence[tuple[SlurmJob, scheduler_pb2.Workload]], report: CycleReport
    ) -> None:
        if not to_submit:
            return
        reply = self.client.submit_workloads([w for _, w in to_submit])
        for (job, workload), result in zip(to_submit, reply.results, strict=True):
            if result.accepted:
                report.submitted.append(workload.uid)
                try:
                    comments.note_submitted(self.config, self.slurm, job, workload.uid)
                except SlurmCommandError as exc:
                    report.errors.append(f"{workload.uid}: {exc}")
            else:
                try:
                    comments.explain(
                        self.config, self.slurm, job, workload.uid, result.error, report
                    )
                except SlurmCommandError as exc:
                    report.errors.append(f"{workload.uid}: {exc}")

    def cancel_vanished(
        self,
        jobs: dict[int, SlurmJob],
        statuses: dict[str, scheduler_pb2.WorkloadStatus],
        report: CycleReport,
    ) -> None:
        """Workloads whose job Slurm no longer lists at all (purged) and that never ran, and
        waiting revisions a newer one replaced (left by a crash between the two steps)."""
        for uid, status in statuses.items():
            job_id = job_id_of(self.config, uid)
            replaced = job_id in self.current and self.current[job_id] != uid
            if (job_id not in jobs or replaced) and status.state in ("pending", "bound"):
                self.client.cancel_workload(uid)
                report.cancelled.append(uid)
