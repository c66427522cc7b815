"""The plain heartbeat's short path through `Preparation.add` (`event_codec.plain_heartbeat`)
gives every event the candidate and outcome the general path gives it: the same payload bytes,
digest and COPY row, the same duplicates and rejections; and what it stores reads back as the
general functions say."""

from __future__ import annotations

import hashlib
import json
import math
import random
import uuid
from collections.abc import Iterator, Sequence

import pytest
from sqlalchemy import Connection, Engine, text

from gpufair.domain.ledger import (
    CANONICAL_UUID,
    MAX_AGE_S,
    MAX_FUTURE_SKEW_S,
    RUN_KINDS,
    EventKind,
    EventPod,
    LedgerEvent,
    canonical_event_id,
    static_problem,
    static_problem_of_uuid,
)
from gpufair.store import event_codec, ingest_context, ingest_pipeline, ingest_validate
from gpufair.store.event_codec import (
    canonical_ids_bytes,
    copy_row,
    payload_digest,
    payload_json,
    plain_heartbeat,
    stored_epoch_s,
)
from gpufair.store.ingest_pipeline import REUSED, EventStatus
from tests.store.ingest_support import (
    DUPLICATE,
    NOW,
    REJECTED,
    STORED,
    one_pool_connection,
)

HEARTBEAT = EventKind.HEARTBEAT
PRINTABLE_UIDS = ["w", "", 'quote"d', "back\\slash", "é", "名前", "\U0001f600", "w" * 253]


def beat(at: float, uid: str = "w0", event_id: str | None = None, **more: object) -> LedgerEvent:
    return LedgerEvent(event_id or str(uuid.uuid4()), HEARTBEAT, at, uid, **more)  # type: ignore[arg-type]


def test_plain_heartbeat_is_payload_digest_and_row_of_the_general_functions() -> None:
    rng = random.Random(17)
    for _ in range(3000):
        uid = rng.choice(PRINTABLE_UIDS) + rng.choice(PRINTABLE_UIDS)[:100]
        at = rng.choice([rng.uniform(1e9, 2e9), float(round(rng.uniform(1e9, 2e9))), 1e-7, 0.5])
        event = beat(at, uid, str(uuid.UUID(int=rng.getrandbits(128))))
        payload = payload_json(event).encode()
        digest = payload_digest(payload)
        row = copy_row(event.event_id, uid, HEARTBEAT, at, payload, digest)
        raw = uuid.UUID(event.event_id).bytes
        assert plain_heartbeat(raw, at, uid) == (payload, digest, row), event
    # The digest every stored heartbeat of `w` at 1.5 s has had since the ledger began.
    payload, digest, _ = plain_heartbeat(
        uuid.UUID("8d6c3c52-5a8f-4c3e-9b0a-3f1f2d8e7a11").bytes, 1.5, "w"
    )
    assert payload == (
        b'{"gpu_count":0,"kind":"heartbeat","node":"","occurred_at_s":1.5,"pods":[],'
        b'"workload_uid":"w"}'
    )
    assert digest == "edca0af0d26100e75f245737c4dc15552867272eab1b9200c06191b9708ba91e"


def test_plain_heartbeat_parts_kept_per_uid_start_over_past_the_limit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With room for 2 uids, 5 uids reported twice in turn: every heartbeat is still the
    general functions' payload, digest and row, and the cache never holds more than 2."""
    monkeypatch.setattr(event_codec, "HEARTBEAT_PARTS_LIMIT", 2)
    monkeypatch.setattr(event_codec, "_HEARTBEAT_PARTS", {})
    for k in range(10):
        uid, at = f"w{k % 5}", 1.7e9 + k / 3
        event = beat(at, uid)
        payload = payload_json(event).encode()
        digest = payload_digest(payload)
        row = copy_row(event.event_id, uid, HEARTBEAT, at, payload, digest)
        raw = uuid.UUID(event.event_id).bytes
        assert plain_heartbeat(raw, at, uid) == (payload, digest, row), event
        assert 1 <= len(event_codec._HEARTBEAT_PARTS) <= 2


def test_plain_heartbeats_at_one_instant_share_its_parts_and_no_other_does(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A period's heartbeats all at its start, as the Slurm bridge stamps them, with the
    instant's next and previous floats, one equal value reached by other arithmetic, and an
    earlier instant coming back between them: every heartbeat is still the general
    functions' payload, digest and row, and the instant kept is the last one's."""
    monkeypatch.setattr(event_codec, "_LAST_INSTANT", [(math.nan, "", 0, b"", None)])
    start = 1_764_900_000.0 + 60.0 * 7 + 0.123456
    near = [math.nextafter(start, math.inf), math.nextafter(start, 0.0)]
    same = (1_764_900_000.0 + 0.123456) + 60.0 * 7  # other arithmetic
    instants = [start] * 5 + near + [same, 1.7e9, start, 1.7e9, 1.7e9, 0.5, start]
    for k, at in enumerate(instants):
        uid = f"w{k % 3}"
        event = beat(at, uid)
        payload = payload_json(event).encode()
        digest = payload_digest(payload)
        row = copy_row(event.event_id, uid, HEARTBEAT, at, payload, digest)
        raw = uuid.UUID(event.event_id).bytes
        assert plain_heartbeat(raw, at, uid) == (payload, digest, row), (k, at)
        kept, at_text, *_ = event_codec._LAST_INSTANT[0]
        assert kept == at and at_text == repr(at)
    assert len({repr(at) for at in [start, *near]}) == 3  # neighbours, three texts
    assert same == start


def test_canonical_ids_bytes_is_the_regular_expression_id_by_id() -> None:
    """A list's ids as bytes in one pass exactly when `CANONICAL_UUID` matches each of them:
    2,000 random ids, then each of 13 near misses in their midst (upper case, braces, a hyphen
    moved, a space, a non-ASCII digit, ids of 35 and 37 characters whose concatenation has
    every hyphen in place, ...)."""
    rng = random.Random(4)
    ids = [str(uuid.UUID(int=rng.getrandbits(128))) for _ in range(2000)]
    assert canonical_ids_bytes(ids) == b"".join(uuid.UUID(i).bytes for i in ids)
    assert canonical_ids_bytes([]) is None
    good = ids[7]
    near_misses = [
        [good.upper()],
        [good[:35] + "A"],
        ["{" + good[:34] + "}"],
        [good[:8] + good[9] + "-" + good[10:]],  # a hyphen moved by one
        [good[:5] + " " + good[6:]],
        [good[:5] + "\u0661" + good[6:]],  # ARABIC-INDIC DIGIT ONE
        [good[:5] + "g" + good[6:]],
        [good + "\n"],
        [good.replace("-", "")],
        [good[:35], "a" + good[:35]],  # 35 + 37 characters: the hyphens of two ids in place
        [good[:35] + "-", good[1:]],
        [good[:-1] + "+"],
        ["some-id"],
    ]
    for bad in near_misses:
        mixed = ids[:1000] + bad + ids[1000:]
        assert not all(CANONICAL_UUID.match(i) for i in mixed)
        assert canonical_ids_bytes(mixed) is None, bad
        assert canonical_ids_bytes(bad) is None, bad


def test_prepare_of_canonical_ids_in_parts_is_the_general_path() -> None:
    """Every id canonical (the ids checked at once), given in three parts as a stream
    prepares a message: 5,000 heartbeats of 40 workloads, one in 100 a replay, one in 100 a
    reused id, one in 50 late, with a conversion error and a start and stop among them."""
    rng = random.Random(5)
    items: list[LedgerEvent | tuple[str, str]] = []
    for k in range(5000):
        if k % 100 == 1:
            items.append(items[k - 1])  # a replay
        elif k % 100 == 2 and isinstance(prior := items[k - 2], LedgerEvent):
            items.append(prior._replace(occurred_at_s=NOW - 3))  # its id, another payload
        else:
            at = NOW - MAX_AGE_S - 1 if k % 50 == 3 else NOW - rng.uniform(0, 600)
            items.append(beat(at, f"w{k % 40}", str(uuid.UUID(int=rng.getrandbits(128)))))
    items[10] = (str(uuid.uuid4()), "unknown event kind 9")
    items[20] = LedgerEvent(
        str(uuid.uuid4()), EventKind.STARTED, NOW - 5, "w1", (EventPod("a0", (0,)),)
    )
    items[30] = LedgerEvent(str(uuid.uuid4()), EventKind.STOPPED, NOW - 4, "w1")
    statuses, errors, candidates = reference(items, NOW)
    preparation = ingest_pipeline.Preparation(NOW)
    for part in (items[:1234], items[1234:4000], items[4000:]):
        preparation.add(part)
    batch = preparation.batch()
    assert batch.outcomes.event_ids == [i[0] for i in items]
    assert batch.outcomes.statuses == statuses
    assert batch.outcomes.errors == errors
    assert [tuple(c) for c in batch.candidates] == candidates
    assert len(candidates) == 5000 - 50 - 50 - 100 - 1
    assert statuses.count(EventStatus.DUPLICATE) == 50
    assert list(errors.values()).count(REUSED) == 50


def reference(
    items: Sequence[LedgerEvent | tuple[str, str]], now_s: float
) -> tuple[list[EventStatus | None], dict[int, str], list[tuple[object, ...]]]:
    """`prepare` as the general path makes it, event by event from the domain's checks and the
    codec's general functions: statuses, errors by position, candidates."""
    statuses: list[EventStatus | None] = []
    errors: dict[int, str] = {}
    candidates: list[tuple[object, ...]] = []
    first: dict[str, str] = {}
    for i, item in enumerate(items):
        statuses.append(None)
        if not isinstance(item, LedgerEvent):
            statuses[i], errors[i] = EventStatus.REJECTED, item[1]
            continue
        payload = payload_json(item).encode()
        digest = hashlib.sha256(payload).hexdigest()
        key = canonical_event_id(item.event_id)
        name = key or item.event_id
        if name in first:
            if first[name] == digest:
                statuses[i] = EventStatus.DUPLICATE
            else:
                statuses[i], errors[i] = EventStatus.REJECTED, REUSED
            continue
        first[name] = digest
        problem = static_problem(item, now_s=now_s) if key is None else None
        problem = problem or (None if key is None else static_problem_of_uuid(item, now_s=now_s))
        if key is None or problem:
            statuses[i], errors[i] = EventStatus.REJECTED, problem or ""
            continue
        at, uid = item.occurred_at_s, item.workload_uid
        read_back = (
            LedgerEvent(key, item.kind, stored_epoch_s(at), uid, item.pods)
            if item.kind in RUN_KINDS
            else None
        )
        row = copy_row(key, uid, item.kind, at, payload, digest)
        candidates.append((i, item, key, payload, digest, row, read_back))
    return statuses, errors, candidates


def test_prepare_gives_each_heartbeat_the_general_candidate_and_outcome() -> None:
    first = beat(NOW - 10)
    oldest, latest = NOW - MAX_AGE_S, NOW + MAX_FUTURE_SKEW_S
    items: list[LedgerEvent | tuple[str, str]] = [
        first,
        first._replace(event_id=first.event_id.upper()),  # the same event, spelled otherwise
        first._replace(occurred_at_s=NOW - 9),  # its id with another payload
        first,  # a plain replay
        beat(latest),  # the last instant accepted
        beat(latest + 1e-3),  # past it: refused
        beat(oldest),  # the oldest accepted
        beat(oldest - 1e-3),  # older: refused
        beat(0.0),
        beat(-5.0),
        beat(float("nan")),
        beat(float("inf")),
        beat(NOW - 1, "w" * 253),
        beat(NOW - 1, "w" * 254),  # too long: refused
        beat(NOW - 1, ""),  # stored here, refused once the workloads are read
        beat(NOW - 1, "tab\there"),  # a control character: refused
        beat(NOW - 1, "no\xa0break"),  # not printable, yet no control character
        beat(NOW - 1, "名前"),
        beat(NOW - 1, node="a0"),
        beat(NOW - 1, gpu_count=3),
        beat(NOW - 1, pods=(EventPod("a0", (1,)),)),
        beat(NOW - 1, event_id="not-a-uuid"),
        beat(float(round(NOW - 1))),
        ("some-id", "unknown event kind 9"),
        LedgerEvent(str(uuid.uuid4()), EventKind.STARTED, NOW - 5, "w1", (EventPod("a0", (0,)),)),
        LedgerEvent(str(uuid.uuid4()), EventKind.STOPPED, NOW - 4, "w1"),
    ]
    statuses, errors, candidates = reference(items, NOW)
    batch = ingest_pipeline.prepare(items, NOW)
    assert batch.outcomes.statuses == statuses
    assert batch.outcomes.errors == errors
    assert [tuple(c) for c in batch.candidates] == candidates
    # What the corpus holds, as a user would count it: 11 candidates; one duplicate (the same id
    # in upper case), one replay, one reuse; the rest refused before any database (a heartbeat
    # naming a node or a GPU count among them: those fields are a node report's).
    assert len(candidates) == 11
    assert statuses.count(EventStatus.DUPLICATE) == 2
    assert list(errors.values()).count(REUSED) == 1
    assert len(errors) == 13
    assert (
        list(errors.values()).count(
            "node and gpu_count belong on node_capacity events, not heartbeat"
        )
        == 2
    )


@pytest.fixture
def conn(db: Engine) -> Iterator[Connection]:
    yield from one_pool_connection(db, nodes=2)


def stored_rows(conn: Connection) -> dict[str, tuple[object, ...]]:
    return {
        r[0]: tuple(r[1:])
        for r in conn.execute(
            text(
                "SELECT event_id::text, workload_uid, kind, extract(epoch FROM occurred_at)::float8,"
                " payload::text, payload_digest FROM ledger_events WHERE kind = 'heartbeat'"
            )
        )
    }


@pytest.mark.parametrize("careful", [False, True])
def test_heartbeats_store_the_general_rows_with_the_general_outcomes(
    conn: Connection, careful: bool
) -> None:
    """Heartbeats of a running workload (w0), of one whose run stopped (w1), of one never
    submitted, duplicates in the batch and of a batch before, a refused one: by COPY and by the
    careful insert a replay takes."""
    run = [
        LedgerEvent(str(uuid.uuid4()), EventKind.STARTED, NOW - 900, "w0", (EventPod("a0", (0,)),)),
        LedgerEvent(str(uuid.uuid4()), EventKind.STARTED, NOW - 900, "w1", (EventPod("a0", (1,)),)),
        LedgerEvent(str(uuid.uuid4()), EventKind.STOPPED, NOW - 800, "w1"),
    ]
    assert ingest_pipeline.write(conn, ingest_pipeline.prepare(run, NOW)).final() == [STORED] * 3
    earlier = beat(NOW - 700, "w0")
    assert ingest_pipeline.write(conn, ingest_pipeline.prepare([earlier], NOW)).final() == [STORED]
    beats = [
        beat(NOW - 600.123456789, "w0"),
        beat(NOW - 600, "w1"),
        beat(NOW - 600, "never-submitted"),
        beat(NOW + 3600, "w0"),
        beat(NOW - 500, "w0", "A" * 8 + "-aaaa-4aaa-8aaa-" + "a" * 12),
    ]
    batch = [*beats, beats[0], beats[4]._replace(event_id=beats[4].event_id.lower())]
    outcomes = ingest_pipeline.write(
        conn, ingest_pipeline.prepare(batch, NOW), expect_duplicates=careful
    )
    assert outcomes.final() == [STORED, STORED, REJECTED, REJECTED, STORED, DUPLICATE, DUPLICATE]
    assert outcomes.errors == {
        2: "unknown workload 'never-submitted'",
        3: "occurred_at is 3600 s in the future (more than 300 s of clock skew)",
    }
    rows = stored_rows(conn)
    assert len(rows) == 4
    for event in [earlier, beats[0], beats[1], beats[4]]:
        key = event.event_id.lower()
        payload = payload_json(event)
        wid, kind, at, stored_payload, digest = rows[key]
        assert (wid, kind, at) == (
            event.workload_uid,
            "heartbeat",
            stored_epoch_s(event.occurred_at_s),
        )
        assert json.loads(str(stored_payload)) == json.loads(payload)
        assert digest == payload_digest(payload.encode())
    # A replay of the earlier batch's heartbeat is a duplicate, as in the general path.
    again = ingest_pipeline.write(conn, ingest_pipeline.prepare([earlier], NOW))
    assert again.final() == [DUPLICATE]


def _context(workloads: Sequence[str], missing: Sequence[str]) -> ingest_context._Context:
    from gpufair.domain.ledger import WorkloadRef, WorkloadState

    return ingest_context._Context(
        {u: (WorkloadRef(u, "q", "p"), WorkloadState.RUNNING) for u in workloads},
        set(),
        set(),
        {},
        set(missing),
        {},
        {},
        [],
        {},
        set(),
        set(),
        {},
    )


@pytest.mark.parametrize(
    ("workloads", "missing", "uids"),
    [
        ([], [], ["w0", "w2", "w4"]),  # every plain heartbeat passes by its workload's set
        ([], [], ["w0", "w2", ""]),  # but those of no workload
        (["w1"], [], ["w0", "w1", "w4"]),  # w1 has a run event: its heartbeats one by one
        ([], ["w2", "gone"], ["w0", "w2", "gone"]),  # of workloads that do not exist
        (["w1", "w3"], ["w2"], ["w0", "w1", "w2", "w3", "w4", "gone", ""]),
    ],
)
def test_validate_by_the_plain_heartbeats_workloads_is_each_event_judged_alone(
    workloads: list[str], missing: list[str], uids: list[str]
) -> None:
    """`_validate`, which looks at the plain heartbeats' workloads as a set, keeps and refuses
    exactly what judging every candidate one by one (`_validate_each`) does, in order: plain
    heartbeats of workloads that exist, have a run event in the batch, do not exist, and of no
    workload; heartbeats with pods; run events (a stop without a node refused as unknown
    workload, a start on a node not configured)."""
    rng = random.Random(7)
    items: list[LedgerEvent] = []
    for k in range(300):
        uid = rng.choice(uids)
        items.append(beat(NOW - rng.uniform(1, 500), uid))
        if k % 50 == 7:
            pod = (EventPod("nowhere", (0,)),)
            items.append(beat(NOW - 5, "w0", pods=pod))
            items.append(LedgerEvent(str(uuid.uuid4()), EventKind.STOPPED, NOW - 4, uid or "w4"))
            items.append(LedgerEvent(str(uuid.uuid4()), EventKind.STARTED, NOW - 3, "w1", pod))
    batch = ingest_pipeline.prepare(items, NOW)
    plain = [c for c in batch.candidates if c not in (batch.others or [])]
    assert batch.plain_uids == {c.event.workload_uid for c in plain}
    assert all(c.event.kind is HEARTBEAT and not c.event.pods for c in plain)
    assert batch.others == [c for c in batch.candidates if c not in plain]

    alone = ingest_pipeline.prepare(items, NOW)
    alone.plain_uids, alone.others = set(), None  # as a batch made without `Preparation`
    ctx = _context(workloads, missing)
    expected = ingest_validate._validate_each(alone, ctx, alone.candidates)
    assert ingest_validate._validate(alone, ctx) == expected
    kept = ingest_validate._validate(batch, _context(workloads, missing))
    assert [tuple(c) for c in kept] == [tuple(c) for c in expected]
    assert batch.outcomes.statuses == alone.outcomes.statuses
    assert batch.outcomes.errors == alone.outcomes.errors
    assert 0 < len(kept) < len(batch.candidates)
