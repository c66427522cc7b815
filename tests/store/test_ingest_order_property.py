"""Order tolerance as a property, on PostgreSQL: random histories of a few workloads (starts on
various GPUs, repeated starts, heartbeats, stops, preemptions and failures, restarts after a
preemption, replays of an id, an id reused with another payload) delivered in time order one event
a batch, all in one shuffled batch, shuffled in batches written one after the other, and shuffled
in batches written together (`write_group`). Each delivery must end with the runs and states the
history makes (computed here by hand, from the history rather than from the events), every event
stored once and its replays duplicates, and of the two payloads under one id the one that came
first stored, the other refused.

Shuffled freely: a stop may arrive while only later starts of its workload are stored, and is
stored all the same, to pair with an earlier start when that arrives."""

from __future__ import annotations

import random
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest
from sqlalchemy import Connection, Engine, text

from gpufair.domain.ledger import EventKind, EventPod, LedgerEvent
from gpufair.domain.model import Workload
from gpufair.store import ingest_pipeline, workload_repo
from gpufair.store.ingest_pipeline import REUSED, EventStatus, PreparedBatch
from gpufair.store.known_workloads import KnownWorkloads
from tests.store.ingest_support import NOW, one_pool_connection

HISTORIES = 24
ENDS = (EventKind.STOPPED, EventKind.PREEMPTED, EventKind.FAILED)
Run = tuple[str, float, float | None, str | None, float]  # start id, start, end, how, GPUs


@pytest.fixture
def conn(db: Engine) -> Iterator[Connection]:
    yield from one_pool_connection(db, nodes=2)


@dataclass
class History:
    events: list[LedgerEvent] = field(default_factory=list)  # in time order, ids unique
    runs: dict[str, list[Run]] = field(default_factory=dict)
    states: dict[str, str] = field(default_factory=dict)
    reused: tuple[str, LedgerEvent] | None = None  # an id and the other payload sent under it


def _history(rng: random.Random) -> History:
    h = History()
    for w in range(rng.randint(1, 3)):
        uid, at, runs, state = f"w{w}", NOW - 7200 + rng.randint(0, 600), [], "pending"
        for _ in range(rng.randint(1, 3)):
            node, gpus = f"a{rng.randint(0, 1)}", rng.sample(range(8), rng.randint(1, 3))
            pods = (EventPod(node, tuple(sorted(gpus))),)
            start = LedgerEvent(str(uuid.uuid4()), EventKind.STARTED, at, uid, pods)
            h.events.append(start)
            for _ in range(rng.randint(0, 3)):  # heartbeats, and a start while running
                at += rng.randint(1, 300)
                kind = rng.choice([EventKind.HEARTBEAT] * 3 + [EventKind.STARTED])
                again = pods if kind is EventKind.STARTED else ()
                h.events.append(LedgerEvent(str(uuid.uuid4()), kind, at, uid, again))
            if rng.random() < 0.25:  # still running
                runs.append((start.event_id, start.occurred_at_s, None, None, len(gpus)))
                state = "running"
                break
            at += rng.randint(1, 300)
            end = rng.choice(ENDS)
            h.events.append(LedgerEvent(str(uuid.uuid4()), end, at, uid))
            runs.append((start.event_id, start.occurred_at_s, at, end.value, len(gpus)))
            state = "pending" if end is EventKind.PREEMPTED else "finished"
            if end is not EventKind.PREEMPTED:
                break
            at += rng.randint(1, 300)  # restarted after the preemption
        h.runs[uid], h.states[uid] = runs, state
    beats = [e for e in h.events if e.kind is EventKind.HEARTBEAT]
    if beats and rng.random() < 0.5:
        beat = rng.choice(beats)
        h.reused = (beat.event_id, beat._replace(occurred_at_s=beat.occurred_at_s + 0.5))
    return h


def _delivery(h: History, how: str, rng: random.Random) -> list[list[LedgerEvent]]:
    """The history's events (with replays, and the reused id's other payload) in batches."""
    events = list(h.events)
    extra = [rng.choice(events) for _ in range(rng.randint(0, 3))]
    if h.reused is not None:
        extra.append(h.reused[1])
    if how == "time":
        return [[e] for e in sorted(events, key=lambda e: e.occurred_at_s)] + [[e] for e in extra]
    events += extra
    rng.shuffle(events)
    if how == "one":
        return [events]
    cuts = sorted(rng.sample(range(1, len(events)), min(len(events) - 1, rng.randint(1, 5))))
    return [events[a:b] for a, b in zip([0, *cuts], [*cuts, len(events)], strict=True)]


def _renamed(batches: list[list[LedgerEvent]], tag: str) -> list[list[LedgerEvent]]:
    """The same delivery under ids and uids of its own (each delivery writes its own rows)."""

    def one(e: LedgerEvent) -> LedgerEvent:
        new = str(uuid.uuid5(uuid.NAMESPACE_OID, f"{tag}/{e.event_id}"))
        return e._replace(event_id=new, workload_uid=f"{tag}-{e.workload_uid}")

    return [[one(e) for e in b] for b in batches]


def _write(
    conn: Connection, batches: list[list[LedgerEvent]], group: bool
) -> list[tuple[LedgerEvent, EventStatus]]:
    """Each event sent and its outcome, in the order they were written."""
    prepared = [ingest_pipeline.prepare(b, NOW) for b in batches]
    sent = {id(p): b for p, b in zip(prepared, batches, strict=True)}
    alone: list[PreparedBatch] = prepared
    if group:  # those sharing no id with an earlier one together, as the API composes them
        together, alone, ids = [], [], set()
        for p in prepared:
            mine = {c.event_id for c in p.candidates}
            if ids.isdisjoint(mine):
                together.append(p)
                ids |= mine
            else:
                alone.append(p)
        assert ingest_pipeline.write_group(conn, together, known=KnownWorkloads())
        prepared = together + alone
    for p in alone:
        ingest_pipeline.write(conn, p, commit=True)
    return [
        (e, o.status)
        for p in prepared
        for e, o in zip(sent[id(p)], p.outcomes.as_list(), strict=True)
        if o.error in ("", REUSED)
    ]


def _stored(conn: Connection, tag: str) -> tuple[dict[str, list[Run]], dict[str, str]]:
    rows = conn.execute(
        text(
            "SELECT workload_uid, start_event_id::text, extract(epoch FROM started_at)::float8, "
            "extract(epoch FROM ended_at)::float8, end_kind, gpus FROM allocation_intervals "
            "WHERE workload_uid LIKE :tag ORDER BY started_at"
        ),
        {"tag": f"{tag}-%"},
    ).all()
    runs: dict[str, list[Run]] = {}
    for uid, *run in rows:
        runs.setdefault(uid.removeprefix(f"{tag}-"), []).append(tuple(run))  # type: ignore[arg-type]
    states = conn.execute(
        text("SELECT uid, state FROM workloads WHERE uid LIKE :tag"), {"tag": f"{tag}-%"}
    ).all()
    return runs, {u.removeprefix(f"{tag}-"): s for u, s in states}


@pytest.mark.parametrize("how", ["time", "one", "split", "group"])
def test_every_delivery_of_a_history_ends_as_the_history_says(conn: Connection, how: str) -> None:
    for seed in range(HISTORIES):
        rng = random.Random(seed)
        h = _history(rng)
        tag = f"{how}{seed}"
        workload_repo.submit(
            conn, [Workload(f"{tag}-{u}", "q", "p", 1, 1, NOW - 86400) for u in h.states]
        )
        batches = _renamed(_delivery(h, how, rng), tag)
        written = _write(conn, batches, group=how == "group")
        assert len(written) == sum(map(len, batches)), (seed, "an event was refused")
        statuses = [s for _, s in written]
        stored = {e.event_id for e, s in written if s is EventStatus.STORED}
        assert len(stored) == statuses.count(EventStatus.STORED) == len(h.events), seed
        for e, s in written:
            first = next(x for x, _ in written if x.event_id == e.event_id)
            assert (s is EventStatus.REJECTED) == (e is not first and e != first), seed
        runs, states = _stored(conn, tag)
        renamed = _renamed([h.events], tag)[0]
        ids = {new.event_id: old.event_id for old, new in zip(h.events, renamed, strict=True)}
        got = {u: [(ids[r[0]], *r[1:]) for r in rs] for u, rs in runs.items()}
        assert got == {u: rs for u, rs in h.runs.items() if rs}, seed
        assert states == h.states, seed
