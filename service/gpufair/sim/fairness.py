"""Wait fairness the way teams judge it: per queue, how long its jobs waited and how long they
took from submission to the end.

Two queues with equal weights should not only get equal CU-hours (`metrics`); their jobs should
wait alike. Per leaf queue, over every job submitted in it:

- **Wait P50 / P99** (as `metrics`: the total time a job spent waiting, a job still waiting at
  the end counting its wait so far).
- **P99/P50**: how much worse a queue's unlucky jobs fare than its typical ones. A wait shorter
  than one scheduling cycle cannot be told from no wait, so the P50 in the ratio is floored at
  one cycle: a queue whose jobs mostly start at once and rarely wait an hour reads
  3600 / cycle_s, not infinity.
- **Completion P50**: the median of (end - submission) over the jobs that completed, so a queue
  whose jobs start promptly but are evicted and restarted shows it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gpufair.render import table
from gpufair.sim.engine import SimResult
from gpufair.sim.metrics import HOUR_S, percentile


@dataclass(frozen=True, slots=True)
class WaitFairness:
    pool: str
    queue: str
    jobs: int
    completed: int
    wait_p50_s: float | None
    wait_p99_s: float | None
    p99_over_p50: float | None  # P50 floored at one cycle; None without jobs
    completion_p50_s: float | None  # None when no job completed


def wait_fairness(result: SimResult) -> tuple[WaitFairness, ...]:
    """One row per leaf queue that had jobs, by pool then queue name."""
    waits: dict[tuple[str, str], list[float]] = {}
    completions: dict[tuple[str, str], list[float]] = {}
    for job in result.jobs:
        key = (job.workload.pool, job.workload.queue)
        waits.setdefault(key, []).append(job.wait_s)
        if job.end_s is not None:
            completions.setdefault(key, []).append(job.end_s - job.workload.submit_time_s)
    floor_s = result.scenario.cycle_s
    rows = []
    for key in sorted(waits):
        p50 = percentile(waits[key], 50)
        p99 = percentile(waits[key], 99)
        ratio = None if p50 is None or p99 is None else p99 / max(p50, floor_s)
        done = completions.get(key, [])
        rows.append(
            WaitFairness(
                pool=key[0],
                queue=key[1],
                jobs=len(waits[key]),
                completed=len(done),
                wait_p50_s=p50,
                wait_p99_s=p99,
                p99_over_p50=ratio,
                completion_p50_s=percentile(done, 50),
            )
        )
    return tuple(rows)


def fairness_dicts(rows: Sequence[WaitFairness]) -> list[dict[str, Any]]:
    """The rows as summary.json holds them (`wait_fairness`)."""
    return [
        {
            "pool": row.pool,
            "queue": row.queue,
            "jobs": row.jobs,
            "completed": row.completed,
            "wait_p50_s": row.wait_p50_s,
            "wait_p99_s": row.wait_p99_s,
            "wait_p99_over_p50": row.p99_over_p50,
            "completion_p50_s": row.completion_p50_s,
        }
        for row in rows
    ]


def fairness_table(runs: Sequence[tuple[str, Sequence[WaitFairness]]]) -> str:
    """The wait-fairness table; with several runs a POLICY column sets them side by side."""
    several = len(runs) > 1
    body: list[list[float | int | str]] = []
    keys = [(row.pool, row.queue) for row in runs[0][1]]
    for key in keys:
        for label, rows in runs:
            for row in rows:
                if (row.pool, row.queue) != key:
                    continue
                lead: list[float | int | str] = [label] * several
                body.append(
                    [
                        *lead,
                        row.pool,
                        row.queue,
                        row.jobs,
                        _hours(row.wait_p50_s),
                        _hours(row.wait_p99_s),
                        "-" if row.p99_over_p50 is None else round(row.p99_over_p50, 1),
                        _hours(row.completion_p50_s),
                    ]
                )
    header = ["POLICY"] * several + [
        "POOL",
        "QUEUE",
        "JOBS",
        "WAIT P50 H",
        "WAIT P99 H",
        "P99/P50",
        "COMPLETION P50 H",
    ]
    return table(header, body)


def _hours(value_s: float | None) -> float | str:
    return "-" if value_s is None else round(value_s / HOUR_S, 2)
