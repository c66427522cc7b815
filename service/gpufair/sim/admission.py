"""The service's submit checks on every job a simulation makes, at its arrival.

The server refuses work when it is submitted (`SubmitWorkloads`): a workload breaking the field
rules of `domain.workload_rules.workload_violations` fails the call, and a well-formed one that
the cluster cannot take (`resolve_submitted`: an unknown pool or queue, a queue with children, a
partition profile no type offers, a job that would not fit the pool even empty) comes back not
accepted, with the reason. The simulator submits each job on its own, so either refuses that job
alone: it never waits, takes no part in demand or waits, and is listed as refused (`jobs.csv`
state `refused` with the reason; counts per queue and per reason in the summary).

Workloads and generators written in the scenario are checked when it loads (`scenario`), so in
practice the jobs refused here are trace rows (`trace`). The service's "a valid instant" rule on
the submit time is left out: the simulated clock starts at 0.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from gpufair.domain.model import ClusterConfig, Workload
from gpufair.domain.workload_rules import resolve_submitted, workload_violations
from gpufair.sim.jobspec import JobSpec

_PATH = "workload"


@dataclass(frozen=True, slots=True)
class RefusedJob:
    spec: JobSpec
    reason: str  # the server's: "<field>: <message>", or why the cluster cannot take it


def field_problems(workload: Workload) -> list[tuple[str, str]]:
    """(field, message) of every field rule `workload` breaks, the submit time's left out."""
    found = []
    for violation in workload_violations(workload, _PATH):
        field = violation.field_path.removeprefix(f"{_PATH}.")
        if field != "submit_time":
            found.append((field, violation.message))
    return found


class Admission:
    """The checks of one cluster; what the cluster side says is kept per workload shape (all
    but uid and submit time), as jobs of a trace or generator repeat a few shapes."""

    def __init__(self, cluster: ClusterConfig) -> None:
        self.cluster = cluster
        self._by_shape: dict[Workload, str | None] = {}

    def refusal(self, workload: Workload) -> str | None:
        """Why the server would refuse `workload`, or None when it would accept it."""
        problems = field_problems(workload)
        if problems:
            return "; ".join(f"{field}: {message}" for field, message in problems)
        return self.cluster_refusal(workload)

    def cluster_refusal(self, workload: Workload) -> str | None:
        """Why this cluster cannot take the well-formed `workload` (`resolve_submitted`)."""
        shape = dataclasses.replace(workload, uid="-", submit_time_s=0.0)
        if shape not in self._by_shape:
            _, problems = resolve_submitted(self.cluster, [shape])
            self._by_shape[shape] = problems.get(shape.uid)
        return self._by_shape[shape]


def reason_counts(refused: Iterable[RefusedJob]) -> list[tuple[str, int]]:
    """Each reason with its number of jobs, most first (then by reason)."""
    counts = Counter(job.reason for job in refused)
    return sorted(counts.items(), key=lambda item: (-item[1], item[0]))


def refused_line(refused: Iterable[RefusedJob], label: str = "", shown: int = 3) -> str:
    """One line for the printed summary ("" when nothing was refused)."""
    counts = reason_counts(refused)
    total = sum(n for _, n in counts)
    if not total:
        return ""
    parts = [f"{reason} ({n})" for reason, n in counts[:shown]]
    if len(counts) > shown:
        parts.append(f"{len(counts) - shown} more reasons")
    lead = f"{label}: " if label else ""
    noun = "job" if total == 1 else "jobs"
    return f"{lead}{total} {noun} refused at submit, as the service would: {'; '.join(parts)}"
