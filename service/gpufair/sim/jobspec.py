"""A simulated job: the workload the scheduler sees, and how long it runs once started."""

from __future__ import annotations

from dataclasses import dataclass

from gpufair.domain.model import Workload


@dataclass(frozen=True, slots=True)
class JobSpec:
    """`workload` as submitted (its `submit_time_s` is the arrival), running `duration_s` of
    work once started. The scheduler never sees the duration: like a real batch system, it learns
    that a job ended when the job stops."""

    workload: Workload
    duration_s: float
    generator: str | None = None  # the generator that made it, if any
