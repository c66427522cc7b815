"""A periodic run whose replica died mid-run is taken over within its period, counted as an
attempt; a live run, however slow, is not; one period never runs on two replicas at once
(store/claims_repo.py has the rule: the run's session lock)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

from prometheus_client import REGISTRY
from sqlalchemy import Connection, Engine, text

from gpufair.jobs.runner import JobSettings, PeriodicJobs
from gpufair.store import claims_repo as claims

HOUR = 3600.0
SETTINGS = JobSettings(sweep_period_s=HOUR, retry_backoff_s=0.0)
SLEEP_S = 25  # the dead replica's statement: its backend would go on that long unchecked

# A replica whose sweep sits in a statement on the connection its run works on.
DYING_REPLICA = textwrap.dedent(
    """
    import sys, time
    from sqlalchemy import text
    from gpufair.jobs.runner import JobSettings, PeriodicJobs
    from gpufair.store.database import make_engine

    class Stuck(PeriodicJobs):
        def _sweep(self, now_s):
            connect = getattr(self, "_connection", self.engine.connect)
            with connect() as conn:
                conn.execute(text("SELECT pg_sleep(SLEEP_S)"))
            return "ok"

    fields = JobSettings.__dataclass_fields__
    extra = {"holder_check_s": 1.0} if "holder_check_s" in fields else {}
    settings = JobSettings(sweep_period_s=3600.0, retry_backoff_s=0.0, **extra)
    Stuck(make_engine(sys.argv[1]), settings, replica="dead").tick()
    """
).replace("SLEEP_S", str(SLEEP_S))


class Counted(PeriodicJobs):
    """Counts the sweeps in progress across every replica of the test, and the most at once."""

    lock = threading.Lock()
    running = 0
    most = 0
    runs = 0

    def __init__(self, *args: object, sweep_s: float = 0.0, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.sweep_s = sweep_s

    def _sweep(self, now_s: float) -> str:
        with Counted.lock:
            Counted.running += 1
            Counted.runs += 1
            Counted.most = max(Counted.most, Counted.running)
        try:
            if self.sweep_s:
                connect = getattr(self, "_connection", self.engine.connect)
                with connect() as conn:
                    conn.execute(text("SELECT pg_sleep(:s)"), {"s": self.sweep_s})
            return super()._sweep(now_s)
        finally:
            with Counted.lock:
                Counted.running -= 1


def _reset_counts() -> None:
    Counted.running = Counted.most = Counted.runs = 0


def _sweep_claim(db: Engine) -> tuple[str, str | None, bool]:
    with db.connect() as conn:
        row = conn.execute(
            text(
                "SELECT claimed_by, outcome, finished_at IS NOT NULL AS finished "
                "FROM job_claims WHERE job = 'sweep'"
            )
        ).one()
    return row.claimed_by, row.outcome, row.finished


def _sleeping_backends(db: Engine) -> int:
    with db.connect() as conn:
        return int(
            conn.execute(
                text(
                    "SELECT count(*) FROM pg_stat_activity "
                    "WHERE query LIKE 'SELECT pg_sleep(%' AND state = 'active' "
                    "AND datname = current_database()"
                )
            ).scalar_one()
        )


def _failures() -> float:
    return (
        REGISTRY.get_sample_value("gpufair_periodic_job_failures_total", {"periodic_job": "sweep"})
        or 0.0
    )


def test_a_run_whose_replica_was_killed_is_taken_over(database_url: str, db: Engine) -> None:
    env = dict(os.environ)
    dying = subprocess.Popen([sys.executable, "-c", DYING_REPLICA, database_url], env=env)
    try:
        deadline = time.monotonic() + 60
        while _sleeping_backends(db) == 0:  # the dead replica's sweep is in its statement
            assert dying.poll() is None and time.monotonic() < deadline
            time.sleep(0.1)
        assert _sweep_claim(db) == ("dead", None, False)
        dying.send_signal(signal.SIGKILL)
        assert dying.wait(timeout=30) == -signal.SIGKILL
    finally:
        if dying.poll() is None:
            dying.kill()
    killed = time.monotonic()
    failures_before = _failures()
    _reset_counts()
    # Three replicas tick together, each every 0.25 s, until the sweep's period is done.
    survivors = [Counted(db, SETTINGS, replica=f"r{i}") for i in range(3)]
    stop = threading.Event()

    def ticking(jobs: PeriodicJobs) -> None:
        while not stop.is_set():
            jobs.tick()
            time.sleep(0.25)

    threads = [threading.Thread(target=ticking, args=(s,)) for s in survivors]
    for t in threads:
        t.start()
    try:
        while not _sweep_claim(db)[2] and time.monotonic() - killed < SLEEP_S - 5:
            time.sleep(0.1)
        done_after_s = time.monotonic() - killed
        time.sleep(1.0)  # more ticks: nothing runs the period again
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=60)
    claimed_by, outcome, finished = _sweep_claim(db)
    print(f"taken over {done_after_s:.1f} s after the kill by {claimed_by}: {outcome}")
    # Done well before the dead replica's statement would have ended on its own.
    assert finished and done_after_s < SLEEP_S - 5
    assert claimed_by in {"r0", "r1", "r2"}
    assert outcome == "ok: 0 stale runs closed, 0 reopened (attempt 2, taken over from dead)"
    assert (Counted.runs, Counted.most) == (1, 1)
    assert _failures() == failures_before + 1  # the abandoned attempt


def test_a_slow_live_run_is_not_taken_over(db: Engine) -> None:
    _reset_counts()
    # The run lasts four times the holder check (`holder_check_s` 1 s) while others tick.
    # (Written so that it runs on a release without the setting too: a guard, not a fix's test.)
    fields = JobSettings.__dataclass_fields__
    check: dict[str, float] = {"holder_check_s": 1.0} if "holder_check_s" in fields else {}
    settings = JobSettings(sweep_period_s=HOUR, retry_backoff_s=0.0, **check)
    slow = Counted(db, settings, replica="slow", sweep_s=4.0)
    runner = threading.Thread(target=slow.tick)
    runner.start()
    while Counted.running == 0:  # the slow sweep is in its statement
        assert runner.is_alive()
        time.sleep(0.05)
    others = [Counted(db, settings, replica=f"r{i}") for i in range(2)]
    ticks = 0
    while runner.is_alive():
        for jobs in others:
            jobs.tick()
            ticks += 1
        time.sleep(0.2)
    runner.join()
    assert ticks >= 4  # each other replica ticked past the holder check, twice or more
    assert _sweep_claim(db) == ("slow", "ok: 0 stale runs closed, 0 reopened", True)
    assert (Counted.runs, Counted.most) == (1, 1)


def _die(db: Engine, conn: Connection) -> None:
    """`conn`'s session ends without a word (as its replica's would), and its backend is gone."""
    pid = conn.connection.dbapi_connection.info.backend_pid  # type: ignore[union-attr]
    conn.invalidate()
    conn.close()
    deadline = time.monotonic() + 30
    while True:
        with db.connect() as check:
            alive = check.execute(
                text("SELECT count(*) FROM pg_stat_activity WHERE pid = :pid"), {"pid": pid}
            ).scalar_one()
        if not alive:
            return
        assert time.monotonic() < deadline
        time.sleep(0.05)


def test_a_claim_is_taken_over_only_once_its_holder_is_gone(db: Engine) -> None:
    start_s = claims.period_start(time.time(), HOUR)

    def take(conn: Connection, replica: str) -> claims.Taken:
        return claims.take_period(conn, "sweep", start_s, replica, attempts=3)

    holder = db.connect()
    assert take(holder, "a") == claims.Taken(1)
    with db.connect() as other:  # the holder's session lives: nothing to take
        assert take(other, "b") == claims.Taken(None)
    _die(db, holder)
    b = db.connect()
    assert take(b, "b") == claims.Taken(2, "a")
    assert _sweep_claim(db) == ("b", "abandoned (attempt 1 of 3): replica a stopped mid-run", False)
    _die(db, b)
    c = db.connect()
    assert take(c, "c") == claims.Taken(3, "b")
    _die(db, c)  # on the last attempt
    with db.connect() as d:
        assert take(d, "d") == claims.Taken(None, "c")
    assert _sweep_claim(db) == ("c", "failed (attempt 3 of 3): replica c stopped mid-run", True)
    # Nothing more to do in the period; a finish by a replica that lost the claim writes nothing.
    with db.connect() as e:
        assert take(e, "e") == claims.Taken(None)
    claims.finish(db, "sweep", start_s, "ok: late", "a")
    assert _sweep_claim(db)[1] == "failed (attempt 3 of 3): replica c stopped mid-run"
