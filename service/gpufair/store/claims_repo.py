"""Once-per-period claims for periodic jobs.

Every replica runs the same APScheduler jobs. Before doing a job's work for a period, a replica
inserts (job, period_start); the primary key lets exactly one insert succeed across all replicas
(`INSERT … ON CONFLICT`), so the work runs once per period however many replicas tick. Advisory
locks alone would not do: they serialise, but the second replica would run the work again once
the first released the lock.

A run that failed is retried within its period on the same row (`claim_or_retry`): once its
backoff has passed, the first replica to tick takes the claim again (`claimed_by`, `claimed_at`
anew, `finished_at` cleared; the outcome keeps the failure meanwhile), at most `attempts` runs in
all. The row lock of the conflicting insert makes that retake happen once, too: a second replica
sees the claim unfinished and leaves it. Each failure's outcome says which attempt it was
(`failed (attempt 2 of 3): …`); that is the count the next retake reads.

The claim commits before the work starts, so a replica that dies mid-job costs that period's run
(the next period runs normally); every job is written so that a later run repairs what a lost run
left undone (rollups replace, the sweeper and retention look at the whole backlog). A run
cancelled by a stopping server (`cancelled: …`) or deferred (`deferred: …`, a recompute that
waited too long for another process's rollup) is not retried either: the next period runs.
"""

from __future__ import annotations

import math
import socket
import uuid
from datetime import UTC, datetime

from sqlalchemy import Connection, Engine, text

REPLICA_ID = f"{socket.gethostname()}-{uuid.uuid4().hex[:8]}"
# Each retry waits this many times longer than the one before it.
BACKOFF_FACTOR = 4.0


def database_time(conn: Connection) -> float:
    """The database server's clock, in Unix seconds: the one clock every replica shares."""
    return float(
        conn.execute(text("SELECT extract(epoch FROM clock_timestamp())::float8")).scalar_one()
    )


def period_start(now_s: float, period_s: float) -> float:
    return math.floor(now_s / period_s) * period_s


def failed_outcome(attempt: int, attempts: int, error: str) -> str:
    """A failed run's outcome: which attempt it was (read back by `claim_or_retry`)."""
    return f"failed (attempt {attempt} of {attempts}): {error}"


def claim(engine: Engine, job: str, period_start_s: float, replica: str = REPLICA_ID) -> bool:
    """True if this replica won (job, period); commits the claim at once."""
    with engine.begin() as conn:
        row = conn.execute(
            text(
                "INSERT INTO job_claims (job, period_start, claimed_by) "
                "VALUES (:job, :start, :replica) ON CONFLICT DO NOTHING RETURNING job"
            ),
            {"job": job, "start": datetime.fromtimestamp(period_start_s, UTC), "replica": replica},
        ).one_or_none()
    return row is not None


# The failed attempts a claim's outcome counts (an outcome from before the count was written,
# `failed: …`, is one).
_FAILED_SO_FAR = "coalesce(substring(c.outcome FROM '^failed \\(attempt ([0-9]+) of'), '1')::int"
_CLAIM_OR_RETRY_SQL = text(
    f"""
    INSERT INTO job_claims AS c (job, period_start, claimed_by)
    VALUES (:job, :start, :replica)
    ON CONFLICT (job, period_start) DO UPDATE
        SET claimed_by = excluded.claimed_by, claimed_at = now(), finished_at = NULL
        WHERE c.finished_at IS NOT NULL AND c.outcome LIKE 'failed%'
          AND {_FAILED_SO_FAR} < :attempts
          AND c.finished_at <= clock_timestamp()
              - make_interval(secs => :backoff * power(:factor, {_FAILED_SO_FAR} - 1))
    RETURNING CASE WHEN c.outcome IS NULL THEN 1 ELSE {_FAILED_SO_FAR} + 1 END AS attempt
    """
)


def claim_or_retry(
    engine: Engine,
    job: str,
    period_start_s: float,
    replica: str = REPLICA_ID,
    *,
    attempts: int = 1,
    backoff_s: float = 0.0,
) -> int | None:
    """Claim (job, period) for a run, or take it again for a retry of a failed run: at most
    `attempts` runs, the first retry `backoff_s` after the failure it follows (by the
    database's clock), each later one `BACKOFF_FACTOR` times longer. Returns the attempt this
    replica won (1 for the period's first run), None when there is nothing to do (done,
    running, or failed with no retry due). Commits the claim at once."""
    with engine.begin() as conn:
        row = conn.execute(
            _CLAIM_OR_RETRY_SQL,
            {
                "job": job,
                "start": datetime.fromtimestamp(period_start_s, UTC),
                "replica": replica,
                "attempts": attempts,
                "backoff": backoff_s,
                "factor": BACKOFF_FACTOR,
            },
        ).one_or_none()
    return None if row is None else int(row.attempt)


def finish(engine: Engine, job: str, period_start_s: float, outcome: str) -> None:
    with engine.begin() as conn:
        conn.execute(
            text(
                "UPDATE job_claims SET finished_at = now(), outcome = :outcome "
                "WHERE job = :job AND period_start = :start"
            ),
            {
                "job": job,
                "start": datetime.fromtimestamp(period_start_s, UTC),
                "outcome": outcome[:1000],
            },
        )
