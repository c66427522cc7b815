"""Ledger events between proto and domain."""

from __future__ import annotations

from gpufair.domain.ledger import EventKind, EventPod, LedgerEvent
from gpufair.v1 import ledger_pb2 as pb

_KINDS = {
    pb.EVENT_KIND_STARTED: EventKind.STARTED,
    pb.EVENT_KIND_STOPPED: EventKind.STOPPED,
    pb.EVENT_KIND_HEARTBEAT: EventKind.HEARTBEAT,
    pb.EVENT_KIND_PREEMPTED: EventKind.PREEMPTED,
    pb.EVENT_KIND_FAILED: EventKind.FAILED,
    pb.EVENT_KIND_NODE_CAPACITY: EventKind.NODE_CAPACITY,
}


def event_from_proto(msg: pb.LedgerEvent) -> LedgerEvent | str:
    """The domain event, or why the message cannot be one."""
    kind = _KINDS.get(msg.kind)
    if kind is None:
        return f"unknown event kind {msg.kind}"
    # An unset occurred_at reads as zero seconds: the same 0.0 as asking HasField first.
    at = msg.occurred_at
    pods = msg.pods
    return LedgerEvent(
        msg.event_id,
        kind,
        at.seconds + at.nanos / 1e9,
        msg.workload_uid,
        tuple(
            EventPod(
                p.node,
                tuple(p.gpu_indices),
                p.gpu_fraction if p.gpu_fraction else 1.0,
                p.partition_start if p.HasField("partition_start") else None,
            )
            for p in pods
        )
        if pods
        else (),
        msg.node,
        msg.gpu_count,
    )
