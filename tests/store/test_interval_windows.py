"""`rollup_repo.intervals_between` reads open and long runs by the partial GiST index and short
ones by their start (migration 0015): it must return exactly the intervals whose time range
overlaps the window, as the single overlap statement over the whole table did, whichever side of
the one-hour line a run falls on; and the migration keeps every row and every answer."""

from __future__ import annotations

import random
import uuid
from collections import Counter
from collections.abc import Iterator

import pytest
from alembic import command
from sqlalchemy import Connection, Engine, create_engine, text

from gpufair.store import migrate, rollup_repo
from gpufair.store.database import Database, normalise_url
from gpufair.store.scratch import scratch_database

T0 = 1_767_225_600.0  # 2026-01-01 00:00 UTC
HOUR = 3600.0

# The statement before migration 0015: every interval of the pool whose range meets the window.
_ONE_STATEMENT = text(
    """
    SELECT queue, gpu_type, gpus, cu, extract(epoch FROM started_at)::float8,
           COALESCE(extract(epoch FROM ended_at)::float8, 'Infinity'::float8)
    FROM allocation_intervals
    WHERE tstzrange(started_at, ended_at, '[)')
          && tstzrange(to_timestamp(:lo), to_timestamp(:hi), '[)')
      AND pool = :pool AND gpus < 'Infinity'::float8 AND cu < 'Infinity'::float8
    """
)


@pytest.fixture
def conn(db: Engine) -> Iterator[Connection]:
    with db.connect() as connection:
        yield connection
        connection.rollback()


def add(conn: Connection, rows: list[tuple[str, float, float | None, float]]) -> None:
    """Intervals (pool, start, end or None while open, cu); the queue names the row."""
    for n, (pool, start, end, cu) in enumerate(rows):
        conn.execute(
            text(
                "INSERT INTO allocation_intervals (workload_uid, start_event_id, queue, pool, "
                "gpu_type, gpus, cu, started_at, ended_at, pods) VALUES (:uid, :sid, :queue, "
                ":pool, 'a100', 1, :cu, to_timestamp(:s), to_timestamp(:e), '[]')"
            ),
            {
                "uid": f"w{n}",
                "sid": str(uuid.uuid4()),
                "queue": f"r{n}",
                "pool": pool,
                "cu": cu,
                "s": start,
                "e": end,
            },
        )


def names(conn: Connection, lo: float, hi: float) -> list[str]:
    return sorted(iv.queue for iv in rollup_repo.intervals_between(conn, "p", lo, hi))


def test_short_long_and_open_runs_around_the_one_hour_line(conn: Connection) -> None:
    lo, hi = T0 + 10 * HOUR, T0 + 11 * HOUR
    add(
        conn,
        [
            ("p", lo - HOUR + 1, lo + 1, 10),  # r0: just under an hour: short
            ("p", lo - HOUR - 1, lo + 0.5, 10),  # r1: an hour and a half second: long
            ("p", lo - HOUR, lo, 10),  # r2: exactly an hour, ends at lo: does not meet [lo, hi)
            ("p", lo - 1800, lo, 10),  # r3: short, ends at lo: does not meet it
            ("p", lo - 1800, lo + 0.000001, 10),  # r4: short, a microsecond into the window
            ("p", hi - 60, hi + 60, 10),  # r5: short, across hi
            ("p", hi, hi + 60, 10),  # r6: starts at hi: outside
            ("p", lo - 30 * 86400, None, 10),  # r7: open for a month
            ("p", lo - 30 * 86400, lo + 5, 10),  # r8: a month long, ends inside
            ("p", lo + 100, lo + 100, 10),  # r9: empty range: meets nothing
            ("q", lo + 10, lo + 20, 10),  # r10: another pool
            ("p", lo + 10, lo + 20, float("inf")),  # r11: CU not finite: left out
            ("p", hi + 10, None, 10),  # r12: open, starts after the window
        ],
    )
    assert names(conn, lo, hi) == ["r0", "r1", "r4", "r5", "r7", "r8"]
    # A window of a single instant meets nothing; before everything, nothing either.
    assert names(conn, lo + 10, lo + 10) == []
    assert names(conn, T0 - 90 * 86400, T0 - 80 * 86400) == []


def test_same_rows_as_the_single_overlap_statement(conn: Connection) -> None:
    """600 intervals of every length from seconds to days, a tenth of them open, and windows
    from a second to a week: the two reads return the same rows, and every row they return
    overlaps the window (start < hi and end > lo, the range not empty)."""
    rng = random.Random(17)
    rows: list[tuple[str, float, float | None, float]] = []
    for _ in range(600):
        start = T0 + rng.uniform(0, 20 * 86400)
        length = rng.choice([rng.uniform(0, 2 * HOUR), HOUR, rng.uniform(0, 5 * 86400)])
        end = None if rng.random() < 0.1 else start + length
        rows.append((rng.choice(["p", "p", "q"]), start, end, rng.choice([1.0, 10.0])))
    add(conn, rows)
    stored = {
        r.queue: (r.pool, r.s, r.e)
        for r in conn.execute(
            text(
                "SELECT queue, pool, extract(epoch FROM started_at)::float8 AS s, "
                "COALESCE(extract(epoch FROM ended_at)::float8, 'Infinity') AS e "
                "FROM allocation_intervals"
            )
        )
    }
    checked = 0
    for _ in range(60):
        lo = T0 + rng.uniform(-86400, 21 * 86400)
        hi = lo + rng.choice([1.0, HOUR, rng.uniform(0, 7 * 86400)])
        got = rollup_repo.intervals_between(conn, "p", lo, hi)
        before = conn.execute(_ONE_STATEMENT, {"pool": "p", "lo": lo, "hi": hi}).all()
        assert Counter(
            (iv.queue, iv.gpu_type, iv.gpus, iv.cu, iv.start_s, iv.end_s) for iv in got
        ) == Counter(tuple(r) for r in before)
        want = sorted(
            q for q, (pool, s, e) in stored.items() if pool == "p" and s < e and s < hi and e > lo
        )
        assert sorted(iv.queue for iv in got) == want
        checked += len(got)
    assert checked > 500  # the windows did find rows, short and long


def test_migration_0015_keeps_every_interval_and_every_window(pg_server: Database) -> None:
    """A database populated at 0014 (GiST over every run) upgraded to 0015: the same rows, the
    same answer for every window, the GiST index now over long and open runs only; and back."""
    with scratch_database(pg_server.url) as url:
        migrate.upgrade(url, "0014")
        engine = create_engine(normalise_url(url))
        try:
            rng = random.Random(15)
            rows: list[tuple[str, float, float | None, float]] = []
            for _ in range(300):
                start = T0 + rng.uniform(0, 5 * 86400)
                length = rng.choice([rng.uniform(0, 2 * HOUR), rng.uniform(0, 3 * 86400)])
                rows.append(("p", start, None if rng.random() < 0.1 else start + length, 10.0))
            windows = [(T0 + k * 7200.0, T0 + k * 7200.0 + HOUR) for k in range(60)]
            with engine.begin() as conn:
                add(conn, rows)
                before = [
                    Counter(conn.execute(_ONE_STATEMENT, {"pool": "p", "lo": lo, "hi": hi}))
                    for lo, hi in windows
                ]
            migrate.upgrade(url)
            with engine.connect() as conn:
                assert (
                    conn.execute(text("SELECT count(*) FROM allocation_intervals")).scalar() == 300
                )
                after = [
                    Counter(
                        (iv.queue, iv.gpu_type, iv.gpus, iv.cu, iv.start_s, iv.end_s)
                        for iv in rollup_repo.intervals_between(conn, "p", lo, hi)
                    )
                    for lo, hi in windows
                ]
                assert after == [Counter({tuple(k): v for k, v in c.items()}) for c in before]
                assert sum(sum(c.values()) for c in after) > 300
                assert span_indexes(conn) == {
                    "ix_allocation_intervals_long_span": "((ended_at IS NULL) OR "
                    "((ended_at - started_at) >= '01:00:00'::interval))"
                }
            command.downgrade(migrate.alembic_config(url), "0014")
            with engine.connect() as conn:
                assert span_indexes(conn) == {"ix_allocation_intervals_span": None}
                assert (
                    conn.execute(text("SELECT count(*) FROM allocation_intervals")).scalar() == 300
                )
        finally:
            engine.dispose()


def span_indexes(conn: Connection) -> dict[str, str | None]:
    """The GiST indexes of allocation_intervals and their predicates."""
    return {
        r.name: r.predicate
        for r in conn.execute(
            text(
                "SELECT i.relname AS name, pg_get_expr(x.indpred, x.indrelid) AS predicate "
                "FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid "
                "JOIN pg_am a ON a.oid = i.relam "
                "WHERE x.indrelid = 'allocation_intervals'::regclass AND a.amname = 'gist'"
            )
        )
    }
