"""The results of ReportEvents and StreamEvents in the protobuf wire format, and the bound on a
reply's size.

A reply holds one result per event: about 42 bytes for an event with a UUID id and no error. A
stream's reply grows with the stream, and gRPC sends no message larger than the server's
`MAX_MESSAGE_BYTES`: a reply past it could not be sent after its events were committed, and the
client's resend would meet the same wall. So a message is written only if the reply, with the
largest results that message could add, stays within the limit (`ReplyBudget`); if not it is
refused before any of its events is written, and the messages before it stay stored. For the
bound to hold, an error is cut to `MAX_ERROR_BYTES` in its result.
"""

from __future__ import annotations

from collections.abc import Sequence

from gpufair.domain.errors import InvalidInputError, Violation
from gpufair.domain.limits import MAX_MESSAGE_BYTES
from gpufair.store.ingest_pipeline import EventStatus, Outcomes
from gpufair.v1 import ledger_pb2 as pb

STATUS = {
    EventStatus.STORED: pb.EVENT_STATUS_STORED,
    EventStatus.DUPLICATE: pb.EVENT_STATUS_DUPLICATE,
    EventStatus.REJECTED: pb.EVENT_STATUS_REJECTED,
}

MAX_ERROR_BYTES = 400  # of one result's error, UTF-8; longer ones end with "…"
_ELLIPSIS = "…".encode()


def _varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


# An EventResult as field 1 of ReportEventsResponse, for an event id of n < 124 UTF-8 bytes and no
# error: tag and length of the result, tag and length of the id; then the id, tag and status.
SHORT = 124
SHORT_HEAD = [bytes((0x0A, n + 4, 0x0A, n)) for n in range(SHORT)]
STORED_TAIL = bytes((0x10, pb.EVENT_STATUS_STORED))  # the status field
# Such a result is 6 bytes more than its id, whatever its status (each below 128).
_SHORT_EXTRA = 6
# The most a result with an id of n < 124 bytes can be beyond n: the short form's 6, its error
# (tag, a length of two bytes, MAX_ERROR_BYTES) and a length of the result of two bytes, not one.
_MOST_EXTRA = _SHORT_EXTRA + 3 + MAX_ERROR_BYTES + 1


def result_bytes(event_id: str, status: int, error: str | None) -> bytes:
    """One `results` entry of ReportEventsResponse in the protobuf wire format: what
    `reply.results.add()` with `event_id`, `status` and `error` set would serialize to, the
    error cut to MAX_ERROR_BYTES."""
    eid = event_id.encode()
    n = len(eid)
    if not error and n < SHORT and 0 < status < 128:
        return SHORT_HEAD[n] + eid + bytes((0x10, status))
    e = error.encode() if error else b""
    if len(e) > MAX_ERROR_BYTES:
        kept = e[: MAX_ERROR_BYTES - len(_ELLIPSIS)].decode(errors="ignore").encode()
        e = kept + _ELLIPSIS
    body = b"".join(
        (
            b"\x0a" + _varint(n) + eid if n else b"",
            b"\x10" + _varint(status) if status else b"",
            b"\x1a" + _varint(len(e)) + e if e else b"",
        )
    )
    return b"\x0a" + _varint(len(body)) + body


def _short_ids(event_ids: Sequence[str]) -> int | None:
    """The UTF-8 bytes of all `event_ids`, if each is ASCII and shorter than SHORT (UUIDs are);
    else None."""
    joined = "".join(event_ids)
    if not joined.isascii() or (event_ids and max(map(len, event_ids)) >= SHORT):
        return None
    return len(joined)


def most_bytes(event_ids: Sequence[str]) -> int:
    """The largest the results of events with these ids can be, whatever their outcomes."""
    total = _short_ids(event_ids)
    if total is not None:
        return total + _MOST_EXTRA * len(event_ids)
    error = "x" * MAX_ERROR_BYTES
    return sum(len(result_bytes(i, pb.EVENT_STATUS_REJECTED, error)) for i in event_ids)


def results_bytes(outcomes: Outcomes) -> int:
    """The size of the results of a written batch, as `result_bytes` encodes them: the reply's
    own size, but for 2 bytes more for each result of an empty id without an error (the short
    form writes the empty field, which the runtime leaves out)."""
    event_ids, errors = outcomes.event_ids, outcomes.errors
    total = _short_ids(event_ids)
    if total is None:
        statuses = outcomes.final()
        return sum(
            len(result_bytes(event_id, STATUS[status], errors.get(i)))
            for i, (event_id, status) in enumerate(zip(event_ids, statuses, strict=True))
        )
    total += _SHORT_EXTRA * len(event_ids)
    for i, error in errors.items():  # rejections, each in place of a short result
        short = len(event_ids[i]) + _SHORT_EXTRA
        total += len(result_bytes(event_ids[i], pb.EVENT_STATUS_REJECTED, error)) - short
    return total


class ReplyBudget:
    """The bytes of a reply's results so far, against `limit`; see the module's docstring."""

    __slots__ = ("limit", "used")

    def __init__(self, limit: int | None = None) -> None:
        self.limit = MAX_MESSAGE_BYTES if limit is None else limit
        self.used = 0

    def admit(self, event_ids: Sequence[str], field: str, messages_before: int) -> None:
        """Raise InvalidInputError, naming `field`, unless the results of events with these
        ids fit in what is left whatever their outcomes."""
        if self.used + most_bytes(event_ids) <= self.limit:
            return
        if messages_before:
            why = (
                f"the reply to this stream would pass {self.limit} bytes (a result per event): "
                f"what the stream sent before this message ({messages_before} messages) is "
                "stored; send this message and the rest on a new stream"
            )
        else:
            why = f"the reply would pass {self.limit} bytes (a result per event): send fewer events"
        raise InvalidInputError([Violation(field, why)])

    def spend(self, outcomes: Outcomes) -> None:
        """Count the results of a written batch."""
        self.used += results_bytes(outcomes)
