"""The ingest paths on PostgreSQL: COPY and its fallback give the outcomes a careful insert gives,
ids are one event in any UUID spelling, runs come out the same whichever batches their events
arrived in (to the microsecond PostgreSQL keeps), and intervals that do not change stay put."""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Iterator

import pytest
from sqlalchemy import Connection, Engine, text

from gpufair.domain.ledger import EventKind, EventPod, LedgerEvent
from gpufair.store import ingest_pipeline, locks
from gpufair.store.ingest_pipeline import EventStatus
from tests.store.ingest_support import (
    DUPLICATE,
    NOW,
    REJECTED,
    STORED,
    one_pool_connection,
)


@pytest.fixture
def conn(db: Engine) -> Iterator[Connection]:
    yield from one_pool_connection(db, nodes=2)


def start(uid: str, at: float, gpu: int = 0, event_id: str | None = None) -> LedgerEvent:
    return LedgerEvent(
        event_id or str(uuid.uuid4()), EventKind.STARTED, at, uid, (EventPod("a0", (gpu,)),)
    )


def stop(uid: str, at: float) -> LedgerEvent:
    return LedgerEvent(str(uuid.uuid4()), EventKind.STOPPED, at, uid)


def statuses(conn: Connection, events: list[LedgerEvent], **kwargs: bool) -> list[EventStatus]:
    batch = ingest_pipeline.prepare(events, NOW)
    return ingest_pipeline.write(conn, batch, **kwargs).final()


def intervals(conn: Connection, uid: str) -> list[tuple[object, ...]]:
    return [
        tuple(r)
        for r in conn.execute(
            text(
                "SELECT id, start_event_id::text, extract(epoch FROM started_at)::float8, "
                "extract(epoch FROM ended_at)::float8, pods FROM allocation_intervals "
                "WHERE workload_uid = :uid ORDER BY started_at"
            ),
            {"uid": uid},
        )
    ]


@pytest.mark.parametrize("careful", [False, True])
def test_replays_among_new_events_get_the_outcomes_of_a_careful_insert(
    conn: Connection, careful: bool
) -> None:
    first, second = start("w0", NOW - 600), start("w1", NOW - 600)
    assert statuses(conn, [first, second]) == [STORED, STORED]
    forged = start("w1", NOW - 500, gpu=3, event_id=second.event_id)
    batch = [stop("w0", NOW - 60), first, forged, start("w2", NOW - 30)]
    assert statuses(conn, batch, expect_duplicates=careful) == [
        STORED,
        DUPLICATE,
        REJECTED,
        STORED,
    ]
    assert [r[3] for r in intervals(conn, "w0")] == [pytest.approx(NOW - 60)]
    assert [r[1] for r in intervals(conn, "w1")] == [second.event_id]
    assert len(intervals(conn, "w2")) == 1
    count = conn.execute(text("SELECT count(*) FROM ledger_events")).scalar_one()
    assert count == 4


def test_an_id_another_transaction_stored_meanwhile_is_a_duplicate(
    conn: Connection, db: Engine
) -> None:
    racing = start("w0", NOW - 600)
    batch = ingest_pipeline.prepare([racing, start("w1", NOW - 600)], NOW)
    with db.connect() as other:
        assert [o.status for o in ingest_pipeline.ingest(other, [racing], NOW)] == [STORED]
        other.commit()
    assert ingest_pipeline.write(conn, batch).final() == [DUPLICATE, STORED]
    assert len(intervals(conn, "w0")) == len(intervals(conn, "w1")) == 1


def test_an_id_is_one_event_in_any_uuid_spelling(conn: Connection) -> None:
    canonical = str(uuid.uuid4())
    event = start("w0", NOW - 600, event_id=canonical.upper())
    assert statuses(conn, [event]) == [STORED]
    assert [r[1] for r in intervals(conn, "w0")] == [canonical]
    for spelling in (canonical, "{" + canonical + "}", "urn:uuid:" + canonical):
        assert statuses(conn, [start("w0", NOW - 600, event_id=spelling)]) == [DUPLICATE]
    outcome = ingest_pipeline.ingest(conn, [start("w0", NOW - 500, event_id=canonical)], NOW)
    assert outcome[0].error == "event_id reused with a different payload"


def test_runs_do_not_depend_on_how_events_were_batched(conn: Connection) -> None:
    # Two starts 0.24 microseconds apart: PostgreSQL keeps both at the same microsecond, so
    # they tie, and the smaller id opens the run, as when the runs are read back from the
    # table. Compared as received, the later one would have looked first.
    for n, order in enumerate(["together", "later first", "earlier first"]):
        uid = f"w{n}"
        later_id = f"0000000{n}-0000-4000-8000-000000000000"
        later = start(uid, NOW - 600 + 2**-22, gpu=1, event_id=later_id)
        earlier = start(uid, NOW - 600, gpu=2, event_id=f"fffffff{n}-0000-4000-8000-000000000000")
        batches = {
            "together": [[later, earlier]],
            "later first": [[later], [earlier]],
            "earlier first": [[earlier], [later]],
        }[order]
        for batch in batches:
            assert statuses(conn, batch) == [STORED] * len(batch)
        [(_, start_id, started, ended, pods)] = intervals(conn, uid)
        assert start_id == later_id, order
        assert pods == [{"node": "a0", "gpu_indices": [1], "gpu_fraction": 1.0}]
        assert started == NOW - 600 and ended is None


def test_intervals_that_do_not_change_are_not_rewritten(conn: Connection) -> None:
    assert statuses(conn, [start("w0", NOW - 600)]) == [STORED]
    [before] = intervals(conn, "w0")
    heartbeat = LedgerEvent(str(uuid.uuid4()), EventKind.HEARTBEAT, NOW - 300, "w0")
    assert statuses(conn, [heartbeat, start("w0", NOW - 200, gpu=5)]) == [STORED, STORED]
    assert intervals(conn, "w0") == [before]  # a start while running changes nothing
    assert statuses(conn, [stop("w0", NOW - 100)]) == [STORED]
    [after] = intervals(conn, "w0")
    assert after[1:3] == before[1:3] and after[3] == pytest.approx(NOW - 100)
    state = conn.execute(text("SELECT state FROM workloads WHERE uid = 'w0'")).scalar_one()
    assert state == "finished"


def test_a_heartbeat_writes_its_event_and_nothing_else(conn: Connection) -> None:
    assert statuses(conn, [start("w0", NOW - 600)]) == [STORED]
    conn.commit()

    def versions() -> tuple[object, ...]:
        """Row versions of the workload and its interval: xmin changes with every write."""
        return tuple(
            conn.execute(
                text(
                    "SELECT (SELECT xmin::text FROM workloads WHERE uid = 'w0'), "
                    "(SELECT array_agg(xmin::text) FROM allocation_intervals "
                    "WHERE workload_uid = 'w0')"
                )
            ).one()
        )

    before = versions()
    beats = [LedgerEvent(str(uuid.uuid4()), EventKind.HEARTBEAT, NOW - s, "w0") for s in (300, 200)]
    assert statuses(conn, beats) == [STORED, STORED]
    conn.commit()
    assert versions() == before
    stored = conn.execute(
        text("SELECT count(*) FROM ledger_events WHERE workload_uid = 'w0' AND kind = 'heartbeat'")
    ).scalar_one()
    assert stored == 2


def test_concurrent_batches_of_one_workload_see_each_other(conn: Connection, db: Engine) -> None:
    assert statuses(conn, [start("w0", NOW - 600)]) == [STORED]  # holds w0 until it commits
    outcome: list[EventStatus] = []

    def other_stream() -> None:
        with db.connect() as other:
            outcome.extend(statuses(other, [stop("w0", NOW - 60)]))
            other.commit()

    stopping = threading.Thread(target=other_stream)
    stopping.start()
    time.sleep(0.5)
    assert stopping.is_alive()  # waiting for the start's transaction
    conn.commit()
    stopping.join(timeout=20)
    assert outcome == [STORED]
    [(_, _, started, ended, _)] = intervals(conn, "w0")
    assert (started, ended) == (NOW - 600, pytest.approx(NOW - 60))


def _race(db: Engine, batches: dict[str, list[LedgerEvent]]) -> dict[str, object]:
    """Write each batch from a thread of its own, all at once; per batch, its outcomes by
    event id, or what it raised."""
    results: dict[str, object] = {}
    ready = threading.Barrier(len(batches))

    def report(name: str, batch: list[LedgerEvent]) -> None:
        try:
            with db.connect() as own:
                prepared = ingest_pipeline.prepare(batch, NOW)
                ready.wait()
                outcomes = ingest_pipeline.write(own, prepared, commit=True)
                own.commit()
                results[name] = dict(zip(outcomes.event_ids, outcomes.final(), strict=True))
        except Exception as error:
            results[name] = error

    threads = [threading.Thread(target=report, args=item) for item in batches.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    return results


def test_concurrent_batches_of_the_same_new_events_in_opposite_orders(
    conn: Connection, db: Engine
) -> None:
    """Two reporters sending the same events at once, in opposite orders: each event is stored
    once, the other copy is a duplicate, and neither batch fails (inserting in one order, each
    waits for the other instead of deadlocking; before, the first attempt deadlocked)."""
    for attempt in range(5):
        events = [
            LedgerEvent(str(uuid.uuid4()), EventKind.HEARTBEAT, NOW - 3000 + i * 0.001, "w0")
            for i in range(3000)
        ]
        results = _race(db, {"forward": events, "backward": events[::-1]})
        forward, backward = results["forward"], results["backward"]
        assert isinstance(forward, dict), f"attempt {attempt}: {forward!r}"
        assert isinstance(backward, dict), f"attempt {attempt}: {backward!r}"
        assert all(
            {forward[e.event_id], backward[e.event_id]} == {STORED, DUPLICATE} for e in events
        )
        stored = conn.execute(
            text("SELECT count(*) FROM ledger_events WHERE event_id = ANY(:ids)"),
            {"ids": [e.event_id for e in events]},
        ).scalar_one()
        conn.commit()
        assert stored == 3000


class _Hooks(ingest_pipeline.Overlap):
    """Records the order the hooks are called in."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def reading(self) -> None:
        self.calls.append("reading")

    def copying(self) -> None:
        self.calls.append("copying")

    def copied(self) -> None:
        self.calls.append("copied")

    def writing(self) -> None:
        self.calls.append("writing")

    def committing(self) -> None:
        self.calls.append("committing")


@pytest.mark.parametrize("opens_a_run", [True, False])
def test_the_caller_works_in_every_wait_and_the_batch_is_committed(
    conn: Connection, db: Engine, opens_a_run: bool
) -> None:
    """A batch that opens a run waits for the overlap check before its commit; the caller's
    `committing` runs during that commit, as it does during the commit that travels with the
    writes of other batches. Either way, once `write` returns the batch is committed."""
    events = [start("w0", NOW - 600), start("w1", NOW - 600)]
    if not opens_a_run:
        events += [stop("w0", NOW - 60), stop("w1", NOW - 60)]
    hooks = _Hooks()
    outcomes = ingest_pipeline.write(
        conn, ingest_pipeline.prepare(events, NOW), overlap=hooks, commit=True
    )
    assert outcomes.final() == [STORED] * len(events)
    assert hooks.calls == ["reading", "copying", "copied", "writing", "committing"]
    with db.connect() as other:
        stored = other.execute(text("SELECT count(*) FROM ledger_events")).scalar_one()
        open_runs = other.execute(
            text("SELECT count(*) FROM allocation_intervals WHERE ended_at IS NULL")
        ).scalar_one()
    assert stored == len(events)
    assert open_runs == (2 if opens_a_run else 0)


def _bind(conn: Connection, uid: str, gpus: list[int]) -> None:
    pods = [{"pod_index": 0, "node": "a0", "gpu_indices": gpus, "gpu_fraction": 1.0}]
    conn.execute(
        text(
            "UPDATE workloads SET state = 'bound', binding = CAST(:b AS jsonb), "
            "bound_at = now(), bind_expires_at = now() + interval '1 hour' WHERE uid = :uid"
        ),
        {"uid": uid, "b": json.dumps({"gpu_type": "a100", "cycle_id": 1, "pods": pods})},
    )


def test_a_start_within_its_own_binding_skips_the_overlap_check(
    conn: Connection, db: Engine
) -> None:
    """A cycle holds the check lock (exclusive) until it commits. A start within its
    workload's own bound decision adds no GPU holder, commits without the check and so without
    waiting for the cycle; a start of an unbound workload, or of a bound one on other GPUs,
    waits for the check lock, as before."""
    _bind(conn, "w0", [0, 1])
    _bind(conn, "w1", [4])
    conn.commit()
    done: dict[str, float] = {}

    def report(name: str, event: LedgerEvent) -> None:
        with db.connect() as own:
            began = time.monotonic()
            outcome = ingest_pipeline.write(own, ingest_pipeline.prepare([event], NOW), commit=True)
            own.commit()
            assert outcome.final() == [STORED]
            done[name] = time.monotonic() - began

    with db.connect() as cycle:
        cycle.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": locks.BIND_CHECK})
        starts = {
            "within": start("w0", NOW - 60, gpu=1),
            "elsewhere": start("w1", NOW - 60, gpu=5),
            "unbound": start("w2", NOW - 60, gpu=6),
        }
        threads = [threading.Thread(target=report, args=item) for item in starts.items()]
        for t in threads:
            t.start()
        threads[0].join(timeout=20)
        time.sleep(0.5)
        assert set(done) == {"within"}  # the other two wait for the check lock
        cycle.commit()
    for t in threads[1:]:
        t.join(timeout=20)
    assert set(done) == {"within", "elsewhere", "unbound"}
    states = dict(conn.execute(text("SELECT uid, state FROM workloads")).all())
    assert states == {"w0": "running", "w1": "running", "w2": "running", "w3": "pending"}
