"""Ledger events between proto and domain."""

from __future__ import annotations

from collections.abc import Iterable

from gpufair.domain.ledger import EventKind, EventPod, LedgerEvent
from gpufair.v1 import ledger_pb2 as pb

NANOS_PER_S = 1_000_000_000

_KINDS = {
    pb.EVENT_KIND_STARTED: EventKind.STARTED,
    pb.EVENT_KIND_STOPPED: EventKind.STOPPED,
    pb.EVENT_KIND_HEARTBEAT: EventKind.HEARTBEAT,
    pb.EVENT_KIND_PREEMPTED: EventKind.PREEMPTED,
    pb.EVENT_KIND_FAILED: EventKind.FAILED,
    pb.EVENT_KIND_NODE_CAPACITY: EventKind.NODE_CAPACITY,
}


def _pods(pods: Iterable[pb.EventPod]) -> tuple[EventPod, ...]:
    return tuple(
        EventPod(
            p.node,
            tuple(p.gpu_indices),
            # Unset is a whole GPU, but not for a partition: left 0, refused by the checks.
            p.gpu_fraction or (0.0 if p.HasField("partition_start") else 1.0),
            p.partition_start if p.HasField("partition_start") else None,
        )
        for p in pods
    )


def events_from_proto(msgs: Iterable[pb.LedgerEvent]) -> list[LedgerEvent | tuple[str, str]]:
    """Each message as a domain event, in order, or as (event_id, why it cannot be one).

    One loop for a part of a message rather than a call per event: ingestion converts tens of
    thousands of events a second, nearly all of them heartbeats, which have no pods."""
    found: list[LedgerEvent | tuple[str, str]] = []
    # Each event made from a tuple by the C constructor: a named tuple's own __new__ is a Python
    # function, a frame per event. Every field is given, so its defaults are not needed.
    append, kinds, new = found.append, _KINDS, tuple.__new__
    for msg in msgs:
        kind = kinds.get(msg.kind)
        if kind is None:
            append((msg.event_id, f"unknown event kind {msg.kind}"))
            continue
        # An unset occurred_at reads as zero seconds: the same 0.0 as asking HasField first.
        at = msg.occurred_at
        nanos = at.nanos
        if not 0 <= nanos < NANOS_PER_S:
            # Out of a Timestamp's range: read as it is, it would move the instant by seconds.
            append((msg.event_id, f"occurred_at.nanos must be in [0, 999999999], got {nanos}"))
            continue
        pods = msg.pods
        append(
            new(
                LedgerEvent,
                (
                    msg.event_id,
                    kind,
                    at.seconds + nanos / 1e9,
                    msg.workload_uid,
                    _pods(pods) if pods else (),
                    msg.node,
                    msg.gpu_count,
                ),
            )
        )
    return found
