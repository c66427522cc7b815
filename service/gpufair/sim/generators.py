"""Workload generators: a stream of jobs per queue, drawn from a seeded random source.

Two kinds of arrival process:

- **Poisson** (`rate_per_h`): open loop; inter-arrival times are exponential with mean
  3600 / rate_per_h seconds, from `start_s` until `stop_s` (or `max_jobs`).
- **Backlog** (`backlog: N`): closed loop; N jobs are submitted at `start_s`, and each time one of
  them starts for the first time another is submitted at that instant, so the queue always has N
  of them waiting: a team that "always wants more". A job requeued after an eviction is not
  replaced again, so evictions never inflate the backlog.

Every job draws, in this order, its pods, GPUs per pod and duration from the generator's own
`random.Random`, seeded with "<scenario seed>:<generator name>" (string seeds hash with SHA-512, so
the stream is the same on every machine and run). A Poisson stream draws the next inter-arrival
time before the job's own values. Gangs (`gang: true`, the default) need all their pods at once
(min_pods = pods); `gang: false` makes an elastic job that may start with one pod. A drawn
duration is at least one second.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from gpufair.domain.model import TopologyConstraint, Workload
from gpufair.sim.distributions import Distribution
from gpufair.sim.jobspec import JobSpec

MIN_DURATION_S = 1.0


@dataclass(frozen=True, slots=True)
class GeneratorSpec:
    name: str
    queue: str
    pool: str
    rate_per_h: float | None  # Poisson arrivals, or None for a backlog
    backlog: int | None
    start_s: float
    stop_s: float  # no arrivals at or after this instant
    max_jobs: int | None
    pods: Distribution
    gpus_per_pod: Distribution
    duration: Distribution
    gang: bool = True
    preemptible: bool = True
    allowed_gpu_types: tuple[str, ...] = ()
    min_gpu_memory_gib: float = 0.0
    cpu_millicores_per_pod: int = 0
    memory_mib_per_pod: int = 0
    priority_class: int = 0
    min_runtime_s: float = 0.0
    topology: TopologyConstraint | None = None

    def workload(self, number: int, pods: int, gpus_per_pod: float, submit_s: float) -> Workload:
        """The stream's `number`-th job (from 1) as the scheduler sees it."""
        return Workload(
            uid=f"{self.name}-{number:06d}",
            queue=self.queue,
            pool=self.pool,
            pods=pods,
            gpus_per_pod=gpus_per_pod,
            submit_time_s=submit_s,
            min_pods=None if self.gang else 1,
            allowed_gpu_types=self.allowed_gpu_types,
            min_gpu_memory_gib=self.min_gpu_memory_gib,
            cpu_millicores_per_pod=self.cpu_millicores_per_pod,
            memory_mib_per_pod=self.memory_mib_per_pod,
            topology=self.topology,
            priority_class=self.priority_class,
            preemptible=self.preemptible,
            min_runtime_s=self.min_runtime_s,
        )


class GeneratorStream:
    """The running state of one generator during one simulation."""

    def __init__(self, spec: GeneratorSpec, seed: int) -> None:
        self.spec = spec
        self.rng = random.Random(f"{seed}:{spec.name}")
        self.made = 0
        # Poisson: the instant of the next arrival (inf once the stream is over).
        self.next_arrival_s = math.inf
        if spec.rate_per_h is not None:
            self.next_arrival_s = self._after(spec.start_s)

    @property
    def is_backlog(self) -> bool:
        return self.spec.backlog is not None

    def _exhausted(self, at_s: float) -> bool:
        spec = self.spec
        return at_s >= spec.stop_s or (spec.max_jobs is not None and self.made >= spec.max_jobs)

    def _after(self, at_s: float) -> float:
        assert self.spec.rate_per_h is not None
        arrival_s = at_s + self.rng.expovariate(self.spec.rate_per_h / 3600.0)
        return arrival_s if arrival_s < self.spec.stop_s else math.inf

    def poisson_arrival(self) -> JobSpec | None:
        """The job arriving at `next_arrival_s`; moves the stream to the following arrival."""
        at_s = self.next_arrival_s
        if self._exhausted(at_s):
            self.next_arrival_s = math.inf
            return None
        self.next_arrival_s = self._after(at_s)
        return self._make(at_s)

    def backlog_start(self) -> list[JobSpec]:
        """The backlog submitted at `start_s`."""
        assert self.spec.backlog is not None
        jobs = []
        for _ in range(self.spec.backlog):
            job = self.replacement(self.spec.start_s)
            if job is None:
                break
            jobs.append(job)
        return jobs

    def replacement(self, at_s: float) -> JobSpec | None:
        """A backlog job submitted at `at_s`, when one of the stream's jobs first starts."""
        if self._exhausted(at_s):
            return None
        return self._make(at_s)

    def _make(self, submit_s: float) -> JobSpec:
        spec = self.spec
        pods = int(spec.pods.sample(self.rng))
        gpus_per_pod = spec.gpus_per_pod.sample(self.rng)
        duration_s = max(MIN_DURATION_S, spec.duration.sample(self.rng))
        self.made += 1
        workload = spec.workload(self.made, pods, gpus_per_pod, submit_s)
        return JobSpec(workload, duration_s, generator=spec.name)
