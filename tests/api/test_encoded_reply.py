"""ReportEvents and StreamEvents send their reply as the bytes `_report` appended
(`ingest.EncodedReply`), not as a message the runtime parses and encodes again: those bytes must
read back as the very reply the message would hold, across event kinds, outcomes and errors,
and be sent as they are by the served methods."""

from __future__ import annotations

import random
import time
import uuid
from typing import Any

import grpc
from ledger_support import (
    DUPLICATE,
    HEARTBEAT,
    NODE_CAPACITY,
    REJECTED,
    STARTED,
    STOPPED,
    STORED,
    cluster,
    event,
    submit,
)

from gpufair.api.convert_ledger import events_from_proto
from gpufair.api.ingest import EncodedReply, _Message, _report
from gpufair.api.ledger import LedgerServicer, add_ledger_to_server
from gpufair.client import GpufairClient
from gpufair.store import ingest_pipeline
from gpufair.store.ingest_pipeline import EventStatus
from gpufair.v1 import ledger_pb2 as pb

NOW = 1_800_000_000.0
IDS = [str(uuid.UUID(int=random.Random(5).getrandbits(128) + k)) for k in range(8)]


def _message(events: list[pb.LedgerEvent]) -> _Message:
    """`events` prepared as a stream prepares them, the candidates then given the outcomes a
    write could give: the first stored, the second a duplicate of a stored one, the third
    refused by the database's checks, and so on in turn."""
    converted = events_from_proto(events)
    batch = ingest_pipeline.prepare(converted, NOW)
    outcomes = batch.outcomes
    for k, c in enumerate(batch.candidates):
        if k % 3 == 0:
            outcomes.statuses[c.position] = EventStatus.STORED
        elif k % 3 == 1:
            outcomes.statuses[c.position] = EventStatus.DUPLICATE
        else:
            outcomes.reject(c.position, f"unknown workload 'w{k}'")
    return _Message(converted, NOW, batch, outcomes)


def _mixed() -> list[pb.LedgerEvent]:
    """Every kind a client sends, and each way an event is refused before the database."""
    capacity = event(NODE_CAPACITY, "", NOW - 60, event_id=IDS[3])
    capacity.node, capacity.gpu_count = "n1", 4
    unknown = event(HEARTBEAT, "w1", NOW - 60, event_id="unknown-kind")
    unknown.kind = 99  # type: ignore[assignment]
    nanos = event(HEARTBEAT, "w1", NOW - 60, event_id="negative-nanos")
    nanos.occurred_at.nanos = -1
    return [
        event(HEARTBEAT, "w1", NOW - 60, event_id=IDS[0]),
        event(STARTED, "w2", NOW - 50, [("n1", [0, 1], 1.0)], event_id=IDS[1]),
        event(STOPPED, "w3", NOW - 40, event_id=IDS[2]),
        capacity,
        event(HEARTBEAT, "w1", NOW - 60, event_id=IDS[0]),  # a duplicate within the message
        event(HEARTBEAT, "w4", NOW - 60, event_id=IDS[0]),  # its id reused
        unknown,
        nanos,
        event(HEARTBEAT, "w1", NOW + 3600, event_id=IDS[4]),  # too far ahead
        event(HEARTBEAT, "w1", NOW - 60, event_id="not-a-uuid"),
        event(HEARTBEAT, "w1", NOW - 60, event_id="x" * 300),
        event(HEARTBEAT, "w1", NOW - 60, event_id="événement-é"),
        event(HEARTBEAT, "w\x00", NOW - 60, event_id=IDS[5]),  # a uid not printable
        event(HEARTBEAT, "w5", NOW - 60, event_id=IDS[6].upper()),  # stored as canonical
        event(HEARTBEAT, "w6", NOW - 60, event_id=IDS[7]),
    ]


def _both(messages: list[_Message]) -> tuple[bytes, pb.ReportEventsResponse]:
    encoded, reply = EncodedReply(), pb.ReportEventsResponse()
    for message in messages:
        _report(encoded, message)
        _report(reply, message)
    return encoded.encoded(), reply


def test_an_encoded_reply_of_every_kind_and_outcome_is_the_message_s_own_bytes() -> None:
    """15 events (a heartbeat, a start with two GPUs, a stop, a node's capacity; a duplicate and
    a reuse of the first id, an unknown kind, negative nanos, an instant an hour ahead, ids that
    are no UUID, 300 characters long or not ASCII, a uid with a NUL, an id in upper case), twice
    as two messages of a stream: 30 results, the same bytes as the message the old path
    built and serialized, and that message once read back."""
    first, second = _message(_mixed()), _message(_mixed())
    data, reply = _both([first, second])
    assert data == reply.SerializeToString()
    assert pb.ReportEventsResponse.FromString(data) == reply
    results = [(r.event_id, r.status, r.error) for r in reply.results]
    assert len(results) == 30
    assert results[:6] == [
        (IDS[0], STORED, ""),
        (IDS[1], DUPLICATE, ""),
        (IDS[2], REJECTED, "unknown workload 'w2'"),
        (IDS[3], STORED, ""),
        (IDS[0], DUPLICATE, ""),
        (IDS[0], REJECTED, "event_id reused with a different payload"),
    ]
    assert results[6][2] == "unknown event kind 99"
    assert results[7][2] == "occurred_at.nanos must be in [0, 999999999], got -1"
    assert [r[1] for r in results[8:15]] == [REJECTED] * 5 + [DUPLICATE, REJECTED]
    assert results[15:] == results[:15]


def test_a_reply_of_empty_ids_reads_back_as_the_message_s_own() -> None:
    """Two events with an empty id, the second a duplicate of the first within the message: the
    first refused, the second a duplicate. The short form of a result without an error writes
    the empty id's field (2 bytes) that the runtime leaves out, so the bytes are 2 longer, and
    read back as the same reply."""
    empty = event(HEARTBEAT, "w1", NOW - 60)
    empty.event_id = ""
    data, reply = _both([_message([empty, empty])])
    assert [(r.event_id, r.status, r.error) for r in reply.results] == [
        ("", REJECTED, "event_id '' is not a UUID"),
        ("", DUPLICATE, ""),
    ]
    assert len(data) == len(reply.SerializeToString()) + 2
    assert pb.ReportEventsResponse.FromString(data) == reply


def test_a_reply_of_2000_stored_heartbeats_joined_at_once_is_the_message_s_own_bytes() -> None:
    """A message of 2,000 heartbeats with UUID ids, every one stored (the results made in one
    join): 84,000 bytes, those of the message built result by result."""
    rng = random.Random(7)
    events = [
        event(HEARTBEAT, f"w{k % 400}", NOW - 30, event_id=str(uuid.UUID(int=rng.getrandbits(128))))
        for k in range(2000)
    ]
    message = _message(events)
    message.outcomes = message.batch.outcomes
    message.outcomes.statuses[:] = [EventStatus.STORED] * 2000
    data, reply = _both([message])
    expected = pb.ReportEventsResponse()
    for e in events:
        expected.results.add(event_id=e.event_id, status=STORED)
    assert len(data) == 84_000
    assert data == expected.SerializeToString() == reply.SerializeToString()


class _Registry:
    """A server's side of handler registration, recording what it is given."""

    def __init__(self) -> None:
        self.generic: tuple[Any, ...] = ()
        self.registered: dict[str, Any] = {}

    def add_generic_rpc_handlers(self, handlers: tuple[Any, ...]) -> None:
        self.generic = handlers

    def add_registered_method_handlers(self, service: str, handlers: dict[str, Any]) -> None:
        assert service == "gpufair.v1.Ledger"
        self.registered = handlers


def test_every_ledger_method_is_registered_and_the_ingest_ones_send_bytes_as_they_are() -> None:
    """The five methods of the service, each under its name; ReportEvents and StreamEvents pass
    the bytes of their reply on unchanged (and still encode a message if given one), the three
    reads serialize their message as the generated code does."""
    registry = _Registry()
    servicer = LedgerServicer.__new__(LedgerServicer)  # its methods only are looked up
    add_ledger_to_server(servicer, registry)  # type: ignore[arg-type]
    methods = pb.DESCRIPTOR.services_by_name["Ledger"].methods_by_name
    assert set(registry.registered) == set(methods)
    assert len(registry.generic) == 1
    reply = pb.ReportEventsResponse()
    reply.results.add(event_id="a", status=STORED)
    for name in ("ReportEvents", "StreamEvents"):
        serialize = registry.registered[name].response_serializer
        assert serialize(b"\x0a\x05\x0a\x01a\x10\x01") == b"\x0a\x05\x0a\x01a\x10\x01"
        assert serialize(reply) == reply.SerializeToString()
    assert registry.registered["ReportEvents"].unary_unary is not None
    assert registry.registered["StreamEvents"].stream_unary is not None
    share = pb.GetFairShareResponse(pool="main", capacity_cu=8.0)
    serialize = registry.registered["GetFairShare"].response_serializer
    assert serialize(share) == share.SerializeToString()


def test_the_served_reply_is_the_runtime_s_encoding_of_its_results(
    client: GpufairClient, server: Any
) -> None:
    """Over gRPC, a stream of two messages (a start of a submitted workload and a heartbeat of
    it; the same two again, and a heartbeat of a workload that does not exist) and a
    ReportEvents call of the first two: the bytes the client receives are the runtime's own
    serialization of the 5 and 2 results, which read: stored, stored; duplicate, duplicate,
    refused; duplicate, duplicate."""
    client.apply_config(cluster())
    submit(client, "w1")
    at = time.time() - 3600
    start = event(STARTED, "w1", at, [("a1", [0], 1.0)])
    beat = event(HEARTBEAT, "w1", at + 60)
    lost = event(HEARTBEAT, "nobody", at + 60)
    first = pb.ReportEventsRequest(events=[start, beat])
    second = pb.ReportEventsRequest(events=[start, beat, lost])
    with grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        raw: dict[str, Any] = {"response_deserializer": None, "request_serializer": bytes}
        stream = channel.stream_unary("/gpufair.v1.Ledger/StreamEvents", **raw)
        unary = channel.unary_unary("/gpufair.v1.Ledger/ReportEvents", **raw)
        streamed = stream(iter([first.SerializeToString(), second.SerializeToString()]), timeout=20)
        reported = unary(first.SerializeToString(), timeout=20)
    for data, expected in (
        (streamed, [STORED, STORED, DUPLICATE, DUPLICATE, REJECTED]),
        (reported, [DUPLICATE, DUPLICATE]),
    ):
        reply = pb.ReportEventsResponse.FromString(data)
        assert [r.status for r in reply.results] == expected
        assert data == reply.SerializeToString()
    assert reply.results[0].event_id == start.event_id
