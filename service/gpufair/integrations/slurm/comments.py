"""The job's Comment as the bridge writes and reads it: why gpufair does not schedule a job
(`gpufair: not scheduled: ...`), and the uid of the workload it last withdrew for the job
(`(withdrew slurm-42)`), from which the next revision is numbered, across restarts too."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from gpufair.integrations.slurm.config import BridgeConfig
from gpufair.integrations.slurm.mapping import parse_uid
from gpufair.integrations.slurm.records import SlurmJob
from gpufair.integrations.slurm.slurmctl import SlurmCtl

if TYPE_CHECKING:
    from gpufair.integrations.slurm.bridge import CycleReport

NOT_SCHEDULED = "gpufair: not scheduled"
UNSCHEDULED = NOT_SCHEDULED + ": "
WITHDREW_RE = re.compile(r"^gpufair: (?:not scheduled|submitted as \S+) \(withdrew (\S+)\)")


def explain(
    config: BridgeConfig,
    slurm: SlurmCtl,
    job: SlurmJob,
    uid: str,
    reason: str,
    report: CycleReport,
    *,
    withdrew: str = "",
) -> None:
    """Leave the job held, with why in its Comment (written once, not every cycle). The uid
    of the last workload withdrawn for the job stays at the Comment's start."""
    report.unmappable[uid] = reason
    withdrew = withdrew or (withdrawn(config, job) or "")
    head = f"gpufair: not scheduled (withdrew {withdrew}): " if withdrew else UNSCHEDULED
    # No trailing space: the text read of the Comment loses it (records.py), and the
    # Comment would then be written again every cycle.
    text = (head + reason).replace("\n", " ")[:250].rstrip()
    if job.comment != text:
        slurm.set_comment(job.job_id, text)


def withdrawn(config: BridgeConfig, job: SlurmJob) -> str | None:
    """The uid of the workload the bridge last withdrew for this job, from its Comment."""
    match = WITHDREW_RE.match(job.comment)
    if match is None:
        return None
    parsed = parse_uid(config, match.group(1))
    return match.group(1) if parsed is not None and parsed[0] == job.job_id else None


def note_submitted(config: BridgeConfig, slurm: SlurmCtl, job: SlurmJob, uid: str) -> None:
    """gpufair has the job (as `uid`) now: a Comment of the bridge saying it is not
    scheduled goes, or, when it names a withdrawn uid (the next revision is numbered from
    it), says `gpufair: submitted as slurm-42.1 (withdrew slurm-42)`."""
    if not job.comment.startswith(NOT_SCHEDULED) and WITHDREW_RE.match(job.comment) is None:
        return
    withdrew = withdrawn(config, job)
    text = f"gpufair: submitted as {uid} (withdrew {withdrew})" if withdrew else ""
    if job.comment != text:
        slurm.set_comment(job.job_id, text)


def withdrawn_revision(config: BridgeConfig, job: SlurmJob) -> int:
    withdrawn_uid = withdrawn(config, job)
    parsed = None if withdrawn_uid is None else parse_uid(config, withdrawn_uid)
    return -1 if parsed is None else parsed[1]
