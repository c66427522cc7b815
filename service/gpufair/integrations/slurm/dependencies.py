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

A part Slurm marked `(failed)` is never met. A job Slurm does not list (never existed, or
purged after MinJobAge) meets its part: Slurm accepts such a dependency and lifts it, whatever
the job's end was. `a,b` needs every part, `a?b` any (any `?` makes the whole list any-of, as
Slurm prints it). Other types (`singleton`, `aftercorr`, array tasks `N_*`, ...) are not
judged: the job stays held with that reason (unless Slurm's pass clears the dependency).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from gpufair.integrations.slurm.records import SlurmJob

_PART_RE = re.compile(r"^(\w+)(?::(\d+)(?:\+(\d+))?)?(?:\((\w+)\))?$")
_MARK_RE = re.compile(r"\((?:unfulfilled|fulfilled|failed)\)$")  # Slurm's mark on a part
_JUDGED = ("after", "afterany", "afterok", "afternotok")


@dataclass(frozen=True)
class Blocked:
    """Why the dependency keeps the job from starting; `never`: it cannot be met any more."""

    reason: str
    never: bool = False


def _part(text: str, jobs: Mapping[int, SlurmJob], now_s: float) -> Blocked | None:
    match = _PART_RE.match(text)
    if match is None or match.group(1) not in _JUDGED or match.group(2) is None:
        shown = _MARK_RE.sub("", text)
        return Blocked(f"dependency {shown} is not supported by the gpufair bridge")
    kind, job_id, minutes, status = (
        match.group(1),
        int(match.group(2)),
        match.group(3),
        match.group(4),
    )
    name = f"{kind}:{job_id}" + (f"+{minutes}" if minutes else "")
    if status == "fulfilled":
        return None
    if status == "failed":
        return Blocked(f"dependency {name} can never be met", never=True)
    other = jobs.get(job_id)
    if other is None:
        return None  # not known (or purged): Slurm lifts the dependency
    ended, state = other.finished, other.state
    if kind == "after":
        if state == "PENDING":
            return Blocked(f"waits for dependency {name} (job {job_id} {state})")
        if minutes and other.start_time and now_s < other.start_time + 60 * int(minutes):
            return Blocked(
                f"waits for dependency {name} (job {job_id} started at {other.start_time})"
            )
        return None
    if not ended:
        return Blocked(f"waits for dependency {name} (job {job_id} {state})")
    if kind == "afterok" and state != "COMPLETED":
        return Blocked(f"dependency {name} can never be met (job {job_id} {state})", never=True)
    if kind == "afternotok" and state == "COMPLETED":
        return Blocked(f"dependency {name} can never be met (job {job_id} {state})", never=True)
    return None


def unmet(job: SlurmJob, jobs: Mapping[int, SlurmJob], now_s: float) -> Blocked | None:
    """None when the job's dependency (if any) lets it start now; else why not."""
    if not job.dependency:
        return None
    any_of = "?" in job.dependency
    blocks = [_part(p.strip(), jobs, now_s) for p in re.split(r"[?,]", job.dependency) if p.strip()]
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
