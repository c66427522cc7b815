"""How an event is written down: its canonical payload, the digest replays are recognised by, and
its instant exactly as PostgreSQL stores it.

The payload and digest of every event already in a ledger are fixed: a replay of a stored event
must produce the same bytes, so `payload_json` reproduces `json.dumps(..., sort_keys=True)`
byte for byte (and falls back to it for anything but the plain types the API produces).
"""

from __future__ import annotations

import binascii
import hashlib
import json
import math
import struct
from collections.abc import Iterable, Sequence
from json.encoder import encode_basestring_ascii as _quote  # what json.dumps uses for str
from typing import Any

from gpufair.domain.ledger import EventKind, EventPod, LedgerEvent

_KIND_JSON = {kind: _quote(kind.value) for kind in EventKind}
# PostgreSQL counts timestamps in microseconds from 2000-01-01 (946684800 s after the Unix epoch).
_PG_EPOCH_S = 946_684_800


def pod_json(pod: EventPod) -> dict[str, Any]:
    """One pod of an event as stored; a partition's start only when given, so events without
    one keep the payload (and digest) they always had."""
    found: dict[str, Any] = {
        "node": pod.node,
        "gpu_indices": list(pod.gpu_indices),
        "gpu_fraction": pod.gpu_fraction,
    }
    if pod.partition_start is not None:
        found["partition_start"] = pod.partition_start
    return found


def pod_from_json(stored: dict[str, Any]) -> EventPod:
    return EventPod(
        stored["node"],
        tuple(stored["gpu_indices"]),
        stored["gpu_fraction"],
        stored.get("partition_start"),
    )


def reference_payload_json(event: LedgerEvent) -> str:
    """The canonical payload as first defined; `payload_json` is a faster rendering of it."""
    return json.dumps(
        {
            "kind": event.kind.value,
            "occurred_at_s": event.occurred_at_s,
            "workload_uid": event.workload_uid,
            "pods": [pod_json(p) for p in event.pods],
            "node": event.node,
            "gpu_count": event.gpu_count,
        },
        separators=(",", ":"),
        sort_keys=True,
    )


def _pods_json(pods: Sequence[EventPod]) -> str | None:
    parts = []
    for p in pods:
        fraction = p.gpu_fraction
        if type(fraction) is not float or not math.isfinite(fraction):
            return None
        if any(type(g) is not int for g in p.gpu_indices):
            return None
        indices = ",".join(map(str, p.gpu_indices))
        start = p.partition_start
        if start is not None:
            if type(start) is not int:
                return None
            parts.append(
                f'{{"gpu_fraction":{fraction!r},"gpu_indices":[{indices}],'
                f'"node":{_quote(p.node)},"partition_start":{start}}}'
            )
            continue
        parts.append(
            f'{{"gpu_fraction":{fraction!r},"gpu_indices":[{indices}],"node":{_quote(p.node)}}}'
        )
    return ",".join(parts)


def payload_json(event: LedgerEvent) -> str:
    """The canonical payload: what a replay of the same event_id must repeat exactly.

    Keys in sorted order, no spaces, ASCII-escaped strings and `repr` of floats are what
    json.dumps writes; numbers of another type, or NaN and infinities, go through json.dumps."""
    at, count = event.occurred_at_s, event.gpu_count
    if type(at) is not float or not math.isfinite(at) or type(count) is not int:
        return reference_payload_json(event)
    pods = _pods_json(event.pods) if event.pods else ""
    if pods is None:
        return reference_payload_json(event)
    return (
        f'{{"gpu_count":{count},"kind":{_KIND_JSON[event.kind]},"node":{_quote(event.node)},'
        f'"occurred_at_s":{at!r},"pods":[{pods}],"workload_uid":{_quote(event.workload_uid)}}}'
    )


def payload_digest(payload: bytes) -> str:
    """What a stored event's `payload_digest` holds: SHA-256 of the UTF-8 payload, in hex."""
    return hashlib.sha256(payload).hexdigest()


def _pg_internal_micros(epoch_s: float) -> int:
    """`to_timestamp(epoch_s)` as PostgreSQL keeps it, in microseconds since 2000-01-01: it shifts
    to its own epoch in float8, then rounds half to even (rint), as Python's round does."""
    return round((epoch_s - _PG_EPOCH_S) * 1e6)


def stored_epoch_s(epoch_s: float) -> float:
    """What `extract(epoch FROM occurred_at)::float8` reads back for an event stored with
    `epoch_s`: the exact decimal of its microsecond, correctly rounded (as integer division in
    Python is)."""
    return (_pg_internal_micros(epoch_s) + _PG_EPOCH_S * 1_000_000) / 1_000_000


# New events go in by COPY in PostgreSQL's binary format: text COPY would have the server parse a
# timestamp and a UUID per row and the client format them, where in binary both are fixed-width
# integers; and rows are encoded directly, without psycopg's general row adapter. Text travels
# as UTF-8, so this needs a UTF-8 client encoding.
COPY_EVENTS_SQL = (
    "COPY ledger_events (event_id, workload_uid, kind, occurred_at, payload, payload_digest) "
    "FROM STDIN (FORMAT BINARY)"
)
_COPY_HEADER = b"PGCOPY\n\xff\r\n\x00" + bytes(8)  # signature, no flags, no extension
_COPY_TRAILER = b"\xff\xff"
_ROW_HEAD = struct.Struct(">hi16si")  # 6 fields; uuid; length of workload_uid (-1: NULL)
_ROW_TIME = struct.Struct(">iqiB")  # timestamptz; length of the jsonb that follows, its version (1)
_KIND_FIELD = {k: struct.pack(">i", len(k.value)) + k.value.encode() for k in EventKind}
_LENGTH = struct.Struct(">i")
_DIGEST_LENGTH = _LENGTH.pack(64)  # of a SHA-256 in hex, as every digest is


def copy_row(
    event_id: str, workload_uid: str, kind: EventKind, epoch_s: float, payload: bytes, digest: str
) -> bytes:
    """One row of COPY_EVENTS_SQL: `event_id` canonical, `workload_uid` "" for NULL. The instant
    is `_pg_internal_micros(epoch_s)`, written out: this runs once per event."""
    id_bytes = bytes.fromhex(event_id.replace("-", ""))
    uid = workload_uid.encode()
    digest_bytes = digest.encode()
    return b"".join(
        (
            _ROW_HEAD.pack(6, 16, id_bytes, len(uid) if uid else -1),
            uid,
            _KIND_FIELD[kind],
            _ROW_TIME.pack(8, round((epoch_s - _PG_EPOCH_S) * 1e6), len(payload) + 1, 1),
            payload,
            _DIGEST_LENGTH if len(digest_bytes) == 64 else _LENGTH.pack(len(digest_bytes)),
            digest_bytes,
        )
    )


_HEARTBEAT_FIELD = _KIND_FIELD[EventKind.HEARTBEAT]
_ROW_START = struct.pack(">hi", 6, 16)  # 6 fields; the uuid's length
# Of a plain heartbeat's payload: what comes before its instant, and per workload uid what comes
# after it (ASCII, as `_quote` escapes), with the part of its COPY row between the id and the
# instant (`_heartbeat_parts`).
_HEARTBEAT_HEAD = '{"gpu_count":0,"kind":"heartbeat","node":"","occurred_at_s":'
_HEARTBEAT_PARTS: dict[str, tuple[bytes, bytes]] = {}
HEARTBEAT_PARTS_LIMIT = 100_000  # uids kept; beyond it the cache starts over


# A plain heartbeat's instant as its payload and row have it: (epoch_s, its `repr`,
# `_pg_internal_micros` of it, the payload up to and with it, and from the instant's second
# heartbeat on a SHA-256 object that has taken that in, which each digest goes on from a copy
# of: with an instant of this century the head is more than SHA-256's block of 64 bytes, so each
# heartbeat hashes one block less, and none makes a hash object from its name), and the row's
# field of the instant and the payload's length, by that length (`_time_field`): the payloads
# of an instant differ only in their uids, whose lengths are few.
_Instant = tuple[float, str, int, bytes, Any, dict[int, bytes]]


# The last instant a plain heartbeat had. A batch system reports its running jobs' heartbeats at
# one instant per period (the Slurm bridge stamps them all with the period's start), so a
# message's heartbeats nearly all share it: the float's shortest `repr` alone cost more than its
# SHA-256. One tuple, replaced whole in the list's one slot: threads that read it see one
# instant's parts together (its SHA-256 object is only ever copied). NaN equals nothing.
_LAST_INSTANT: list[_Instant] = [(math.nan, "", 0, b"", None, {})]


def _heartbeat_parts(workload_uid: str) -> tuple[bytes, bytes]:
    uid = workload_uid.encode()
    parts = (
        f',"pods":[],"workload_uid":{_quote(workload_uid)}}}'.encode(),
        b"".join((_LENGTH.pack(len(uid) if uid else -1), uid, _HEARTBEAT_FIELD)),
    )
    if len(_HEARTBEAT_PARTS) >= HEARTBEAT_PARTS_LIMIT:
        _HEARTBEAT_PARTS.clear()
    _HEARTBEAT_PARTS[workload_uid] = parts
    return parts


def plain_heartbeat(id_bytes: bytes, epoch_s: float, workload_uid: str) -> tuple[bytes, str, bytes]:
    """The payload, digest and COPY row of a heartbeat with no pods, no node and no GPU count,
    at a finite, positive `epoch_s` (a float), its id given as the UUID's 16 bytes: what
    `payload_json`, `payload_digest` and `copy_row` give for it, in one call. Nearly every event
    of a working cluster is one, and its workload reports one every few seconds: the parts that
    depend on the uid alone (its quoted JSON, its field in the row) are made once per uid and
    kept, and those of the instant, with the digest of the payload up to it, are kept for the
    next heartbeat at the same instant (`_LAST_INSTANT`; equal positive floats have one
    `repr`)."""
    tail, middle = _HEARTBEAT_PARTS.get(workload_uid) or _heartbeat_parts(workload_uid)
    instant = _LAST_INSTANT[0]
    if instant[0] == epoch_s:
        _, _, micros, head, hashed, times = instant
        if hashed is None:  # its second heartbeat: the head is hashed once for all that follow
            hashed = hashlib.sha256(head)
            _LAST_INSTANT[0] = (*instant[:4], hashed, times)
        payload = head + tail
        hashed = hashed.copy()
        hashed.update(tail)
        digest = hashed.hexdigest()
    else:  # a new instant, kept without its SHA-256 object until it comes again
        text, micros, times = repr(epoch_s), _pg_internal_micros(epoch_s), {}
        head = f"{_HEARTBEAT_HEAD}{text}".encode()
        _LAST_INSTANT[0] = (epoch_s, text, micros, head, None, times)
        payload = head + tail
        digest = hashlib.sha256(payload).hexdigest()
    size = len(payload)
    row = b"".join(
        (
            _ROW_START,
            id_bytes,
            middle,
            times.get(size) or _time_field(times, micros, size),
            payload,
            _DIGEST_LENGTH,
            digest.encode(),
        )
    )
    return payload, digest, row


def _time_field(times: dict[int, bytes], micros: int, size: int) -> bytes:
    """A plain heartbeat row's instant and the head of its payload's field, for a payload of
    `size` bytes, kept in `times` (of its instant)."""
    field = times[size] = _ROW_TIME.pack(8, micros, size + 1, 1)
    return field


def id_bytes(canonical_id: str) -> bytes:
    """The 16 bytes of a UUID in its canonical text form."""
    return bytes.fromhex(canonical_id.replace("-", ""))


def canonical_ids_bytes(event_ids: Sequence[str]) -> bytes | None:
    """The 16 bytes of each of `event_ids`, one after the other, if every one is in the canonical
    form (what `domain.ledger.CANONICAL_UUID` matches: 36 characters, hyphens at 8, 13, 18 and 23
    and nowhere else, lowercase hexadecimal digits elsewhere); else None. A few passes in C over
    the whole list instead of a regular expression and a conversion per id: a client sends its
    ids in that form, and a message holds thousands."""
    n = len(event_ids)
    if not n or set(map(len, event_ids)) != {36}:
        return None
    joined = "".join(event_ids)
    dashes = "-" * n
    if any(joined[k::36] != dashes for k in (8, 13, 18, 23)) or not joined.isascii():
        return None
    digits = joined.encode().replace(b"-", b"")
    if len(digits) != 32 * n:  # a hyphen elsewhere
        return None
    try:
        found = binascii.unhexlify(digits)
    except binascii.Error:  # not hexadecimal
        return None
    # Equal only if every digit is in lower case: unhexlify also takes upper case.
    return found if binascii.hexlify(found) == digits else None


def copy_stream(rows: Iterable[bytes]) -> bytes:
    return b"".join((_COPY_HEADER, *rows, _COPY_TRAILER))


def text_array(values: Iterable[str]) -> str:
    """A text[] literal. Every element is quoted, so only backslash and double quote need
    escaping; psycopg's list adapter inspects each element with regular expressions, which
    costs more than the query it feeds when a batch names thousands of ids. Elements with
    neither, as ids and names nearly always are, are quoted by one join."""
    items = values if type(values) is list else list(values)
    plain = "".join(items)
    if "\\" not in plain and '"' not in plain:
        return '{"' + '","'.join(items) + '"}' if items else "{}"
    return (
        "{" + ",".join('"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"' for v in items) + "}"
    )
