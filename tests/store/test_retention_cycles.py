"""Retention of recorded scheduling cycles (`schedule_cycles`), on PostgreSQL.

Every Schedule call that is not a dry run stores its whole reply; nothing read them back past the
newest of each pool and those a stored request reply refers to, yet they were never deleted.
"""

from __future__ import annotations

import time

from sqlalchemy import Connection, Engine, text

from gpufair.store.idempotency import CYCLE_REFERENCE
from gpufair.store.retention_repo import Retention, apply_retention

DAY = 86400.0


def _cycle(conn: Connection, pool: str, at_s: float) -> int:
    return int(
        conn.execute(
            text(
                "INSERT INTO schedule_cycles (pool, decided_at, reply, binds, evicts, pending) "
                "VALUES (:pool, to_timestamp(:at), :reply, 0, 0, 0) RETURNING id"
            ),
            {"pool": pool, "at": at_s, "reply": b"\x00" * 1000},
        ).scalar_one()
    )


def test_cycles_age_out_but_each_pools_newest_and_those_replies_refer_to_stay(
    db: Engine,
) -> None:
    now_s = time.time()
    with db.connect() as conn:
        quiet = _cycle(conn, "q", now_s - 30 * DAY)  # pool q's newest: metrics and listings read it
        month = _cycle(conn, "p", now_s - 30 * DAY)
        week = _cycle(conn, "p", now_s - 8 * DAY)
        edge = _cycle(conn, "p", now_s - 7 * DAY - 1)  # a reply kept 7 days refers to it
        hour = _cycle(conn, "p", now_s - 3600)
        conn.execute(
            text(
                "INSERT INTO request_replies (request_id, method, request_digest, reply, "
                "created_at) VALUES ('r1', :method, 'd', :reply, to_timestamp(:at))"
            ),
            {"method": CYCLE_REFERENCE, "reply": str(edge).encode(), "at": now_s - 7 * DAY + 60},
        )
        conn.commit()
        deleted = apply_retention(conn, now_s, Retention(replies_days=7.0))  # commits
        left = conn.execute(text("SELECT id FROM schedule_cycles ORDER BY id")).scalars().all()
    assert deleted["cycles"] == 2
    assert left == sorted([quiet, edge, hour])
    assert month not in left and week not in left
