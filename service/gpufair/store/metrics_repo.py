"""The reads behind the metrics endpoint: the cluster's state as stored, the same for every replica.

Each read is bounded by what is configured now, not by history: the latest fair-share run of each
configured pool (one index probe per pool), its records of queues that still exist (a deleted
queue's gauges go with it), open allocation intervals, pending workloads, the budgets' current
periods, and the newest claim of each periodic job found through its primary key. A scrape costs a
handful of statements whatever the age of the database.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Connection, text

from gpufair.store import capacity_repo, report_repo

# The jobs that exist besides one `recompute:<pool>` per pool (jobs/runner.py).
FIXED_JOBS = ("rollup", "sweep", "retention")


@dataclass(frozen=True, slots=True)
class QueueRecord:
    """A queue's numbers from its pool's latest recompute."""

    pool: str
    queue: str
    fair_share_cu: float
    allocated_cu: float
    deserved_cu: float
    demand_cu: float
    limit_cu: float | None
    decayed_usage_cu_s: float
    effective_weight: float


@dataclass(frozen=True, slots=True)
class RunRecord:
    pool: str
    computed_at_s: float
    capacity_cu: float


@dataclass(frozen=True, slots=True)
class JobRecord:
    """A periodic job's newest finished run and its newest successful one."""

    job: str
    last_finished_s: float | None
    last_duration_s: float | None
    last_failed: bool
    last_success_s: float | None
    # A pool's recompute interval as stored (not clamped); None for the other jobs, whose
    # period is the runner's setting.
    configured_period_s: float | None = None


@dataclass(frozen=True, slots=True)
class LatestCycle:
    """A pool's newest recorded Schedule: its reply (a ScheduleResponse) and when it was made."""

    pool: str
    decided_at_s: float
    reply: bytes


def latest_runs(conn: Connection) -> tuple[list[RunRecord], list[QueueRecord]]:
    """The newest fair-share run of every configured pool, and its records of existing queues."""
    runs = conn.execute(
        text(
            """
            SELECT p.name AS pool, r.id, extract(epoch FROM r.computed_at)::float8 AS at,
                   r.capacity_cu
            FROM node_pools p
            CROSS JOIN LATERAL (
                SELECT id, computed_at, capacity_cu FROM fair_share_runs
                WHERE pool = p.name ORDER BY id DESC LIMIT 1  -- as fairshare_repo.latest_run
            ) r
            ORDER BY p.name
            """
        )
    ).all()
    if not runs:
        return [], []
    records = conn.execute(
        text(
            """
            SELECT h.pool, h.queue, h.fair_share_cu, h.allocated_cu, h.deserved_cu, h.demand_cu,
                   h.limit_cu, h.decayed_usage_cu_s, h.effective_weight
            FROM fair_share_history h JOIN queues q ON q.name = h.queue
            WHERE h.run_id = ANY(:runs)
            ORDER BY h.pool, h.queue
            """
        ),
        {"runs": [r.id for r in runs]},
    )
    return (
        [RunRecord(r.pool, r.at, r.capacity_cu) for r in runs],
        [
            QueueRecord(
                r.pool,
                r.queue,
                r.fair_share_cu,
                r.allocated_cu,
                r.deserved_cu,
                r.demand_cu,
                r.limit_cu,
                r.decayed_usage_cu_s,
                r.effective_weight,
            )
            for r in records
        ],
    )


def capacity(conn: Connection) -> dict[str, dict[str, tuple[float, float]]]:
    """Per pool and GPU type: (GPUs, CU) the pool counts now (`capacity_repo.counted_now`):
    its ready nodes, and the GPUs work running or bound on its nodes that are not ready still
    holds there, as the fair share divides them."""
    weights = {
        r.name: r.compute_weight
        for r in conn.execute(text("SELECT name, compute_weight FROM gpu_types"))
    }
    return {
        pool: {t: (gpus, gpus * weights.get(t, 0.0)) for t, gpus in by_type.items()}
        for pool, (_cu, by_type) in capacity_repo.counted_now(conn).items()
    }


def allocated(conn: Connection) -> dict[tuple[str, str], tuple[float, float]]:
    """Per (pool, GPU type): (GPUs, CU) held by what runs now (open allocation intervals)."""
    rows = conn.execute(
        text(
            "SELECT pool, gpu_type, sum(gpus) AS gpus, sum(cu) AS cu FROM allocation_intervals "
            "WHERE ended_at IS NULL GROUP BY pool, gpu_type"
        )
    )
    return {(r.pool, r.gpu_type): (float(r.gpus), float(r.cu)) for r in rows}


def pending_counts(
    conn: Connection, reasons: dict[str, str], other: str
) -> dict[tuple[str, str, str], int]:
    """Pending workloads per (pool, queue, reason): the reason `reasons` gives a uid, else
    `other`. Counted in SQL, so a long queue costs one array parameter, not a row per workload."""
    rows = conn.execute(
        text(
            """
            SELECT w.pool, w.queue, coalesce(r.reason, :other) AS reason, count(*) AS n
            FROM workloads w
            LEFT JOIN unnest(CAST(:uids AS text[]), CAST(:reasons AS text[])) AS r(uid, reason)
              ON r.uid = w.uid
            WHERE w.state = 'pending'
            GROUP BY 1, 2, 3
            """
        ),
        {"uids": list(reasons), "reasons": list(reasons.values()), "other": other},
    )
    return {(r.pool, r.queue, r.reason): int(r.n) for r in rows}


def latest_cycles(conn: Connection) -> list[LatestCycle]:
    """The newest recorded (not dry-run) Schedule of every configured pool."""
    rows = conn.execute(
        text(
            """
            SELECT p.name AS pool, extract(epoch FROM c.decided_at)::float8 AS at, c.reply
            FROM node_pools p
            CROSS JOIN LATERAL (
                SELECT decided_at, reply FROM schedule_cycles
                WHERE pool = p.name AND NOT dry_run ORDER BY decided_at DESC, id DESC LIMIT 1
            ) c
            """
        )
    )
    return [LatestCycle(r.pool, r.at, bytes(r.reply)) for r in rows]


def jobs(conn: Connection) -> list[JobRecord]:
    """Every current job's newest finished claim and newest success (`ok: …` outcome), and a
    pool's recompute interval as configured. A run cancelled because its server stopped
    (`cancelled: …`, jobs/runner.py), or a recompute deferred because another process's rollup
    held its pool's lock too long (`deferred: …`), did not finish on its own: it is neither a
    failure nor the latest run's duration, and the run before it says both. A failed run being
    retried (`finished_at` cleared, `store/claims_repo.py`) is not finished either: until the
    retry ends, the run before it says both."""
    rows = conn.execute(
        text(
            """
            WITH names AS (
                SELECT 'recompute:' || name AS job, recompute_interval_s AS period
                FROM node_pools
                UNION ALL SELECT unnest(CAST(:fixed AS text[])), NULL
            )
            SELECT n.job, n.period,
                   extract(epoch FROM f.finished_at)::float8 AS finished,
                   extract(epoch FROM f.finished_at - f.claimed_at)::float8 AS duration,
                   coalesce(f.outcome NOT LIKE 'ok%', false) AS failed,
                   extract(epoch FROM s.finished_at)::float8 AS success
            FROM names n
            LEFT JOIN LATERAL (
                SELECT claimed_at, finished_at, outcome FROM job_claims
                WHERE job = n.job AND finished_at IS NOT NULL
                  AND outcome NOT LIKE 'cancelled%' AND outcome NOT LIKE 'deferred%'
                ORDER BY period_start DESC LIMIT 1
            ) f ON true
            LEFT JOIN LATERAL (
                SELECT finished_at FROM job_claims
                WHERE job = n.job AND outcome LIKE 'ok%'
                ORDER BY period_start DESC LIMIT 1
            ) s ON true
            ORDER BY n.job
            """
        ),
        {"fixed": list(FIXED_JOBS)},
    )
    return [
        JobRecord(r.job, r.finished, r.duration, bool(r.failed), r.success, r.period) for r in rows
    ]


def budgets(conn: Connection, at: datetime) -> list[report_repo.BudgetRecord]:
    """Every budget's current period as of `at` (the report views' own computation)."""
    return report_repo.budgets(conn, at)


def latest_run_ends(conn: Connection, uids: list[str]) -> dict[str, float | None]:
    """Those of `uids` that ran (an allocation interval is recorded for them), each with the end
    of its latest ended run in Unix seconds (None if none has ended); a uid left out never ran."""
    if not uids:
        return {}
    rows = conn.execute(
        text(
            "SELECT workload_uid, extract(epoch FROM max(ended_at))::float8 "
            "FROM allocation_intervals WHERE workload_uid = ANY(:uids) GROUP BY workload_uid"
        ),
        {"uids": uids},
    ).all()
    return {uid: ended_s for uid, ended_s in rows}


def begin_light_read(conn: Connection, timeout_ms: int) -> None:
    """Start a scrape's read: read only, bounded by `timeout_ms`, and without JIT (the reads are
    small and indexed: compiling them for a high cost estimate costs more than running them)."""
    conn.execute(text("SET TRANSACTION READ ONLY"))
    conn.execute(text(f"SET LOCAL statement_timeout = {int(timeout_ms)}"))
    conn.execute(text("SET LOCAL jit = off"))
