"""Once-per-period claims for periodic jobs.

Every replica runs the same APScheduler jobs. Before doing a job's work for a period, a replica
inserts (job, period_start); the primary key lets exactly one insert succeed across all replicas
(`INSERT … ON CONFLICT`), so the work runs once per period however many replicas tick. Advisory
locks alone would not do: they serialise, but the second replica would run the work again once
the first released the lock.

A run that failed is retried within its period on the same row (`take_period`): once its
backoff has passed, the first replica to tick takes the claim again (`claimed_by`, `claimed_at`
anew, `finished_at` cleared; the outcome keeps the failure meanwhile), at most `attempts` runs in
all. The row lock of the conflicting insert makes that retake happen once, too: a second replica
sees the claim unfinished and leaves it. Each failure's outcome says which attempt it was
(`failed (attempt 2 of 3): …`); that is the count the next retake reads.

A tick asks first which of its jobs may have a run to take (`due_jobs`: one statement for all
of them, no lock, nothing written), and calls `take_period` for those alone, which decides
again under the period's lock. A period whose claim is done, or failed with no retry due yet,
stays so until a retry's backoff passes, which the next tick's read sees: so a tick with
nothing due costs one statement, not four per job.

A run whose replica died mid-run (process killed, host lost, connection cut) is taken over
(`take_period`). The rule, written once here: a replica runs (job, period) only while it holds
that period's advisory lock (`pg_advisory_lock`, `locks.period_key`) on the connection the run
uses, from before its claim to after its outcome commits; so an unfinished claim whose lock is
free has no holder, and the replica that now takes the lock retakes the claim at once, counted
as an attempt (the outcome says `abandoned (attempt 1 of 3): replica … stopped mid-run` while
the retake runs; an abandoned last attempt ends `failed (attempt 3 of 3): replica … stopped
mid-run`). A live run, however slow, holds its lock and is never retaken; two replicas never
run one period at once, since one lock admits one connection. PostgreSQL frees the lock when
the holder's backend ends: at once when its process dies and the kernel closes the socket, if
the backend was idle; within `client_connection_check_interval` (`holder_check_s`) if it was
running a statement; within the keepalives (`holder_check_s` idle, then 3 probes
`holder_check_s` apart, and `tcp_user_timeout` for unanswered sends) when the host is lost.
Another replica's next tick after that retakes the period. `take_period` sets these on the run's
connection. Nothing is written while a run lasts: the database's own connection checks are the
lease. The work runs on the lock's connection, so a run whose connection is cut loses its
transaction with its lock, and `finish` on a claim another replica retook writes nothing (it is
conditional on `claimed_by`).

A claim taken by a replica of an earlier release (which takes no lock) looks abandoned to this
rule while it runs; during a rolling upgrade, a period may then run twice (as a retry would).

A run cancelled by a stopping server (`cancelled: …`) or deferred (`deferred: …`, a recompute that
waited too long for another process's rollup) is not retried: the next period runs, and every job
is written so that a later run repairs what a lost run left undone (rollups replace, the sweeper
and retention look at the whole backlog).
"""

from __future__ import annotations

import math
import socket
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime

from sqlalchemy import Connection, Engine, text

from gpufair.store import locks

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
    """A failed run's outcome: which attempt it was (read back by `take_period`)."""
    return f"failed (attempt {attempt} of {attempts}): {error}"


# The attempts a claim's outcome counts as ended: a failure or an abandoned run says which attempt
# it was; an outcome from before the count was written (`failed: …`) is one; none (the first run
# in progress) is none. An unfinished claim's run is the attempt after those.
_ENDED_SO_FAR = (
    "coalesce(substring(c.outcome FROM '^(?\\:failed|abandoned) \\(attempt ([0-9]+) of'), "
    "CASE WHEN c.outcome IS NULL THEN '0' ELSE '1' END)::int"
)
# What an abandoned run's outcome says after `abandoned ` or `failed `: the attempt it was.
_STOPPED_MID_RUN = (
    "format('(attempt %s of %s): replica %s stopped mid-run', "
    f"{_ENDED_SO_FAR} + 1, :attempts, c.claimed_by)"
)
# A claim whose run failed, with attempts left and its backoff passed by the database's clock.
_RETRY_DUE = f"""
    c.finished_at IS NOT NULL AND c.outcome LIKE 'failed%'
    AND {_ENDED_SO_FAR} < :attempts
    AND c.finished_at <= clock_timestamp()
        - make_interval(secs => :backoff * power(:factor, {_ENDED_SO_FAR} - 1))
"""
# The claim, or its retake: a retry that is due, or (`holder_gone`: the caller holds the period's
# lock) the run of an unfinished claim whose holder is gone, while attempts are left.
_TAKE_SQL = text(
    f"""
    INSERT INTO job_claims AS c (job, period_start, claimed_by)
    VALUES (:job, :start, :replica)
    ON CONFLICT (job, period_start) DO UPDATE
        SET claimed_by = excluded.claimed_by, claimed_at = now(), finished_at = NULL,
            outcome = CASE WHEN c.finished_at IS NULL
                THEN 'abandoned ' || {_STOPPED_MID_RUN}
                ELSE c.outcome END
        WHERE ({_RETRY_DUE})
           OR (c.finished_at IS NULL AND :holder_gone AND {_ENDED_SO_FAR} + 1 < :attempts)
    RETURNING {_ENDED_SO_FAR} + 1 AS attempt,
              substring(c.outcome FROM '^abandoned .* replica (.*) stopped mid-run$') AS took_over
    """
)
# Of the jobs' current periods, those `take_period` may find something to do for: no claim yet,
# an unfinished one (running, or abandoned), or a failed one whose retry is due. One statement
# for every job, and no lock: a claim done, or failed with no retry due, is so for the period.
_DUE_SQL = text(
    f"""
    SELECT d.job
    FROM unnest(CAST(:jobs AS text[]), CAST(:starts AS timestamptz[])) AS d(job, start)
    LEFT JOIN job_claims AS c ON c.job = d.job AND c.period_start = d.start
    WHERE c.job IS NULL OR c.finished_at IS NULL OR ({_RETRY_DUE})
    """
)
# An unfinished claim without a holder whose run was the last attempt: it failed.
_ABANDONED_LAST_SQL = text(
    f"""
    UPDATE job_claims AS c
    SET finished_at = now(),
        outcome = 'failed ' || {_STOPPED_MID_RUN}
    WHERE job = :job AND period_start = :start AND finished_at IS NULL
      AND {_ENDED_SO_FAR} + 1 >= :attempts
    RETURNING c.claimed_by
    """
)


def due_jobs(
    conn: Connection,
    periods: Mapping[str, float],
    *,
    attempts: int = 1,
    backoff_s: float = 0.0,
) -> set[str]:
    """Of `periods` (job -> the start of its current period), the jobs that may have a run to
    take (`take_period` decides, under the period's lock): one statement for all of them, so a
    tick where nothing is due takes no lock and writes nothing. Leaves the transaction open."""
    rows = conn.execute(
        _DUE_SQL,
        {
            "jobs": list(periods),
            "starts": [datetime.fromtimestamp(s, UTC) for s in periods.values()],
            "attempts": attempts,
            "backoff": backoff_s,
            "factor": BACKOFF_FACTOR,
        },
    )
    return set(rows.scalars())


def _claim_params(
    job: str, period_start_s: float, replica: str, attempts: int, backoff_s: float
) -> dict[str, object]:
    """The parameters of `_TAKE_SQL` and `_ABANDONED_LAST_SQL` but `holder_gone`."""
    return {
        "job": job,
        "start": datetime.fromtimestamp(period_start_s, UTC),
        "replica": replica,
        "attempts": attempts,
        "backoff": backoff_s,
        "factor": BACKOFF_FACTOR,
    }


@dataclass(frozen=True)
class Taken:
    """What `take_period` found: the attempt this replica now runs (None: nothing to run), and
    the replica whose run it found abandoned (None if none was), retaken or, on its last
    attempt, ended failed."""

    attempt: int | None
    took_over: str | None = None


def take_period(
    conn: Connection,
    job: str,
    period_start_s: float,
    replica: str = REPLICA_ID,
    *,
    attempts: int = 1,
    backoff_s: float = 0.0,
    holder_check_s: float = 5.0,
) -> Taken:
    """Claim (job, period) for a run, or take it again: for a retry of a failed run (at most
    `attempts` runs, the first retry `backoff_s` after the failure it follows by the database's
    clock, each later one `BACKOFF_FACTOR` times longer), or for a run whose holder is gone (the
    rule is in the module's docstring). All under the period's lock. With an attempt to run,
    `conn` holds the lock until `release_period`: run the work and `finish` on it. Otherwise the
    lock is released before returning. Commits what it does; closes `conn` rather than pool it
    if it fails (it may hold the lock)."""
    space, key = locks.period_key(job, period_start_s)
    check = str(max(1, round(holder_check_s)))
    held = conn.execute(
        _HOLD_SQL,
        {
            "space": space,
            "key": key,
            "check_ms": f"{check}s",
            "check_s": check,
            "user_ms": f"{4 * int(check)}s",
        },
    ).scalar_one()
    if not held:  # another replica runs this period now, or is claiming or finishing it
        conn.rollback()
        return Taken(None)
    try:
        params = _claim_params(job, period_start_s, replica, attempts, backoff_s)
        row = conn.execute(_TAKE_SQL, {**params, "holder_gone": True}).one_or_none()
        if row is not None:
            conn.commit()
            return Taken(int(row.attempt), row.took_over)
        gone = conn.execute(_ABANDONED_LAST_SQL, params).scalar_one_or_none()
        # Released before the commit: a replica taking the lock at once waits for this
        # transaction's row lock on the claim, if it wrote one, and then sees it finished.
        _unlock(conn, job, period_start_s)
        conn.commit()
    except Exception:
        conn.invalidate()  # it may hold the period's lock
        raise
    return Taken(None, gone)


def _unlock(conn: Connection, job: str, period_start_s: float) -> bool:
    space, key = locks.period_key(job, period_start_s)
    return bool(
        conn.execute(
            text("SELECT pg_advisory_unlock(CAST(:space AS int), CAST(:key AS int))"),
            {"space": space, "key": key},
        ).scalar_one()
    )


def release_period(conn: Connection, job: str, period_start_s: float) -> None:
    """Ends the transaction in progress, if any, and releases the period's lock. A connection
    on which that fails is closed rather than pooled (a lock left on a pooled connection would
    stay held, and the period could never be retaken)."""
    try:
        if conn.in_transaction():
            conn.rollback()
        released = _unlock(conn, job, period_start_s)
        conn.commit()
    except Exception:
        conn.invalidate()
        raise
    if not released:
        conn.invalidate()


# The period's lock, and the checks that free it when the holder's backend loses its client,
# for the connection (a pooled connection keeps them: harmless on any connection).
_HOLD_SQL = text(
    "SELECT pg_try_advisory_lock(CAST(:space AS int), CAST(:key AS int)) AS held, "
    "set_config('client_connection_check_interval', :check_ms, false), "
    "set_config('tcp_keepalives_idle', :check_s, false), "
    "set_config('tcp_keepalives_interval', :check_s, false), "
    "set_config('tcp_keepalives_count', '3', false), "
    "set_config('tcp_user_timeout', :user_ms, false)"
)


def finish(
    engine: Engine | Connection,
    job: str,
    period_start_s: float,
    outcome: str,
    replica: str | None = None,
) -> None:
    """Records the run's outcome; with `replica`, only on a claim that replica still holds."""
    params = {
        "job": job,
        "start": datetime.fromtimestamp(period_start_s, UTC),
        "outcome": outcome[:1000],
        "replica": replica,
    }
    sql = text(
        "UPDATE job_claims SET finished_at = now(), outcome = :outcome "
        "WHERE job = :job AND period_start = :start "
        "AND (CAST(:replica AS text) IS NULL OR claimed_by = :replica)"
    )
    if isinstance(engine, Engine):
        with engine.begin() as conn:
            conn.execute(sql, params)
    else:
        engine.execute(sql, params)
        engine.commit()
