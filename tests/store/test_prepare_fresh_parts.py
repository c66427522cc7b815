"""A message prepared in parts as a stream prepares it (`Preparation.add`): a part of canonical
ids that repeats none of the batch's skips the look-up of its plain heartbeats among the ids
seen, and owes them to it; a later part that could repeat one is judged against all of them.
Every item gets the outcome and candidate of the general path, event by event
(`test_plain_heartbeats.reference`). And a plain heartbeat's row at an instant it shares with
heartbeats of uids of other lengths is the general function's row."""

from __future__ import annotations

import math
import random
import uuid

import pytest

from gpufair.domain.ledger import EventKind, EventPod, LedgerEvent
from gpufair.store import event_codec, ingest_pipeline
from gpufair.store.event_codec import copy_row, payload_digest, payload_json, plain_heartbeat
from gpufair.store.ingest_pipeline import REUSED, EventStatus
from tests.store.ingest_support import NOW
from tests.store.test_plain_heartbeats import beat, reference

Item = LedgerEvent | tuple[str, str]


def _period(rng: random.Random, at: float, uids: range) -> list[Item]:
    """One heartbeat per workload of `uids` at `at`, with a stop and a start among them."""
    items: list[Item] = [beat(at, f"w{u}", str(uuid.UUID(int=rng.getrandbits(128)))) for u in uids]
    items[3] = LedgerEvent(str(uuid.uuid4()), EventKind.STOPPED, at, "w3")
    items[4] = LedgerEvent(str(uuid.uuid4()), EventKind.STARTED, at, "w3x", (EventPod("a0", (0,)),))
    return items


def _prepared(parts: list[list[Item]]) -> ingest_pipeline.PreparedBatch:
    preparation = ingest_pipeline.Preparation(NOW)
    for part in parts:
        preparation.add(part)
    return preparation.batch()


def _check(parts: list[list[Item]]) -> ingest_pipeline.PreparedBatch:
    items = [item for part in parts for item in part]
    statuses, errors, candidates = reference(items, NOW)
    batch = _prepared(parts)
    assert batch.outcomes.event_ids == [i[0] for i in items]
    assert batch.outcomes.statuses == statuses
    assert batch.outcomes.errors == errors
    assert [tuple(c) for c in batch.candidates] == candidates
    return batch


def test_parts_that_repeat_earlier_parts_ids_find_them() -> None:
    """Four parts of 300 events at one instant: the second replays 20 plain heartbeats of the
    first (duplicates), reuses the ids of 10 with another payload (refused) and of the first
    part's stop and start; the third is new; the fourth replays 5 of the third and 5 of the
    first, and repeats one of its own."""
    rng = random.Random(11)
    at = NOW - 30
    first = _period(rng, at, range(0, 300))
    second = _period(rng, at, range(300, 600))
    second[10:30] = first[10:30]
    second[40:50] = [e._replace(occurred_at_s=at - 1) for e in first[40:50]]  # type: ignore[union-attr]
    second[60:62] = first[3:5]
    third = _period(rng, at + 30, range(600, 900))
    fourth = _period(rng, at + 30, range(900, 1200))
    fourth[100:105] = third[100:105]
    fourth[110:115] = first[110:115]
    fourth[120] = fourth[121]
    batch = _check([first, second, third, fourth])
    statuses = batch.outcomes.statuses
    assert statuses.count(EventStatus.DUPLICATE) == 20 + 2 + 5 + 5 + 1
    assert list(batch.outcomes.errors.values()).count(REUSED) == 10
    assert len(batch.candidates) == 1200 - 33 - 10
    assert len(batch.plain_uids) == len(batch.candidates) - 8  # 4 stops and 4 starts


def test_a_part_replaying_only_plain_heartbeats_of_the_part_before() -> None:
    """Two parts taken whole, the second replaying three plain heartbeats of the first and
    reusing the id of a fourth: the replays are duplicates, the reuse refused."""
    rng = random.Random(10)
    first = _period(rng, NOW - 15, range(0, 400))
    second = _period(rng, NOW - 15, range(400, 800))
    second[100:103] = first[200:203]
    second[150] = first[250]._replace(workload_uid="w9")  # type: ignore[union-attr]
    batch = _check([first, second])
    assert batch.outcomes.statuses.count(EventStatus.DUPLICATE) == 3
    assert batch.outcomes.errors == {550: REUSED}


def test_a_part_repeating_an_id_of_its_own_and_parts_after_it() -> None:
    """A first part that repeats an id within itself (judged item by item), then new parts, then
    one replaying the second part: each replay is found, whichever way its part was taken."""
    rng = random.Random(12)
    at = NOW - 60
    first = _period(rng, at, range(0, 200))
    first[50] = first[49]
    second = _period(rng, at, range(200, 400))
    third = _period(rng, at, range(400, 600))
    third[7:9] = second[7:9]
    third[20] = first[20]
    batch = _check([first, second, third])
    assert batch.outcomes.statuses.count(EventStatus.DUPLICATE) == 4


def test_a_conversion_error_or_an_id_not_canonical_in_a_part() -> None:
    """A part with a conversion error and one with an id in upper case (the same event as one of
    an earlier part's): the general path's outcomes."""
    rng = random.Random(13)
    at = NOW - 90
    first = _period(rng, at, range(0, 100))
    second = _period(rng, at, range(100, 200))
    second[5] = (str(uuid.uuid4()), "unknown event kind 9")
    third = _period(rng, at, range(200, 300))
    third[6] = first[6]._replace(event_id=first[6][0].upper())  # type: ignore[union-attr]
    fourth = _period(rng, at, range(300, 400))
    fourth[7] = first[7]
    batch = _check([first, second, third, fourth])
    assert batch.outcomes.statuses.count(EventStatus.DUPLICATE) == 2
    assert batch.outcomes.errors[105] == "unknown event kind 9"


def test_rows_at_one_instant_with_uids_of_many_lengths(monkeypatch: pytest.MonkeyPatch) -> None:
    """Heartbeats at one instant of uids 1 to 300 characters long, in random order, then at a
    second instant: each row is the general function's (the instant's row field is kept by
    the payload's length)."""
    monkeypatch.setattr(event_codec, "_LAST_INSTANT", [(math.nan, "", 0, b"", None, {})])
    rng = random.Random(14)
    lengths = list(range(1, 301)) * 2
    rng.shuffle(lengths)
    for at in (NOW - 5.25, NOW - 5.25, NOW + 1e-6):
        used = lengths[:200]
        for n in used:
            uid = "u" * n
            event = beat(at, uid)
            payload = payload_json(event).encode()
            digest = payload_digest(payload)
            row = copy_row(event.event_id, uid, EventKind.HEARTBEAT, at, payload, digest)
            raw = uuid.UUID(event.event_id).bytes
            assert plain_heartbeat(raw, at, uid) == (payload, digest, row), (at, n)
        rng.shuffle(lengths)
    # The last instant's row fields, one per payload length its heartbeats had.
    assert len(event_codec._LAST_INSTANT[0][5]) == len(set(used))
