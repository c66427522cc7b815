"""One cycle of the Slurm bridge: Slurm's state in, gpufair's decisions out.

Stateless: everything a cycle needs is read again from Slurm (`squeue`, `sinfo`: job state, held
flag, Comment, restart count, times, GPU indices) and from gpufair (`ListWorkloads`: each
workload's state, binding and `evicting` flag; `GetConfig`'s GPU types with their memory, in a cycle
that maps a constraint needing them), so a bridge killed at any point and started again
carries on where the two systems say things stand. The in-memory caches only avoid repeating
writes that would change nothing.

The jobs are read as text (`squeue -O` and `scontrol -d show job -o`, slurmctl.py), which costs
a fifteenth of `squeue --json` on Slurm 22.05 and gives the GPU indices of a job that holds
resources (`scontrol -d`'s detail), but not a pending job's reason where Slurm printed a
description in its place. A cycle in which a row of step 2 reads GPU indices (a start to report;
a requeued job COMPLETING to judge: `_needs_gpu_indices`) of a job whose detail the text read
did not give clearly reads `squeue --json` as well, after gpufair's workloads, and goes on from
that read alone; a text read with a pending job showing a description reads `squeue --json`
instead (as after someone else's `scontrol requeuehold`: the bridge's own evictions leave no
description, `Placement.requeue`). The cycle after one that needed `squeue --json` reads it first
(`_text_short`), so such cycles in a row read the jobs once each.

A cycle:

1. **Nodes.** The nodes of mapped partitions are upserted into their pools (pruning the pools'
   nodes Slurm no longer has); drained, down or failing nodes are not ready.
2. **Jobs in, what ran in.** For each job of a mapped partition, by (Slurm state, gpufair state):

   | Slurm | gpufair | the bridge |
   |---|---|---|
   | pending, held | unknown | map and submit; unmappable or refused: the reason into Comment |
   | pending, held | bound | pin to the bound nodes, then release (a restart re-pins) |
   | pending, released | bound | left to start; a bound node not ready in `sinfo`: hold, withdraw |
   | pending, released, reason `BeginTime` | bound | bound while a foreign requeue completed: hold, pin, release |
   | pending, held by an operator or its user, before its begin time or waiting for a dependency | pending/bound | withdraw it |
   | pending | pending/bound, asking otherwise | submit the new request, withdraw the old |
   | pending (requeued) | running | hold it if not held; `preempted` at the stamp, else its submit time |
   | pending, not held | not bound | hold it back: gpufair decides where it runs |
   | running | pending/bound | `started` with Slurm's start time, nodes and GPU indices |
   | completing (a requeue's too) | pending/bound | nothing yet: the row of what it shows next |
   | running | running, evicting | stamp Comment, `uhold`, `requeue`, `preempted` |
   | completing, requeued by someone else | running | `preempted` for the run that ended, now |
   | running | running | a heartbeat per `heartbeat_s` |
   | running | unknown | map and submit (Slurm started it itself): the start follows |
   | ended | running | `stopped` (completed, cancelled) or `failed`, at Slurm's end time |
   | ended | pending/bound | a run Slurm shows: `started` + its end; none: `CancelWorkload` |

   A job's workload is the newest revision gpufair has active for it (`slurm-42`, then
   `slurm-42.1`, ...: a uid names one request for good, so a job whose request changed while it
   waited, or that was withdrawn and may run again, gets a new one). Withdrawing cancels the
   workload after writing its uid into the job's Comment (`gpufair: not scheduled (withdrew
   slurm-42): ...`), from which the next revision is numbered, across restarts too. Once gpufair
   has the job again, a Comment of the bridge saying it is not scheduled goes (`""`), or, when it
   names a withdrawn uid, becomes `gpufair: submitted as slurm-42.1 (withdrew slurm-42)`.

   The holds every row of a pending job not held makes (all but a bound job's) go first, in one
   `scontrol uhold` list (`_hold_first`); a job whose hold failed is left for the next cycle.

3. **Decisions out.** `Schedule` per pool; a bind pins the job and releases it (a failed pin is
   never followed by a release), an evict holds the job and requeues it (step 2's row, at
   once). The pool's pinned jobs are released together, in one `scontrol release` list;
   Slurm's error for one of them (it ended meanwhile) is that job's alone. The held jobs step
   2 finds already bound (the "held, bound" row: a bind no cycle pinned, as after a restart of
   the bridge) are pinned, one `scontrol update` each, and released in one list too, after the
   rows.

Events go in one `StreamEvents` call per step, so gpufair knows what stopped before it decides.

A job's begin time (`--begin`, `scontrol update StartTime=`: how a user makes a job the bridge
holds wait) and the minutes of `after:N+m` are judged against Slurm's clock (`sdiag`, read once
in a cycle that needs it), never the bridge's. Slurm ignores a non-operator's `scontrol hold` of
a held job; a site's job_submit.lua records it as a begin time of its own (`USER_HOLD_BEGIN_S`),
which the bridge reads as "held by its user" (withdrawn, never released) until the owner's
release, which the script lets Slurm judge and marks with `OWNER_RELEASE_BEGIN_S` (not a wait:
the job is handed back). The script keeps an owner's begin time through the bridge's pin and
an operator's release, so a hold landing after the cycle's read is not lost: the job is
released with that begin time, Slurm does not start it, and the next cycle holds it back.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace

from gpufair.client import GpufairClient
from gpufair.integrations.slurm import comments, dependencies, events, job_states
from gpufair.integrations.slurm.config import BridgeConfig
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
from gpufair.integrations.slurm.slurmctl import SlurmCommandError, SlurmCtl
from gpufair.v1 import ledger_pb2, scheduler_pb2

log = logging.getLogger("gpufair.slurm_bridge")


@dataclass
class CycleReport:
    """What one cycle did, for logs and tests."""

    submitted: list[str] = field(default_factory=list)
    withdrawn: dict[str, str] = field(default_factory=dict)  # uid -> why
    unmappable: dict[str, str] = field(default_factory=dict)
    placed: dict[str, list[str]] = field(default_factory=dict)  # uid -> nodes
    requeued: list[str] = field(default_factory=list)
    cancelled: list[str] = field(default_factory=list)
    events: dict[str, int] = field(default_factory=dict)  # status name -> count
    errors: list[str] = field(default_factory=list)

    def busy(self) -> bool:
        return any(
            (
                self.submitted,
                self.withdrawn,
                self.unmappable,
                self.placed,
                self.requeued,
                self.cancelled,
            )
        ) or bool(self.errors or self.events.get("STORED"))


class Bridge:
    def __init__(
        self,
        config: BridgeConfig,
        client: GpufairClient,
        slurm: SlurmCtl,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.config = config
        self.client = client
        self.slurm = slurm
        self.clock = clock
        self._nodes = NodeSync(config, client, slurm, clock)
        self._placement = Placement(config, slurm, clock, self._nodes, self._slurm_now)
        self._gpu_memory_now: dict[str, float] | None = None  # read at most once per cycle
        # Slurm's clock, read at most once per cycle (a failed read too: the cycle's other jobs
        # fail with it rather than each trying again).
        self._slurm_now_s: float | SlurmCommandError | None = None
        # This cycle's view: every job Slurm lists (dependencies may name any), and the uid of
        # each job's newest active workload.
        self._all_jobs = dependencies.Jobs({})
        self._current: dict[int, str] = {}
        self._revisions: dict[int, int] = {}  # job id -> newest active revision
        self._withdraw_after_submit: dict[str, tuple[str, SlurmJob]] = {}  # new uid -> old uid
        # In a cycle, the held jobs whose workload is already bound (by an earlier cycle that did
        # not pin them, e.g. before a restart of the bridge): placed together after the rows.
        # None outside a cycle: a row run on its own places its job at once.
        self._bound_held: list[tuple[SlurmJob, str, Sequence[scheduler_pb2.PodBinding]]] | None
        self._bound_held = None
        # Read `squeue --json` first next cycle (`_text_short`); False: the text read first.
        self._json_next = False

    # ---- the cycle -----------------------------------------------------------------------

    def cycle(self) -> CycleReport:
        report = CycleReport()
        self._gpu_memory_now = self._slurm_now_s = None
        self._nodes.sync(report)
        json_first = self._json_next
        self._all_jobs = dependencies.Jobs.of(self._read_jobs(gpu_indices=json_first))
        jobs = {i: j for i, j in self._all_jobs.by_id.items() if self._mapped(j)}
        statuses = self._workloads()
        self._current, self._revisions = {}, {}
        for uid in statuses:
            parsed = parse_uid(self.config, uid)
            if parsed is not None and parsed[1] >= self._revisions.get(parsed[0], -1):
                self._current[parsed[0]], self._revisions[parsed[0]] = uid, parsed[1]
        needs_json = self._needs_gpu_indices(jobs, statuses)
        if needs_json:
            # A start to report, or a requeued job's COMPLETING to judge, of a job whose GPU
            # indices the text read did not give clearly: the jobs read again, with their GPU
            # indices (`squeue --json`), and this cycle goes on from that read.
            self._all_jobs = dependencies.Jobs.of(self._read_jobs(gpu_indices=True))
            jobs = {i: j for i, j in self._all_jobs.by_id.items() if self._mapped(j)}
        self._json_next = needs_json  # more at the cycle's end (`_text_short`)
        self._withdraw_after_submit, self._bound_held = {}, []
        pending_events: list[ledger_pb2.LedgerEvent] = []
        to_submit: list[tuple[SlurmJob, scheduler_pb2.Workload]] = []
        jobs, not_held = self._hold_first(jobs, statuses, report)
        for job in jobs.values():
            uid = self._current.get(job.job_id, uid_of(self.config, job.job_id))
            if job.job_id in not_held:
                continue  # its hold failed (in the report's errors): nothing more this cycle
            try:
                self._reconcile(job, statuses.get(uid), pending_events, to_submit, report)
            except SlurmCommandError as exc:
                report.errors.append(f"{uid}: {exc}")
        bound_held, self._bound_held = self._bound_held, None
        self._placement.place_all(bound_held, report)
        self._cancel_vanished(jobs, statuses, report)
        self._submit(to_submit, report)
        self._withdraw_replaced(report)
        self._send(pending_events, report)
        for pool in self.config.pools:
            decided: list[ledger_pb2.LedgerEvent] = []
            reply = self.client.schedule(pool)
            for evict in reply.evicts:
                victim = self._job_of(evict.uid, jobs)
                if victim is not None and victim.state in job_states.RUNNING_STATES:
                    self._placement.requeue(victim, evict.uid, decided, report)
            binds = [(self._job_of(b.uid, jobs), b.uid, b.pods) for b in reply.binds]
            self._placement.place_all(
                [(job, uid, pods) for job, uid, pods in binds if job is not None], report
            )
            self._send(decided, report)
        self._json_next = self._json_next or self._text_short(report)
        return report

    def _read_jobs(self, *, gpu_indices: bool) -> list[SlurmJob]:
        return self.slurm.jobs(gpu_indices=True) if gpu_indices else self.slurm.jobs()

    def _text_short(self, report: CycleReport) -> bool:
        """Whether the text read will not do for the next cycle: a job read pending with a
        description in place of its reason (records.py; `squeue --json` alone says so) that
        this cycle did not release (a release clears the description: checked on 22.05), as a
        job someone requeued with `requeuehold` shows until it is released. The next cycle then
        reads `squeue --json` first, as it does after a cycle whose rows needed GPU indices the
        text read did not give: not both reads in the cycles that follow one another so. Only
        the cost depends on this guess: a cycle that reads the text and finds it short reads
        `squeue --json` as well. Starts no longer count (round 31): the text read gives GPU
        indices (`scontrol -d`), so neither the cycle after one that placed jobs nor the one
        reporting a start reads `squeue --json` for them. Nor do the bridge's own evictions:
        `uhold` then `requeue` leaves the job no description (`Placement.requeue`)."""
        released = {job_id_of(self.config, uid) for uid in report.placed}
        return any(
            job.state == "PENDING" and job.state_description and job.job_id not in released
            for job in self._all_jobs.by_id.values()
        )

    def _hold_first(
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
            uid = self._current.get(job.job_id, uid_of(self.config, job.job_id))
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

    def _needs_gpu_indices(
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
        """The jobs whose row of step 2 reads their GPU indices (`_needs_gpu_indices`)."""
        for job in jobs.values():
            uid = self._current.get(job.job_id, uid_of(self.config, job.job_id))
            status = statuses.get(uid)
            if job_states.needs_gpu_indices(job, status.state if status is not None else None):
                yield job

    def _mapped(self, job: SlurmJob) -> bool:
        """A job of a mapped partition (or submitted to several, one of them mapped)."""
        return any(p in self.config.partitions for p in job.partition.split(","))

    def _workloads(self) -> dict[str, scheduler_pb2.WorkloadStatus]:
        found: dict[str, scheduler_pb2.WorkloadStatus] = {}
        for pool in self.config.pools:
            for status in self.client.list_workloads(pool=pool):
                if job_id_of(self.config, status.workload.uid) is not None:
                    found[status.workload.uid] = status
        return found

    def _gpu_memory(self) -> dict[str, float]:
        """gpufair's GPU types and the memory of one GPU of each, from its config: read in a
        cycle only when a job's constraint needs them, and once."""
        if self._gpu_memory_now is None:
            types = self.client.get_config().config.gpu_types
            self._gpu_memory_now = {t.name: t.memory_gib for t in types}
        return self._gpu_memory_now

    def _slurm_now(self) -> float:
        """Slurm's time now (the controller's clock, which its start and begin times are in):
        read in a cycle only when a begin time or an `after:N+m` needs it, and once."""
        if self._slurm_now_s is None:
            try:
                self._slurm_now_s = self.slurm.now()
            except SlurmCommandError as exc:
                self._slurm_now_s = exc
        if isinstance(self._slurm_now_s, SlurmCommandError):
            raise self._slurm_now_s
        return self._slurm_now_s

    def _job_of(self, uid: str, jobs: dict[int, SlurmJob]) -> SlurmJob | None:
        """The job of a decision's uid, if that uid is the job's workload now (never a
        revision the job's request has replaced)."""
        job_id = job_id_of(self.config, uid)
        if job_id is None or self._current.get(job_id, uid) != uid:
            return None
        return jobs.get(job_id)

    # ---- jobs ----------------------------------------------------------------------------

    def _reconcile(
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
            if state == "running" and job_states.requeue_completing(job, self._slurm_now):
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
                self._placement.requeue(job, uid, out, report)
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
        blocked = job_states.blocked(job, self._all_jobs, self._slurm_now)
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
            mapped = map_job(self.config, job, gpu_memory=self._gpu_memory, revision=last + 1)
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
                stuck = job_states.cannot_start(job, status, self._nodes.ready)
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
            self._withdraw_after_submit[mapped.uid] = (uid, job)
        elif active:
            # A Comment a failed write left stale.
            comments.note_submitted(self.config, self.slurm, job, uid)
            if state == "bound" and status is not None and not status.evicting:
                if self._bound_held is None:
                    self._placement.place(job, uid, status.pods, report)
                else:  # pinned and released after the rows, with the others: one release list
                    self._bound_held.append((job, uid, status.pods))

    def _withdraw(self, job: SlurmJob, uid: str, reason: str, report: CycleReport) -> None:
        """Cancel the job's waiting workload, its uid first written into the Comment (the next
        revision is numbered from it, after a restart too)."""
        comments.explain(self.config, self.slurm, job, uid, reason, report, withdrew=uid)
        self.client.cancel_workload(uid)
        report.withdrawn[uid] = reason

    def _withdraw_replaced(self, report: CycleReport) -> None:
        for new_uid, (old_uid, job) in self._withdraw_after_submit.items():
            if new_uid in report.submitted:
                self.client.cancel_workload(old_uid)
                report.withdrawn[old_uid] = f"replaced by {new_uid}: the job's request changed"
                self._current[job.job_id] = new_uid
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
        mapped = map_job(self.config, job, gpu_memory=self._gpu_memory, revision=revision)
        if isinstance(mapped, Unmappable):
            comments.explain(self.config, self.slurm, job, uid, mapped.reason, report)
        else:
            to_submit.append((job, mapped))

    def _submit(
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

    def _cancel_vanished(
        self,
        jobs: dict[int, SlurmJob],
        statuses: dict[str, scheduler_pb2.WorkloadStatus],
        report: CycleReport,
    ) -> None:
        """Workloads whose job Slurm no longer lists at all (purged) and that never ran, and
        waiting revisions a newer one replaced (left by a crash between the two steps)."""
        for uid, status in statuses.items():
            job_id = job_id_of(self.config, uid)
            replaced = job_id in self._current and self._current[job_id] != uid
            if (job_id not in jobs or replaced) and status.state in ("pending", "bound"):
                self.client.cancel_workload(uid)
                report.cancelled.append(uid)

    # ---- decisions -----------------------------------------------------------------------

    def _send(self, batch: Sequence[ledger_pb2.LedgerEvent], report: CycleReport) -> None:
        if not batch:
            return
        reply = self.client.stream_events([batch])
        for event, result in zip(batch, reply.results, strict=True):
            name = ledger_pb2.EventStatus.Name(result.status).removeprefix("EVENT_STATUS_")
            report.events[name] = report.events.get(name, 0) + 1
            if result.status == ledger_pb2.EVENT_STATUS_REJECTED:
                report.errors.append(f"{event.workload_uid}: event refused: {result.error}")
