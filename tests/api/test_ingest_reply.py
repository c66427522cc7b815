"""The reply of ReportEvents/StreamEvents is appended as encoded results: each must read back as
the result the protobuf runtime would have built field by field."""

from __future__ import annotations

import bisect
import random
import uuid

import pytest
from prometheus_client import REGISTRY

from gpufair.api.ingest import _Message, _report, result_bytes
from gpufair.domain.ledger import EventKind, LedgerEvent
from gpufair.metrics import BatchHistogram
from gpufair.store import ingest_pipeline
from gpufair.v1 import ledger_pb2 as pb

CASES = [
    ("0b6f3c1e-8a52-4c1a-9a0e-0d3c2b1a0f9e", pb.EVENT_STATUS_STORED, None),
    ("0b6f3c1e-8a52-4c1a-9a0e-0d3c2b1a0f9e", pb.EVENT_STATUS_DUPLICATE, None),
    ("not-a-uuid", pb.EVENT_STATUS_REJECTED, "event_id 'not-a-uuid' is not a UUID"),
    ("", pb.EVENT_STATUS_REJECTED, "event_id '' is not a UUID"),
    ("x" * 123, pb.EVENT_STATUS_STORED, None),  # the longest id of the short form
    ("x" * 124, pb.EVENT_STATUS_STORED, None),  # the result's length takes two bytes
    ("x" * 300, pb.EVENT_STATUS_REJECTED, "e" * 200),  # the id's and the error's too
    ("événement-é", pb.EVENT_STATUS_REJECTED, "workload_uid must be printable: 'ü\\x00'"),
]


@pytest.mark.parametrize(("event_id", "status", "error"), CASES)
def test_an_encoded_result_is_the_runtime_s_own(
    event_id: str, status: int, error: str | None
) -> None:
    expected = pb.ReportEventsResponse()
    result = expected.results.add()
    result.event_id = event_id
    result.status = status  # type: ignore[assignment]
    if error:
        result.error = error
    encoded = result_bytes(event_id, status, error)
    assert encoded == expected.SerializeToString()
    parsed = pb.ReportEventsResponse.FromString(encoded)
    assert (parsed.results[0].event_id, parsed.results[0].status, parsed.results[0].error) == (
        event_id,
        status,
        error or "",
    )


def test_results_appended_to_a_reply_keep_their_order_after_the_ones_before() -> None:
    reply = pb.ReportEventsResponse()
    reply.results.add(event_id="first", status=pb.EVENT_STATUS_STORED)
    reply.MergeFromString(
        result_bytes("second", pb.EVENT_STATUS_DUPLICATE, None)
        + result_bytes("third", pb.EVENT_STATUS_REJECTED, "occurred_at is missing")
    )
    assert [(r.event_id, r.status, r.error) for r in reply.results] == [
        ("first", pb.EVENT_STATUS_STORED, ""),
        ("second", pb.EVENT_STATUS_DUPLICATE, ""),
        ("third", pb.EVENT_STATUS_REJECTED, "occurred_at is missing"),
    ]


def test_a_reported_message_lists_every_outcome_and_counts_them() -> None:
    """`_report` of a message of 3 events (one stored, one duplicate of it, one that is no UUID):
    3 results in order, the metrics count 1 stored, 1 duplicate, 1 rejected and 1 lag of 60 s."""

    def sample(name: str, **labels: str) -> float:
        return REGISTRY.get_sample_value(name, labels) or 0.0

    now = 1_800_000_000.0
    event_id = "0b6f3c1e-8a52-4c1a-9a0e-0d3c2b1a0f9e"
    stored = LedgerEvent(event_id, EventKind.HEARTBEAT, now - 60.0, "w1")
    converted: list[LedgerEvent | tuple[str, str]] = [stored, stored, ("nope", "not a UUID")]
    batch = ingest_pipeline.prepare(converted, now)
    assert len(batch.candidates) == 1  # the second is a duplicate within the batch
    batch.outcomes.statuses[batch.candidates[0].position] = ingest_pipeline.EventStatus.STORED
    names = ("stored", "duplicate", "rejected")
    before = [sample("gpufair_events_total", status=s) for s in names]
    lags_before = sample("gpufair_ingest_lag_seconds_count")
    in_60 = sample("gpufair_ingest_lag_seconds_bucket", le="60.0")

    reply = pb.ReportEventsResponse()
    _report(reply, _Message(converted, now, batch, batch.outcomes))

    assert [(r.event_id, r.status, r.error) for r in reply.results] == [
        (event_id, pb.EVENT_STATUS_STORED, ""),
        (event_id, pb.EVENT_STATUS_DUPLICATE, ""),
        ("nope", pb.EVENT_STATUS_REJECTED, "not a UUID"),
    ]
    after = [sample("gpufair_events_total", status=s) for s in names]
    assert [a - b for a, b in zip(after, before, strict=True)] == [1, 1, 1]
    assert sample("gpufair_ingest_lag_seconds_count") - lags_before == 1
    assert sample("gpufair_ingest_lag_seconds_bucket", le="60.0") - in_60 == 1


def test_a_reply_of_stored_events_in_any_id_spelling_is_the_runtime_s_own() -> None:
    """Five heartbeats 30 s old, their ids spelled canonically, in upper case, in braces, as a
    URN and canonically again; the fourth refused by the database's checks, the others stored:
    five results as the runtime serializes them, in order, and four lags of 30 s counted (the
    refused one has none)."""

    def sample(name: str, **labels: str) -> float:
        return REGISTRY.get_sample_value(name, labels) or 0.0

    now = 1_800_000_000.0
    ids = [
        "0b6f3c1e-8a52-4c1a-9a0e-0d3c2b1a0f9e",
        "1B6F3C1E-8A52-4C1A-9A0E-0D3C2B1A0F9E",
        "{2b6f3c1e-8a52-4c1a-9a0e-0d3c2b1a0f9e}",
        "urn:uuid:3b6f3c1e-8a52-4c1a-9a0e-0d3c2b1a0f9e",
    ]
    converted: list[LedgerEvent | tuple[str, str]] = [
        LedgerEvent(i, EventKind.HEARTBEAT, now - 30.0, "w1") for i in ids
    ]
    converted.append(
        LedgerEvent("4b6f3c1e-8a52-4c1a-9a0e-0d3c2b1a0f9e", EventKind.HEARTBEAT, now - 30.0, "w2")
    )
    batch = ingest_pipeline.prepare(converted, now)
    assert len(batch.candidates) == 5
    for c in batch.candidates[:3] + batch.candidates[4:]:
        batch.outcomes.statuses[c.position] = ingest_pipeline.EventStatus.STORED
    batch.outcomes.reject(batch.candidates[3].position, "unknown workload 'w1'")
    in_60 = sample("gpufair_ingest_lag_seconds_bucket", le="60.0")
    in_15 = sample("gpufair_ingest_lag_seconds_bucket", le="15.0")
    lag_sum = sample("gpufair_ingest_lag_seconds_sum")

    reply = pb.ReportEventsResponse()
    _report(reply, _Message(converted, now, batch, batch.outcomes))

    expected = pb.ReportEventsResponse()
    for event in converted:
        expected.results.add().event_id = event[0]
        expected.results[-1].status = pb.EVENT_STATUS_STORED
    expected.results[3].status = pb.EVENT_STATUS_REJECTED
    expected.results[3].error = "unknown workload 'w1'"
    assert reply.SerializeToString() == expected.SerializeToString()
    assert sample("gpufair_ingest_lag_seconds_bucket", le="60.0") - in_60 == 4
    assert sample("gpufair_ingest_lag_seconds_bucket", le="15.0") - in_15 == 0
    assert sample("gpufair_ingest_lag_seconds_sum") - lag_sum == pytest.approx(120.0)


def test_a_batch_histogram_counts_as_one_observation_at_a_time() -> None:
    """3,000 values, a third of them exactly on a bucket's bound (which counts them in it, as
    `le` says): the same counts per bucket and the same sum as bisecting each value alone."""
    bounds = (0.1, 0.5, 1, 5, 15, 60, 300, 900, 3600, 86400)
    rng = random.Random(3)
    values = [
        rng.choice([rng.uniform(0, 2e5), float(rng.choice(bounds)), 0.0, rng.expovariate(0.01)])
        for _ in range(3000)
    ]
    histogram = BatchHistogram("gpufair_test_batch_histogram", "test", bounds)
    try:
        histogram.observe_many(values[:1000])
        histogram.observe_many(values[1000:])
        histogram.observe_many([])
        expected = [0] * (len(bounds) + 1)
        for v in values:
            expected[bisect.bisect_left([float(b) for b in bounds], v)] += 1
        assert histogram._counts == expected
        assert sum(expected[:-1]) > 1000  # most values fall in a bounded bucket
        assert histogram._sum == sum(values[:1000]) + sum(values[1000:])
    finally:
        REGISTRY.unregister(histogram)


@pytest.mark.parametrize(
    "ids",
    [
        [str(uuid.UUID(int=random.Random(k).getrandbits(128))) for k in range(2000)],  # one join
        ["é" * 36, "e" * 36],  # one length in characters, not in bytes
        ["x" * 123] * 3,  # the longest of the short form, joined
        ["x" * 124] * 3,  # too long for it
        ["a", "bc"],  # two lengths
        [""],
    ],
    ids=["uuids", "non-ascii", "123", "124", "lengths", "empty"],
)
def test_a_reply_of_a_message_stored_whole_is_the_runtime_s_own(ids: list[str]) -> None:
    """Every event of the message stored: the reply is what the runtime serializes for those
    results, whether the results are joined at once (ids of one length in ASCII) or not."""
    outcomes = ingest_pipeline.Outcomes(list(ids))
    outcomes.statuses[:] = [ingest_pipeline.EventStatus.STORED] * len(ids)
    batch = ingest_pipeline.PreparedBatch(1.8e9, False, outcomes, [])
    reply = pb.ReportEventsResponse()
    reply.results.add(event_id="before", status=pb.EVENT_STATUS_DUPLICATE)
    _report(reply, _Message([], 1.8e9, batch, outcomes))

    expected = pb.ReportEventsResponse()
    expected.results.add(event_id="before", status=pb.EVENT_STATUS_DUPLICATE)
    for event_id in ids:
        expected.results.add(event_id=event_id, status=pb.EVENT_STATUS_STORED)
    assert reply.SerializeToString() == expected.SerializeToString()
    assert len(reply.results) == len(ids) + 1
