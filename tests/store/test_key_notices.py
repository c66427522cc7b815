"""`store/commit_watch.py`'s `KeyNotices`: a commit that moves a read cache's key, made on
another engine (another process), is counted here when PostgreSQL's notification arrives; a
rolled-back one is not; one of this engine's own, counted already, is not counted again; the
listener confirms every heartbeat and comes back after its connection is cut."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import pytest
from sqlalchemy import Connection, Engine, text

from gpufair.store.commit_watch import (
    CommitCount,
    KeyNotices,
    key_commit_count,
    key_notices,
    wrote_read_key,
)
from gpufair.store.database import make_engine


@pytest.fixture
def other(database_url: str, db: Engine) -> Iterator[Engine]:
    """Another process's engine: its commits reach this one only through PostgreSQL."""
    engine = make_engine(database_url, pool_size=2)
    yield engine
    engine.dispose()


@pytest.fixture
def mine(database_url: str, db: Engine) -> Iterator[Engine]:
    """This process's engine, with a key count of its own: the session's server, started on the
    `db` engine by earlier tests of the same worker, listens into that engine's count too, and
    its listener would count each of this engine's notifications a second time."""
    engine = make_engine(database_url, pool_size=2)
    yield engine
    engine.dispose()


def write_versions(conn: Connection, *versions: int) -> None:
    """Config versions, one statement each: what moves GetConfig's key."""
    for version in versions:
        conn.execute(
            text("INSERT INTO config_versions (version, changes) VALUES (:v, '[]')"),
            {"v": version},
        )


def until(condition: Callable[[], bool], timeout_s: float = 5.0) -> float:
    """Seconds until `condition` held (fails after `timeout_s`)."""
    started = time.monotonic()
    while not condition():
        assert time.monotonic() - started < timeout_s, "not within the time allowed"
        time.sleep(0.001)
    return time.monotonic() - started


def test_a_key_committed_elsewhere_is_counted_within_milliseconds(
    db: Engine, other: Engine
) -> None:
    count = CommitCount()
    notices = KeyNotices(db, count, heartbeat_s=0.25).start()
    try:
        until(lambda: notices.confirmed_at > float("-inf"))
        before = count.value
        with other.connect() as conn:
            write_versions(conn, 1, 2)  # two statements: one notification per transaction
            conn.rollback()  # rolled back: nothing is told
        time.sleep(0.3)
        assert (count.value, notices.heard) == (before, 0)

        delays = []
        for n in range(5):
            with other.begin() as conn:
                write_versions(conn, 10 + 2 * n, 11 + 2 * n)
            delays.append(until(lambda n=n: notices.heard == n + 1))
        assert count.value == before + 5
        # Measured from the commit's return: median 0.3 ms, p99 58 ms with the load average at
        # 24 (bench/results/serving.md); the test allows a heartbeat.
        assert max(delays) < 0.25
    finally:
        notices.close()


def test_the_listener_confirms_each_heartbeat_and_comes_back_after_a_cut(db: Engine) -> None:
    count = CommitCount()
    notices = KeyNotices(db, count, heartbeat_s=0.05).start()
    try:
        until(lambda: notices.confirmed_at > float("-inf"))
        first = notices.confirmed_at
        until(lambda: notices.confirmed_at >= first + 0.2, timeout_s=2.0)  # about 4 heartbeats

        bumped = count.value
        with db.connect() as conn:
            cut = conn.execute(
                text(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE query = 'SELECT 1' AND pid <> pg_backend_pid() "
                    "AND datname = current_database()"
                )
            ).all()
        assert cut, "the listener's connection was found"
        # A new connection: the count moves (a commit may have gone unheard), and the
        # confirmations go on.
        until(lambda: count.value > bumped)
        resumed = time.monotonic()
        until(lambda: notices.confirmed_at > resumed)
    finally:
        notices.close()


def test_rows_written_by_hand_notify_through_the_tables_triggers(db: Engine, other: Engine) -> None:
    """A config version inserted with plain SQL, a fair-share run deleted, and a TRUNCATE: each
    committed statement is heard (migration 0016), a rolled-back one is not."""
    count = CommitCount()
    notices = KeyNotices(db, count, heartbeat_s=0.25).start()
    try:
        until(lambda: notices.confirmed_at > float("-inf"))
        with other.begin() as conn:
            conn.execute(text("INSERT INTO config_versions (version, changes) VALUES (7, '[]')"))
        until(lambda: notices.heard == 1)
        with other.connect() as conn:
            conn.execute(text("DELETE FROM config_versions WHERE version = 7"))
            conn.rollback()
        with other.begin() as conn:
            conn.execute(text("DELETE FROM fair_share_runs"))  # no row: still a statement
        until(lambda: notices.heard == 2)
        with other.begin() as conn:
            conn.execute(text("TRUNCATE config_versions CASCADE"))
        until(lambda: notices.heard == 3)
        time.sleep(0.3)
        assert notices.heard == 3
    finally:
        notices.close()


def test_this_process_counts_its_own_key_commit_once_and_anothers_as_it_arrives(
    mine: Engine, other: Engine
) -> None:
    """A key commit of this engine is counted as its connection comes back to the pool; its
    notification, heard after, is not counted again. Another engine's (another process's) is
    counted when heard. One heard before its connection comes back is counted by that return,
    and the listener confirms nothing until then. A marked commit that wrote no key table is
    heard of never: forgotten at the next round trip; a closed connection's unheard commits are
    forgotten with it."""
    count = key_commit_count(mine)
    notices = KeyNotices(mine, count, heartbeat_s=0.05).start()
    try:
        until(lambda: notices.confirmed_at > float("-inf"))
        before = count.value
        with mine.begin() as conn:
            wrote_read_key(conn)
            write_versions(conn, 1, 2)
        assert count.value == before + 1
        until(lambda: notices.heard == 1)
        returned = time.monotonic()
        until(lambda: notices.confirmed_at > returned)
        assert count.value == before + 1  # the notification of the same commit: not again
        assert (notices.own, count.unheard) == (1, 0)

        with other.begin() as conn:
            write_versions(conn, 3)
        until(lambda: notices.heard == 2)
        assert (count.value, notices.own) == (before + 2, 1)

        with mine.connect() as conn:
            wrote_read_key(conn)
            conn.execute(text("SELECT 1"))  # no key table written: nothing will be heard
            conn.commit()
            assert count.unheard == 1  # recorded, its connection not yet back
        assert count.value == before + 3
        until(lambda: count.unheard == 0)  # forgotten at a round trip started after it
        with other.begin() as conn:  # the same backend cannot hide another's commit
            write_versions(conn, 4)
        until(lambda: notices.heard == 3)
        assert (count.value, notices.own) == (before + 4, 1)

        # Heard before its connection comes back: counted by the return, and meanwhile the
        # listener confirms nothing (the count does not hold that commit yet).
        with mine.connect() as conn:
            wrote_read_key(conn)
            write_versions(conn, 5)
            conn.commit()
            until(lambda: notices.heard == 4)
            held = time.monotonic()
            time.sleep(0.3)  # six heartbeats
            assert notices.confirmed_at < held
            assert (count.value, notices.own) == (before + 4, 2)
        assert count.value == before + 5
        returned = time.monotonic()
        until(lambda: notices.confirmed_at > returned)
        assert (count.value, count.unheard) == (before + 5, 0)

        with mine.connect() as conn:
            wrote_read_key(conn)
            conn.execute(text("SELECT 1"))
            conn.commit()
            assert count.unheard == 1  # under way
            conn.invalidate()  # its connection closes: forgotten
        assert (count.value, count.unheard) == (before + 6, 0)
    finally:
        notices.close()


def test_one_listener_per_count_and_servers_of_one_engine_share_it(
    mine: Engine, other: Engine
) -> None:
    """Two listeners on one count would count each other process's key commit twice (each
    hears its notification): a second one is refused. Servers of one process on one engine share
    the engine's listener (`key_notices`), which stops when the last of them closes it."""
    count = key_commit_count(mine)
    first = key_notices(mine)
    second = key_notices(mine)
    try:
        assert second is first
        with pytest.raises(RuntimeError, match="another KeyNotices listens"):
            KeyNotices(mine, count, heartbeat_s=0.05).start()
        until(lambda: first.confirmed_at > float("-inf"))
        before = count.value
        with other.begin() as conn:
            write_versions(conn, 1)
        until(lambda: first.heard == 1)
        time.sleep(0.3)  # a second listener's notification would have arrived by now
        assert count.value == before + 1

        first.close()  # one server closed: the other still hears
        with other.begin() as conn:
            write_versions(conn, 2)
        until(lambda: first.heard == 2)
        assert (count.value, count.listened) == (before + 2, True)
    finally:
        second.close()
    assert count.listened is False
    third = key_notices(mine)  # a server started after both closed listens anew
    try:
        assert third is not first
        until(lambda: third.confirmed_at > float("-inf"))
    finally:
        third.close()
    second.close()  # closed already: nothing happens
    assert count.listened is False
