"""Batches written together (`write_group`) get the outcomes, runs and states they get written one
after the other, each in its own transaction; a group that meets an id stored already commits
nothing and leaves every outcome as `prepare` left it."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from sqlalchemy import Connection, Engine, text

from gpufair.domain.ledger import EventKind, EventPod, LedgerEvent
from gpufair.store import ingest_pipeline
from gpufair.store.ingest_pipeline import EventStatus, PreparedBatch
from gpufair.store.known_workloads import KnownWorkloads
from tests.store.ingest_support import (
    DUPLICATE,
    NOW,
    REJECTED,
    STORED,
    one_pool_connection,
)


@pytest.fixture
def conn(db: Engine) -> Iterator[Connection]:
    yield from one_pool_connection(db, nodes=1)


def event(kind: EventKind, uid: str, at: float, gpu: int | None = None) -> LedgerEvent:
    pods = (EventPod("a0", (gpu,)),) if gpu is not None else ()
    return LedgerEvent(str(uuid.uuid4()), kind, at, uid, pods)


def reports(x: str, y: str) -> list[list[LedgerEvent]]:
    """Four reports about workloads `x` and `y` whose outcomes depend on the ones before."""
    started, stopped, beat = EventKind.STARTED, EventKind.STOPPED, EventKind.HEARTBEAT
    repeated = event(beat, y, NOW - 5)
    return [
        # x starts; a heartbeat of a workload that does not exist is refused
        [event(started, x, NOW - 100, gpu=2 if x == "w0" else 4), event(beat, "nope", NOW - 90)],
        # a stop of x before that start: stored, pairing with nothing (an earlier start may
        # still come); y's heartbeat is stored
        [event(stopped, x, NOW - 150), event(beat, y, NOW - 80)],
        # x stops (pairing with the start of the first report), y starts
        [event(stopped, x, NOW - 50), event(started, y, NOW - 40, gpu=3 if x == "w0" else 5)],
        # x starts again; an id twice in one report is a duplicate the second time
        [event(started, x, NOW - 20, gpu=2 if x == "w0" else 4), repeated, repeated],
    ]


def outcomes(batches: list[PreparedBatch]) -> list[list[tuple[EventStatus, str]]]:
    return [[(o.status, o.error) for o in b.outcomes.as_list()] for b in batches]


def runs(conn: Connection, uid: str) -> list[tuple[float, float | None, str]]:
    rows = conn.execute(
        text(
            "SELECT extract(epoch FROM started_at)::float8 - :now, "
            "extract(epoch FROM ended_at)::float8 - :now, end_kind FROM allocation_intervals "
            "WHERE workload_uid = :uid ORDER BY started_at"
        ),
        {"uid": uid, "now": NOW},
    ).all()
    return [(round(s, 3), None if e is None else round(e, 3), k) for s, e, k in rows]


def states(conn: Connection, *uids: str) -> list[str]:
    return [
        conn.execute(text("SELECT state FROM workloads WHERE uid = :u"), {"u": u}).scalar_one()
        for u in uids
    ]


def test_a_group_gets_what_the_batches_get_one_after_the_other(conn: Connection) -> None:
    alone = [ingest_pipeline.prepare(r, NOW) for r in reports("w2", "w3")]
    for batch in alone:
        ingest_pipeline.write(conn, batch, commit=True)
        conn.commit()
    group = [ingest_pipeline.prepare(r, NOW) for r in reports("w0", "w1")]
    assert all(ingest_pipeline.groupable(b) for b in group)

    assert ingest_pipeline.write_group(conn, group, known=KnownWorkloads())

    assert outcomes(group) == outcomes(alone)
    assert [s for s, _ in outcomes(group)[0]] == [STORED, REJECTED]
    assert outcomes(group)[1] == [(STORED, ""), (STORED, "")]
    assert [s for s, _ in outcomes(group)[3]] == [STORED, STORED, DUPLICATE]
    assert runs(conn, "w0") == runs(conn, "w2") == [(-100, -50, "stopped"), (-20, None, None)]
    assert runs(conn, "w1") == runs(conn, "w3") == [(-40, None, None)]
    assert states(conn, "w0", "w1") == states(conn, "w2", "w3") == ["running", "running"]
    stored = conn.execute(
        text("SELECT count(*) FROM ledger_events WHERE workload_uid IN ('w0', 'w1')")
    ).scalar_one()
    assert stored == 7  # 2 starts and 2 stops of w0, a start and 2 heartbeats of w1
    # Written once each: the first run of w0 went in closed, not open and then replaced.
    ids = conn.execute(
        text(
            "SELECT max(id) - min(id) FROM allocation_intervals WHERE workload_uid IN ('w0', 'w1')"
        )
    )
    assert ids.scalar_one() == 2


def test_a_group_meeting_a_stored_id_commits_nothing_and_can_be_written_alone(
    conn: Connection,
) -> None:
    first = event(EventKind.STARTED, "w0", NOW - 100, gpu=1)
    ingest_pipeline.write(conn, ingest_pipeline.prepare([first], NOW), commit=True)
    conn.commit()
    replay = ingest_pipeline.prepare([first, event(EventKind.HEARTBEAT, "nope", NOW)], NOW)
    fresh = ingest_pipeline.prepare([event(EventKind.STARTED, "w1", NOW - 10, gpu=2)], NOW)

    assert not ingest_pipeline.write_group(conn, [fresh, replay], known=KnownWorkloads())

    # The group's validation refused the heartbeat; that is undone with the rest.
    assert [b.outcomes.statuses for b in (fresh, replay)] == [[None], [None, None]]
    assert replay.outcomes.errors == {}
    assert runs(conn, "w1") == []
    for batch in (fresh, replay):
        ingest_pipeline.write(conn, batch, commit=True)
        conn.commit()
    assert outcomes([fresh, replay]) == [
        [(STORED, "")],
        [(DUPLICATE, ""), (REJECTED, "unknown workload 'nope'")],
    ]
    assert runs(conn, "w1") == [(-10, None, None)]
