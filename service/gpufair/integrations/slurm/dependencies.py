"""Whether a job's `--dependency` lets it start now, judged by the bridge (pure; no I/O).

Slurm judges the dependencies of a held job only in a later pass (5-20 s after the other job
started or ended, seen on 22.05), not at once: it then clears one that is met (`Dependency`
empty) and marks one that can never be met `(failed)`. Every job the bridge manages is held
until gpufair places it, so the bridge judges them itself, at once, from the states `squeue`
shows, by Slurm's rules (the sbatch man page's `--dependency`):

| type | met when the job it names |
|---|---|
| `after:N[+m]` | has started (or ended, or was cancelled before it started), m minutes ago |
| `afterany:N` | has ended (a `+m` is ignored, as Slurm does) |
| `afterok:N` | has completed (`COMPLETED`); any other end: never met |
| `afternotok:N` | has ended other than `COMPLETED`; `COMPLETED`: never met |

The m minutes are counted on Slurm's clock: from the start time Slurm reports to Slurm's time
now (`now`, read from the controller only when a part waits on its minutes).

A job array's master id names every task of the array: Slurm rewrites `afterok:N` to
`afterok:N_*` at submission (and in `scontrol update Dependency=`), and judges it over all
tasks (seen on 22.05): `after` once every task started (none pending), `afterany` once every
task ended, `afterok` once every task ended `COMPLETED` (never once every task ended and one did
not), `afternotok` once every task ended and one did not (never when all completed); a task
that failed early does not decide either before the others end. `N_k` names task k alone, as a
job of its own. A task's record is the one squeue lists with its `array_task_id`; a task still
pending is in the array's pending record (`array_task_string`), whose state it shares.

A part Slurm marked `(failed)` is never met (named with the end of the job that decided it, as
the bridge's own verdict said before Slurm's mark, when the job shows one). A job (or array)
Slurm does not list (never existed, or purged after MinJobAge) meets its part: Slurm accepts
such a dependency and lifts it, whatever the job's end was. `a,b` needs every part, `a?b` any
(any `?` makes the whole list any-of, as Slurm prints it). Other types (`singleton`,
`aftercorr`, ...) are not judged: the job stays held with that reason (unless Slurm's pass
clears the dependency).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from gpufair.integrations.slurm.records import SlurmJob

_PART_RE = re.compile(r"^(\w+)(?::(\d+)(?:_(\d+|\*))?(?:\+(\d+))?)?(?:\((\w+)\))?$")
_MARK_RE = re.compile(r"\((?:unfulfilled|fulfilled|failed)\)$")  # Slurm's mark on a part
_JUDGED = ("after", "afterany", "afterok", "afternotok")
_TASKS_RE = re.compile(r"^(\d+)(?:-(\d+)(?::(\d+))?)?$")


@dataclass(frozen=True)
class Blocked:
    """Why the dependency keeps the job from starting; `never`: it cannot be met any more."""

    reason: str
    never: bool = False


@dataclass(frozen=True)
class Jobs:
    """Every job Slurm lists, by job id, and the records of each array by its master id (built
    once per cycle: a dependency on an array looks at all of them)."""

    by_id: Mapping[int, SlurmJob]
    arrays: Mapping[int, Sequence[SlurmJob]] = field(default_factory=dict)

    @classmethod
    def of(cls, jobs: Iterable[SlurmJob]) -> Jobs:
        by_id: dict[int, SlurmJob] = {}
        arrays: dict[int, list[SlurmJob]] = {}
        for job in jobs:
            by_id[job.job_id] = job
            if job.array_job_id:
                arrays.setdefault(job.array_job_id, []).append(job)
        return cls(by_id, arrays)


def pending_tasks(text: str) -> set[int] | None:
    """The task ids of an array's pending record: '1-3,7' -> {1, 2, 3, 7}; '0-9:2%4' (a step, a
    limit of tasks at once) -> {0, 2, 4, 6, 8}; None when Slurm printed something else."""
    found: set[int] = set()
    for part in text.split("%", maxsplit=1)[0].strip("[]").split(","):
        match = _TASKS_RE.match(part.strip())
        if match is None:
            return None
        low = int(match.group(1))
        high = int(match.group(2) or low)
        found.update(range(low, high + 1, int(match.group(3) or 1)))
    return found


def _task(records: Sequence[SlurmJob], task: int) -> SlurmJob | None:
    """Task `task`'s record, or the array's pending record while the task is in it."""
    for record in records:
        if record.array_task_id == task:
            return record
    for record in records:
        if record.array_task_id is None:
            tasks = pending_tasks(record.array_tasks)
            if tasks is None or task in tasks:
                return record
    return None


def _part(text: str, jobs: Jobs, now: Callable[[], float]) -> Blocked | None:
    match = _PART_RE.match(text)
    if match is None or match.group(1) not in _JUDGED or match.group(2) is None:
        shown = _MARK_RE.sub("", text)
        return Blocked(f"dependency {shown} is not supported by the gpufair bridge")
    kind, job_id, task, minutes, status = match.groups()
    target = job_id + (f"_{task}" if task else "")
    name = f"{kind}:{target}" + (f"+{minutes}" if minutes else "")
    if status == "fulfilled":
        return None
    if status == "failed":
        # The job's end that decided it, as before Slurm's mark, when the job shows one; else
        # Slurm's word alone (the job purged, or showing an end that would have met the part).
        decided = None if kind == "after" else _judge(kind, job_id, task, minutes, name, jobs, now)
        if decided is not None and decided.never:
            return decided
        return Blocked(f"dependency {name} can never be met", never=True)
    return _judge(kind, job_id, task, minutes, name, jobs, now)


def _judge(
    kind: str,
    job_id: str,
    task: str | None,
    minutes: str | None,
    name: str,
    jobs: Jobs,
    now: Callable[[], float],
) -> Blocked | None:
    """The bridge's own verdict on one part, from the states of the jobs it names."""
    target = job_id + (f"_{task}" if task else "")
    records: Sequence[SlurmJob]
    if task is None:
        one = jobs.by_id.get(int(job_id))
        records, what = ([one] if one else []), f"job {job_id}"
    elif task == "*":
        records, what = jobs.arrays.get(int(job_id), []), f"array {job_id}"
    else:
        one = _task(jobs.arrays.get(int(job_id), []), int(task))
        records, what = ([one] if one else []), f"job {target}"
    if not records:
        return None  # not known (or purged): Slurm lifts the dependency
    states = ", ".join(sorted({r.state for r in records}))
    if task == "*":
        states = f"tasks {states}"
    if kind == "after":
        if any(r.state == "PENDING" for r in records):
            return Blocked(f"waits for dependency {name} ({what} {states})")
        started = max(r.start_time for r in records)
        if minutes and started and now() < started + 60 * int(minutes):
            return Blocked(f"waits for dependency {name} ({what} started at {started})")
        return None
    if not all(r.finished for r in records):
        return Blocked(f"waits for dependency {name} ({what} {states})")
    completed = [r.state == "COMPLETED" for r in records]
    if kind == "afterok" and not all(completed):
        return Blocked(f"dependency {name} can never be met ({what} {states})", never=True)
    if kind == "afternotok" and all(completed):
        return Blocked(f"dependency {name} can never be met ({what} {states})", never=True)
    return None


def unmet(job: SlurmJob, jobs: Jobs, now: Callable[[], float]) -> Blocked | None:
    """None when the job's dependency (if any) lets it start now; else why not. `now`: Slurm's
    time, asked only when a part waits on its minutes."""
    if not job.dependency:
        return None
    any_of = "?" in job.dependency
    parts = [p.strip() for p in re.split(r"[?,]", job.dependency) if p.strip()]
    blocks = [_part(p, jobs, now) for p in parts]
    found = [b for b in blocks if b is not None]
    if not found or (any_of and len(found) < len(blocks)):
        return None
    if any_of:
        return Blocked("; ".join(b.reason for b in found), never=all(b.never for b in found))
    return (
        found[0]
        if len(found) == 1
        else Blocked("; ".join(b.reason for b in found), never=any(b.never for b in found))
    )
