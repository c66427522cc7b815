"""Once-per-period claims for periodic jobs.

Every replica runs the same APScheduler jobs. Before doing a job's work for a period, a replica
inserts (job, period_start); the primary key lets exactly one insert succeed across all replicas
(`INSERT … ON CONFLICT DO NOTHING RETURNING`), so the work runs once per period however many
replicas tick. Advisory locks alone would not do: they serialise, but the second replica would
run the work again once the first released the lock.

The claim commits before the work starts, so a replica that dies mid-job costs that period's run
(the next period runs normally); every job is written so that a later run repairs what a lost run
left undone (rollups replace, the sweeper and retention look at the whole backlog).
"""

from __future__ import annotations

import math
import socket
import uuid
from datetime import UTC, datetime

from sqlalchemy import Connection, Engine, text

REPLICA_ID = f"{socket.gethostname()}-{uuid.uuid4().hex[:8]}"


def database_time(conn: Connection) -> float:
    """The database server's clock, in Unix seconds: the one clock every replica shares."""
    return float(
        conn.execute(text("SELECT extract(epoch FROM clock_timestamp())::float8")).scalar_one()
    )


def period_start(now_s: float, period_s: float) -> float:
    return math.floor(now_s / period_s) * period_s


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
