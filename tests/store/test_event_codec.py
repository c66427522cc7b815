"""How events are written down: the fast canonical payload is byte for byte the json.dumps one
(stored digests must keep matching replays), instants round as PostgreSQL rounds them, and the
hand-encoded binary COPY stores what an INSERT of the same values stores."""

from __future__ import annotations

import random
import uuid
from collections.abc import Iterator

import pytest
from sqlalchemy import Connection, Engine, text

from gpufair.domain.ledger import EventKind, EventPod, LedgerEvent
from gpufair.store.event_codec import (
    COPY_EVENTS_SQL,
    copy_row,
    copy_stream,
    payload_digest,
    payload_json,
    reference_payload_json,
    stored_epoch_s,
    text_array,
)

AWKWARD = [
    "",
    "a",
    'quote"d',
    "back\\slash",
    "tab\there",
    "new\nline",
    "é",
    "名前",
    "\U0001f600",
    "\x01",
]


def random_event(rng: random.Random) -> LedgerEvent:
    def name() -> str:
        return rng.choice(AWKWARD) + rng.choice(["n1", "x", ""]) + rng.choice(AWKWARD)

    pods = tuple(
        EventPod(
            name(),
            tuple(rng.randrange(8) for _ in range(rng.randrange(4))),
            rng.choice([1.0, 0.5, 0.25, 1 / 3, rng.random(), 1]),
        )
        for _ in range(rng.randrange(3))
    )
    at = rng.choice([rng.uniform(1e9, 2e9), round(rng.uniform(1e9, 2e9)), 1.5e16, 1e-7, 0.0])
    return LedgerEvent(
        str(uuid.UUID(int=rng.getrandbits(128))),
        rng.choice(list(EventKind)),
        at,
        name(),
        pods,
        name(),
        rng.choice([0, 3, 8, -1]),
    )


def test_payload_is_the_json_dumps_payload_byte_for_byte() -> None:
    rng = random.Random(5)
    for _ in range(5000):
        event = random_event(rng)
        assert payload_json(event) == reference_payload_json(event), event


@pytest.mark.parametrize("odd", [float("nan"), float("inf"), -float("inf"), True, 7])
def test_payload_of_odd_numbers_falls_back_to_json_dumps(odd: float) -> None:
    event = LedgerEvent(str(uuid.uuid4()), EventKind.STARTED, odd, "w", (EventPod("n", (0,), odd),))
    assert payload_json(event) == reference_payload_json(event)
    event = LedgerEvent(str(uuid.uuid4()), EventKind.NODE_CAPACITY, 1.0, node="n", gpu_count=odd)  # type: ignore[arg-type]
    assert payload_json(event) == reference_payload_json(event)


def test_payload_and_digest_of_a_heartbeat() -> None:
    event = LedgerEvent("8d6c3c52-5a8f-4c3e-9b0a-3f1f2d8e7a11", EventKind.HEARTBEAT, 1.5, "w")
    payload = payload_json(event)
    assert payload == (
        '{"gpu_count":0,"kind":"heartbeat","node":"","occurred_at_s":1.5,"pods":[],'
        '"workload_uid":"w"}'
    )
    # SHA-256 of the text above: the digest stored with every event since the ledger began.
    assert payload_digest(payload.encode()) == (
        "edca0af0d26100e75f245737c4dc15552867272eab1b9200c06191b9708ba91e"
    )


@pytest.fixture
def conn(db: Engine) -> Iterator[Connection]:
    with db.connect() as connection:
        yield connection
        connection.rollback()


def test_instants_read_back_as_postgresql_rounds_them(conn: Connection) -> None:
    rng = random.Random(9)
    values = [rng.uniform(1.6e9, 1.8e9) for _ in range(3000)]
    values += [round(rng.uniform(1.6e9, 1.8e9), 6) + 5e-7 for _ in range(3000)]  # half-way
    values += [int(rng.uniform(1.6e9, 1.8e9)) + k / 1e6 + 0.5e-6 for k in range(1000)]
    rows = conn.execute(
        text("SELECT x, extract(epoch FROM to_timestamp(x))::float8 FROM unnest(:xs) AS x"),
        {"xs": values},
    ).all()
    assert [stored_epoch_s(x) for x, _ in rows] == [y for _, y in rows]


def test_copy_stores_what_an_insert_of_the_same_values_stores(conn: Connection) -> None:
    rng = random.Random(3)
    events = [random_event(rng)._replace(occurred_at_s=rng.uniform(1e9, 2e9)) for _ in range(300)]
    pg = conn.connection.driver_connection
    assert pg is not None
    rows = []
    for e in events:
        payload = payload_json(e).encode()
        rows.append(copy_row(e.event_id, e.workload_uid, e.kind, e.occurred_at_s, payload, "d"))
    with pg.cursor() as cur, cur.copy(COPY_EVENTS_SQL) as copy:
        copy.write(copy_stream(rows))
    got = conn.execute(
        text(
            "SELECT event_id::text, workload_uid, kind, occurred_at, payload, payload_digest "
            "FROM ledger_events ORDER BY event_id"
        )
    ).all()
    want = conn.execute(
        text(
            "SELECT r.id, NULLIF(r.uid, ''), r.kind, to_timestamp(r.at), r.payload::jsonb, 'd' "
            "FROM unnest(CAST(:ids AS text[]), CAST(:uids AS text[]), CAST(:kinds AS text[]), "
            "CAST(:ats AS float8[]), CAST(:payloads AS text[])) AS r(id, uid, kind, at, payload) "
            "ORDER BY r.id::uuid"
        ),
        {
            "ids": [e.event_id for e in events],
            "uids": [e.workload_uid for e in events],
            "kinds": [e.kind.value for e in events],
            "ats": [e.occurred_at_s for e in events],
            "payloads": [payload_json(e) for e in events],
        },
    ).all()
    assert len(got) == len(events)
    assert got == want


@pytest.mark.parametrize("plain", [False, True])
def test_text_array_round_trips_any_text(conn: Connection, plain: bool) -> None:
    """With a backslash or a double quote among the elements (each escaped), and without (the
    elements joined as they are)."""
    values = [*AWKWARD[:-1], "{a,b}", "NULL", " spaced ", "c,d", "'", "", "é"]
    if plain:
        values = [v for v in values if "\\" not in v and '"' not in v]
    got = conn.execute(
        text("SELECT unnest(CAST(:a AS text[]))"), {"a": text_array(iter(values))}
    ).scalars()
    assert list(got) == values
    assert text_array([]) == "{}" and text_array(["w-1"]) == '{"w-1"}'
