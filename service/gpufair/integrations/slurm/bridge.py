"""One cycle of the Slurm bridge: Slurm's state in, gpufair's decisions out.

Stateless: everything a cycle needs is read again from Slurm (`squeue`, `sinfo`: job state, held
flag, Comment, restart count, times, GPU indices) and from gpufair (`ListWorkloads`: each
workload's state, binding and `evicting` flag; `GetConfig`'s GPU types with their memory, in a cycle
that maps a constraint needing them), so a bridge killed at any point and started again
carries on where the two systems say things stand. The in-memory caches only avoid repeating
writes that would change nothing.

The jobs are read as text (`squeue -O` and `scontrol -d show job -o`, slurmctl.py), which costs a
fifteenth of `squeue --json` on Slurm 22.05 and gives the GPU indices of a job that holds resources
(`scontrol -d`'s detail), but not a pending job's reason where Slurm printed a description in its
place. A cycle in which a row of step 2 reads GPU indices (a start to report; a requeued job
COMPLETING to judge: `Reconciler.needs_gpu_indices`) of a job whose detail the text read did not
give clearly reads `squeue --json` as well, after gpufair's workloads, and goes on from that read
alone; a text read with a pending job showing a description reads `squeue --json` instead (as after
someone else's `scontrol requeuehold`: the bridge's own evictions leave no description,
`Placement.requeue`). The cycle after one that needed `squeue --json` reads it first
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
   `scontrol uhold` list (`Reconciler.hold_first`); a job whose hold failed is left for the next
   cycle.

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
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from gpufair.client import GpufairClient
from gpufair.integrations.slurm import dependencies, job_states
from gpufair.integrations.slurm.config import BridgeConfig
from gpufair.integrations.slurm.mapping import job_id_of, parse_uid, uid_of
from gpufair.integrations.slurm.node_sync import NodeSync
from gpufair.integrations.slurm.placement import Placement
from gpufair.integrations.slurm.reconcile import Reconciler
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
        self._placement = Placement(config, client, slurm, clock, self._nodes, self._slurm_now)
        self._gpu_memory_now: dict[str, float] | None = None  # read at most once per cycle
        # Slurm's clock, read at most once per cycle (a failed read too: the cycle's other jobs
        # fail with it rather than each trying again).
        self._slurm_now_s: float | SlurmCommandError | None = None
        self._reconciler = Reconciler(
            config,
            client,
            slurm,
            clock,
            self._nodes,
            self._placement,
            gpu_memory=self._gpu_memory,
            slurm_now=self._slurm_now,
        )
        # Read `squeue --json` first next cycle (`_text_short`); False: the text read first.
        self._json_next = False

    # ---- the cycle -----------------------------------------------------------------------

    def cycle(self) -> CycleReport:
        report = CycleReport()
        self._gpu_memory_now = self._slurm_now_s = None
        self._nodes.sync(report)
        json_first = self._json_next
        jobs = self._take_jobs(gpu_indices=json_first)
        statuses = self._workloads()
        self._reconciler.current = self._current_uids(statuses)
        needs_json = self._reconciler.needs_gpu_indices(jobs, statuses)
        if needs_json:
            # A start to report, or a requeued job's COMPLETING to judge, of a job whose GPU
            # indices the text read did not give clearly: the jobs read again, with their GPU
            # indices (`squeue --json`), and this cycle goes on from that read.
            jobs = self._take_jobs(gpu_indices=True)
        self._json_next = needs_json  # more at the cycle's end (`_text_short`)
        self._reconciler.withdraw_after_submit, self._reconciler.bound_held = {}, []
        pending_events: list[ledger_pb2.LedgerEvent] = []
        to_submit: list[tuple[SlurmJob, scheduler_pb2.Workload]] = []
        jobs, not_held = self._reconciler.hold_first(jobs, statuses, report)
        for job in jobs.values():
            uid = self._reconciler.current.get(job.job_id, uid_of(self.config, job.job_id))
            if job.job_id in not_held:
                continue  # its hold failed (in the report's errors): nothing more this cycle
            try:
                self._reconciler.reconcile(
                    job, statuses.get(uid), pending_events, to_submit, report
                )
            except SlurmCommandError as exc:
                report.errors.append(f"{uid}: {exc}")
        bound_held, self._reconciler.bound_held = self._reconciler.bound_held, None
        self._placement.place_all(bound_held, report)
        self._reconciler.cancel_vanished(jobs, statuses, report)
        self._reconciler.submit(to_submit, report)
        self._reconciler.withdraw_replaced(report)
        self._send(pending_events, report)
        for pool in self.config.pools:
            decided: list[ledger_pb2.LedgerEvent] = []
            reply = self.client.schedule(pool)
            for evict in reply.evicts:
                victim = self._reconciler.job_of(evict.uid, jobs)
                if victim is not None and victim.state in job_states.RUNNING_STATES:
                    self._placement.requeue(victim, evict.uid, decided, report)
            binds = [(self._reconciler.job_of(b.uid, jobs), b.uid, b.pods) for b in reply.binds]
            self._placement.place_all(
                [(job, uid, pods) for job, uid, pods in binds if job is not None], report
            )
            self._send(decided, report)
        self._json_next = self._json_next or self._text_short(report)
        return report

    def _read_jobs(self, *, gpu_indices: bool) -> list[SlurmJob]:
        return self.slurm.jobs(gpu_indices=True) if gpu_indices else self.slurm.jobs()

    def _take_jobs(self, *, gpu_indices: bool) -> dict[int, SlurmJob]:
        """Read the jobs into the cycle's view (`Reconciler.all_jobs`: every job Slurm lists,
        which dependencies may name); the jobs of mapped partitions, by id."""
        self._reconciler.all_jobs = dependencies.Jobs.of(self._read_jobs(gpu_indices=gpu_indices))
        return {i: j for i, j in self._reconciler.all_jobs.by_id.items() if self._mapped(j)}

    def _current_uids(self, statuses: dict[str, scheduler_pb2.WorkloadStatus]) -> dict[int, str]:
        """Per job id, the uid of its newest active workload (the highest revision)."""
        current: dict[int, str] = {}
        revisions: dict[int, int] = {}
        for uid in statuses:
            parsed = parse_uid(self.config, uid)
            if parsed is not None and parsed[1] >= revisions.get(parsed[0], -1):
                current[parsed[0]], revisions[parsed[0]] = uid, parsed[1]
        return current

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
            for job in self._reconciler.all_jobs.by_id.values()
        )

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
