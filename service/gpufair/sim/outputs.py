"""The files a run leaves in its output folder, written so that the same scenario and seed give
byte-identical files: fixed float formats, rows in a fixed order, no wall clock, `\\n` endings.

- `timeline.csv`: one row per timeline sample, pool (by name) and queue (tree order): time_s,
  pool, queue, allocated_cu, pending_cu, fair_share_cu, effective_weight, usage_share (U'),
  decayed_usage_cu_s (the U' numerator), weight_share (W'). Fair-share columns are those of the
  latest recompute.
- `jobs.csv`: one row per job submitted in the run, by submit time then uid: uid, pool, queue,
  pods, gpus_per_pod, preemptible, submit_s, first_start_s, end_s, wait_s (total time waiting;
  counted to the end for a job still waiting), evictions, gpu_type, gpus, cu (of its last run),
  state (done, running or waiting at the end, or refused), refusal (why the service's submit
  checks refused it, `admission`; a refused job has no start, end or wait). Jobs of the scenario
  that arrive at or after the end (duration_s) are not part of the run and have no row; the
  scenario's notes (summary.txt, summary.json) say how many.
- `events.csv`: every bind and eviction in the order the cycles made them: time_s, pool, event
  (bind or evict), uid, queue, gpus, cu, reason (a bind: within_share, beyond_share,
  claim:<eviction reason> on capacity evicted for it, or move where a defragmentation move sent
  it; an eviction: the phase that decided it, reclaim, preempt, defragment or entitlement),
  beneficiary and beneficiary_queue (whom an eviction was for), and for an eviction the chain
  back to what placed the victim (`engine.DecisionRow`): started_as (the reason of the bind that
  started the run it leaves), ran_s (how long that run lasted), evicted_before (its earlier
  evictions in the run); empty for a bind.
- `summary.json`: the scenario's name, seed, span and policies, what loading noted, the
  metrics of `metrics` per pool and queue (floats rounded to 6 decimals), and `refused`: how
  many jobs the submit checks refused and how many for each reason.
- `summary.txt`: the summary table printed at the end of a run (in each run's own folder of a
  comparison too).
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from gpufair.domain.model import Workload
from gpufair.render import table
from gpufair.sim.admission import reason_counts
from gpufair.sim.engine import SimResult
from gpufair.sim.fairness import fairness_dicts, wait_fairness
from gpufair.sim.metrics import HOUR_S, PoolMetrics, QueueMetrics, RunMetrics
from gpufair.sim.moves import moves_summary

TIMELINE_COLUMNS = (
    "time_s",
    "pool",
    "queue",
    "allocated_cu",
    "pending_cu",
    "fair_share_cu",
    "effective_weight",
    "usage_share",
    "decayed_usage_cu_s",
    "weight_share",
)
JOB_COLUMNS = (
    "uid",
    "pool",
    "queue",
    "pods",
    "gpus_per_pod",
    "preemptible",
    "submit_s",
    "first_start_s",
    "end_s",
    "wait_s",
    "evictions",
    "gpu_type",
    "gpus",
    "cu",
    "state",
    "refusal",
)

EVENT_COLUMNS = (
    "time_s",
    "pool",
    "event",
    "uid",
    "queue",
    "gpus",
    "cu",
    "reason",
    "beneficiary",
    "beneficiary_queue",
    "started_as",
    "ran_s",
    "evicted_before",
)


def fmt(value: float | None, digits: int = 4) -> str:
    """A fixed-point number; "" for None; never "-0.0000"."""
    if value is None:
        return ""
    text = f"{value:.{digits}f}"
    return text[1:] if text.startswith("-") and float(text) == 0.0 else text


def _write_csv(path: Path, header: Sequence[str], rows: Iterable[Sequence[str]]) -> None:
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle, lineterminator="\n")
        writer.writerow(header)
        writer.writerows(rows)


def write_timeline(result: SimResult, path: Path) -> None:
    _write_csv(
        path,
        TIMELINE_COLUMNS,
        (
            (
                fmt(row.time_s, 3),
                row.pool,
                row.queue,
                fmt(row.allocated_cu),
                fmt(row.pending_cu),
                fmt(row.fair_share_cu),
                fmt(row.effective_weight, 6),
                fmt(row.usage_share, 6),
                fmt(row.usage_cu_s, 1),
                fmt(row.weight_share, 6),
            )
            for row in result.timeline
        ),
    )


def _submitted(workload: Workload) -> tuple[str, ...]:
    """The first columns of a job's row: what was submitted."""
    return (
        workload.uid,
        workload.pool,
        workload.queue,
        str(workload.pods),
        fmt(workload.gpus_per_pod, 3),
        "true" if workload.preemptible else "false",
        fmt(workload.submit_time_s, 3),
    )


def write_jobs(result: SimResult, path: Path) -> None:
    rows = []
    for job in result.jobs:
        workload = job.workload
        if job.end_s is not None:
            state = "done"
        elif job.pending_since_s is None:
            state = "running"
        else:
            state = "waiting"
        started = job.first_start_s is not None
        rows.append(
            (
                *_submitted(workload),
                fmt(job.first_start_s, 3),
                fmt(job.end_s, 3),
                fmt(job.wait_s, 3),
                str(job.evictions),
                job.gpu_type,
                fmt(job.gpus, 3) if started else "",
                fmt(job.cu, 3) if started else "",
                state,
                "",
            )
        )
    for refused in result.refused:
        workload = refused.spec.workload
        rows.append(
            (
                *_submitted(workload),
                *("",) * 7,
                "refused",
                refused.reason,
            )
        )
    if result.refused:  # in among the others, by the exact submit time, then uid
        times = {j.workload.uid: j.workload.submit_time_s for j in result.jobs}
        times.update((r.spec.workload.uid, r.spec.workload.submit_time_s) for r in result.refused)
        rows.sort(key=lambda row: (times[row[0]], row[0]))
    _write_csv(path, JOB_COLUMNS, rows)


def write_events(result: SimResult, path: Path) -> None:
    _write_csv(
        path,
        EVENT_COLUMNS,
        (
            (
                fmt(row.time_s, 3),
                row.pool,
                row.event,
                row.uid,
                row.queue,
                fmt(row.gpus, 3),
                fmt(row.cu, 3),
                row.reason,
                row.beneficiary,
                row.beneficiary_queue,
                *(
                    (row.started_as, fmt(row.ran_s, 3), str(row.evicted_before))
                    if row.event == "evict"
                    else ("", "", "")
                ),
            )
            for row in result.decisions
        ),
    )


def _rounded(value: Any) -> Any:
    if isinstance(value, float):
        rounded = round(value, 6)
        return 0.0 if rounded == 0.0 else rounded
    if isinstance(value, dict):
        return {str(k): _rounded(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_rounded(v) for v in value]
    return value


def run_summary(result: SimResult, metrics: RunMetrics) -> dict[str, Any]:
    scenario = result.scenario
    return {
        "scenario": scenario.name,
        "seed": scenario.seed,
        "duration_s": scenario.duration_s,
        "cycle_s": scenario.cycle_s,
        "on_evict": scenario.on_evict.value,
        "policies": {
            pool.name: {
                "k": pool.policy.k,
                "window_kind": pool.policy.window_kind.value,
                "window_s": pool.policy.window_s,
                "half_life_s": pool.policy.half_life_s,
                "usage_basis": pool.policy.usage_basis.value,
                "division": pool.policy.division.value,
                "recompute_s": scenario.recompute_interval_s(pool),
            }
            for pool in sorted(scenario.cluster.pools, key=lambda p: p.name)
        },
        "notes": list(scenario.notes),
        "pools": [_pool_dict(p) for p in metrics.pools],
        "queues": [_queue_dict(q) for q in metrics.queues],
        "wait_fairness": fairness_dicts(wait_fairness(result)),
        "moves": moves_summary(result),
        "refused": {"jobs": len(result.refused), "reasons": dict(reason_counts(result.refused))},
    }


def _pool_dict(pool: PoolMetrics) -> dict[str, Any]:
    return {
        "pool": pool.pool,
        "k": pool.k,
        "capacity_cu": pool.capacity_cu,
        "capacity_gpus": pool.capacity_gpus,
        "utilisation": pool.utilisation,
        "allocated_gpu_hours": pool.allocated_gpu_hours,
        "idle_gpu_hours_while_pending": pool.idle_gpu_hours_while_pending,
        "evictions": pool.evictions,
        "evictions_per_100_gpu_hours": pool.evictions_per_100_gpu_hours,
        "lost_gpu_hours": pool.lost_gpu_hours,
        "fragmented_gpus_mean": pool.fragmented_gpus_mean,
        "fragmented_gpus_max": pool.fragmented_gpus_max,
        "jain_index": dict(sorted(pool.jain_index.items())),
        "cycles_run": pool.cycles_run,
        "recomputes": pool.recomputes,
    }


def _queue_dict(queue: QueueMetrics) -> dict[str, Any]:
    return {
        "pool": queue.pool,
        "queue": queue.queue,
        "parent": queue.parent,
        "deserved_cu": queue.deserved_cu,
        "over_quota_weight": queue.over_quota_weight,
        "competed": queue.competed,
        "allocated_cu_hours": queue.allocated_cu_hours,
        "over_quota_cu_hours": queue.over_quota_cu_hours,
        "weight_share": queue.weight_share,
        "over_quota_share": queue.over_quota_share,
        "share_error_pp": queue.share_error_pp,
        "jobs_submitted": queue.jobs_submitted,
        "jobs_started": queue.jobs_started,
        "jobs_completed": queue.jobs_completed,
        "jobs_waiting_at_end": queue.jobs_waiting_at_end,
        "wait_p50_s": queue.wait_p50_s,
        "wait_p99_s": queue.wait_p99_s,
        "wait_max_s": queue.wait_max_s,
        "evictions": queue.evictions,
        "lost_gpu_hours": queue.lost_gpu_hours,
        "jobs_refused": queue.jobs_refused,
    }


def write_json(data: dict[str, Any], path: Path) -> None:
    path.write_text(json.dumps(_rounded(data), indent=2) + "\n")


def write_run(result: SimResult, metrics: RunMetrics, out_dir: Path) -> None:
    """timeline.csv, jobs.csv, events.csv and summary.json of one run into `out_dir` (created
    if needed)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    write_timeline(result, out_dir / "timeline.csv")
    write_jobs(result, out_dir / "jobs.csv")
    write_events(result, out_dir / "events.csv")
    write_json(run_summary(result, metrics), out_dir / "summary.json")


# ---- the summary table ------------------------------------------------------------------------


# Numbers go to the table as numbers (right-aligned by `render.table`), missing ones as "-".
Cell = float | int | str


def _pct(value: float | None) -> Cell:
    return "-" if value is None else round(100.0 * value, 1)


def _hours(value_s: float | None) -> Cell:
    return "-" if value_s is None else round(value_s / HOUR_S, 2)


def _round(value: float | None, digits: int) -> Cell:
    return "-" if value is None else round(value, digits)


def summary_table(runs: Sequence[tuple[str, RunMetrics]]) -> str:
    """One table of queues and one of pools; with several runs, a POLICY column sets them side by
    side (rows of one queue together). ERROR PP is the over-quota share minus the weight share,
    in percentage points; waits are in hours; JAIN is the top-level group's index."""
    several = len(runs) > 1
    lead = ["POLICY"] if several else []
    queue_rows: list[list[Cell]] = []
    keys = [(q.pool, q.queue) for q in runs[0][1].queues]
    for pool_name, queue_name in keys:
        for label, metrics in runs:
            for q in metrics.queues:
                if (q.pool, q.queue) != (pool_name, queue_name):
                    continue
                row: list[Cell] = [label] * several
                row += [
                    q.pool,
                    q.queue if q.parent is None else f"{q.parent}/{q.queue}",
                    round(q.deserved_cu, 3),
                    _pct(q.weight_share),
                    _pct(q.over_quota_share),
                    _round(q.share_error_pp, 1),
                    round(q.over_quota_cu_hours),
                    _hours(q.wait_p50_s),
                    _hours(q.wait_p99_s),
                    _hours(q.wait_max_s),
                    f"{q.jobs_started}/{q.jobs_submitted}",
                    q.evictions,
                ]
                queue_rows.append(row)
    queues = table(
        [
            *lead,
            "POOL",
            "QUEUE",
            "DESERVED CU",
            "WEIGHT %",
            "OVER-QUOTA %",
            "ERROR PP",
            "OVER-QUOTA CU-H",
            "WAIT P50 H",
            "WAIT P99 H",
            "WAIT MAX H",
            "STARTED",
            "EVICTIONS",
        ],
        queue_rows,
    )
    pool_rows: list[list[Cell]] = []
    for pool_name in [p.pool for p in runs[0][1].pools]:
        for label, metrics in runs:
            for p in metrics.pools:
                if p.pool != pool_name:
                    continue
                pool_row: list[Cell] = [label] * several
                pool_row += [
                    p.pool,
                    p.k,
                    _pct(p.utilisation),
                    round(p.idle_gpu_hours_while_pending, 1),
                    round(p.evictions_per_100_gpu_hours, 2),
                    round(p.lost_gpu_hours, 1),
                    round(p.fragmented_gpus_mean, 1),
                    _round(p.jain_index.get(""), 3),
                ]
                pool_rows.append(pool_row)
    pools = table(
        [
            *lead,
            "POOL",
            "K",
            "UTILISATION %",
            "IDLE GPU-H WHILE PENDING",
            "EVICTIONS/100 GPU-H",
            "LOST GPU-H",
            "FRAGMENTED GPUS",
            "JAIN",
        ],
        pool_rows,
    )
    return f"{queues}\n\n{pools}\n"
