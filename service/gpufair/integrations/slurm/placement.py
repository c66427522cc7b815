"""Step 3 of a cycle (bridge.py), gpufair's decisions carried out in Slurm: a bound job pinned
to gpufair's nodes and released, an evicted job held and requeued."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gpufair.integrations.slurm import comments, events, job_states
from gpufair.integrations.slurm.bridge_part import BridgePart
from gpufair.integrations.slurm.node_sync import NodeSync
from gpufair.integrations.slurm.records import SlurmJob
from gpufair.integrations.slurm.slurmctl import SlurmCommandError
from gpufair.v1 import ledger_pb2, scheduler_pb2

if TYPE_CHECKING:
    from gpufair.integrations.slurm.bridge import CycleReport

# A requeue revokes the job's launch credential on its nodes as of the second Slurm sent the kill
# (its submit time, or the second after), and a slurmd refuses a credential issued in or before
# that second: the job is then killed for good ("Killing non-startable batch JobId=N: Job
# credential revoked", FAILED; seen on 22.05). Slurm's own delay (`cred_expire` + 1 s) keeps a
# requeued job from starting that soon; the bridge, which clears that delay, releases the job no
# sooner than this many seconds after its requeue, by Slurm's clock.
RELAUNCH_AFTER_S = 2


@dataclass(eq=False)
class Placement(BridgePart):
    nodes: NodeSync  # when each node was read ready again (`_too_soon_after_return`)
    slurm_now: Callable[[], float]  # Slurm's clock, read at most once per cycle (bridge.py)

    def place(
        self,
        job: SlurmJob,
        uid: str,
        pods: Sequence[scheduler_pb2.PodBinding],
        report: CycleReport,
    ) -> None:
        """Pin the held job to gpufair's nodes, then release it; never release after a failed
        pin (Slurm would place the job itself)."""
        self.place_all([(job, uid, pods)], report)

    def place_all(
        self,
        binds: Sequence[tuple[SlurmJob, str, Sequence[scheduler_pb2.PodBinding]]],
        report: CycleReport,
    ) -> None:
        """Pin each held job to gpufair's nodes, then release it (never after a failed pin:
        Slurm would place the job itself). Every job pinned (one `scontrol update` each: the node lists
        differ), then the pinned ones released in one `scontrol release` list. A job whose pin
        failed is not released; one whose release failed (it ended meanwhile) is not placed, and
        the others are."""
        pinned: dict[int, tuple[str, list[str]]] = {}
        for job, uid, pods in binds:
            nodes = self._pin(job, uid, pods, report)
            if nodes is not None:
                pinned[job.job_id] = (uid, nodes)
        if not pinned:
            return
        failed = self.slurm.release_many(list(pinned))
        for job_id, (uid, nodes) in pinned.items():
            if job_id in failed:
                report.errors.append(f"{uid}: {failed[job_id]}")
            else:
                report.placed[uid] = nodes

    def _pin(
        self,
        job: SlurmJob,
        uid: str,
        pods: Sequence[scheduler_pb2.PodBinding],
        report: CycleReport,
    ) -> list[str] | None:
        """Pin the held job to gpufair's nodes: the nodes, or None (not held, or not pinned)."""
        if not job.held:
            return None
        nodes = [p.node for p in sorted(pods, key=lambda p: p.pod_index)]
        if len(set(nodes)) < len(nodes):
            # Slurm runs one task set per node of a job: two pods on one node cannot be pinned.
            # Mapped jobs ask for distinct nodes (`pods_on_distinct_nodes`), so this guards
            # only against a binding made otherwise. The job stays held; gpufair releases the
            # binding when no start confirms it.
            reason = f"gpufair bound several pods to one node ({','.join(nodes)})"
            report.errors.append(f"{uid}: {reason}")
            comments.explain(self.config, self.slurm, job, uid, reason, report)
            return None
        # `StartTime=now` only to clear a begin time the bridge read that would keep the job
        # waiting: a requeue's delay, or the mark of its owner's release. Any other pending job
        # it places has none ahead (it withdraws those), and a `StartTime=` would overwrite a
        # begin time set since the read, such as its owner's hold, even where the site's script
        # no longer remembers it (after a restart of slurmctld).
        start_now = job.eligible_time == job_states.OWNER_RELEASE_BEGIN_S or (
            job.restart_count > 0 and job_states.requeue_delay(job)
        )
        try:
            if job.restart_count > 0 and (
                self._too_soon_after_return(nodes)
                or (start_now and self._too_soon_after_requeue(job))
            ):
                return None  # still held and bound: a later cycle pins and releases it
            self.slurm.pin(job.job_id, nodes, start_now=start_now)
        except SlurmCommandError as exc:
            report.errors.append(f"{uid}: {exc}")
            return None
        return nodes

    def _too_soon_after_requeue(self, job: SlurmJob) -> bool:
        """Released now, the requeued job could start within the second its credential was
        revoked in, and Slurm would kill it (`RELAUNCH_AFTER_S`)."""
        return self.slurm_now() < job.submit_time + RELAUNCH_AFTER_S

    def _too_soon_after_return(self, nodes: Sequence[str]) -> bool:
        """One of the nodes came back less than `RELAUNCH_AFTER_S` ago by the bridge's clock. A
        node that registers again reports the steps of jobs requeued off it while it was lost;
        slurmctld aborts them, which revokes those jobs' launch credentials there as of that
        second (`Registered PENDING JobId=N StepId=N.batch on node X`, seen on 22.05), so a
        requeued job released onto it at once could be killed as in `RELAUNCH_AFTER_S`. The
        bridge read the node ready after it registered: 2 s after that read, the second is past."""
        since = max((self.nodes.ready_since.get(n, 0.0) for n in nodes), default=0.0)
        return self.clock() < since + RELAUNCH_AFTER_S

    def requeue(
        self,
        job: SlurmJob,
        uid: str,
        out: list[ledger_pb2.LedgerEvent],
        report: CycleReport,
    ) -> None:
        """Requeue a running job held; its run ends at the time stamped into its Comment first,
        so a restarted bridge reports the same end.

        The job is held first (`scontrol uhold` of the running job: priority 0, reason
        `JobHeldUser`, and it runs on), then requeued (`scontrol requeue`, which keeps the
        hold): pending, held, the same user hold as every other job the bridge holds, and no
        description. `scontrol requeuehold` (before round 31's close) left the description `job
        requeued in held state` in the reason's place until the job was released, through an
        operator's `scontrol hold` too, which then only `squeue --json` told from the bridge's
        hold: every cycle while the job waited read it. Now an operator's hold reads
        `JobHeldAdmin` in the text read too. Checked on 22.05: `uhold` of a running job
        succeeds and leaves it running; the requeue keeps priority 0 and `JobHeldUser`, while
        the job is COMPLETING and once pending, with the requeue's submit time (the second the
        job was pending again) and begin time 121 s after it (`cred_expire` + 1 s), which
        `job_states.requeue_delay` and `_too_soon_after_requeue` read as before. In this order
        a bridge killed between the two commands leaves the job running, held, and gpufair
        evicting it: the next cycle's row requeues it (stamp, `uhold`, `requeue` again; its run
        ends at the new stamp, as it ran until then). The other order would leave a requeued
        job not held, which Slurm starts by itself, on nodes of its choice, once its begin time
        has passed. A failed hold (the job ended meanwhile) is not followed by the requeue."""
        at_s = round(self.clock(), 3)  # the stamp's resolution: the resent event's time is equal
        try:
            self.slurm.set_comment(job.job_id, events.requeue_stamp(job.restart_count, at_s))
            self.slurm.hold(job.job_id)
            self.slurm.requeue(job.job_id)
        except SlurmCommandError as exc:
            report.errors.append(f"{uid}: {exc}")
            return
        report.requeued.append(uid)
        out.append(events.ended(uid, job.restart_count, at_s, ledger_pb2.EVENT_KIND_PREEMPTED))
