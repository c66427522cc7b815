"""Stored replies of mutating RPCs, keyed by the caller's request id.

A replay of a request id returns the first reply byte for byte; the same id with a different request
is refused, since the caller has mixed up two operations. Callers read the whole rule (failed calls
and dry runs store no reply) in the proto comment of ApplyConfigRequest.request_id.
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Mapping
from typing import NamedTuple

from sqlalchemy import Connection, select, text
from sqlalchemy.dialects.postgresql import insert as pg_insert

from gpufair.domain.errors import Conflict
from gpufair.store import tables as t


def request_digest(method: str, payload: bytes) -> str:
    return hashlib.sha256(method.encode() + b"\0" + payload).hexdigest()


def stored_reply(conn: Connection, request_id: str, digest: str) -> bytes | None:
    row = conn.execute(
        select(t.request_replies.c.reply, t.request_replies.c.request_digest).where(
            t.request_replies.c.request_id == request_id
        )
    ).one_or_none()
    if row is None:
        return None
    if row.request_digest != digest:
        raise conflict(request_id)
    return bytes(row.reply)


def store_reply(conn: Connection, request_id: str, method: str, digest: str, reply: bytes) -> bool:
    """Store the reply; False if the request id has one already (a concurrent attempt of the
    same request committed first: the insert waited for it)."""
    stored = conn.execute(
        pg_insert(t.request_replies)
        .values(request_id=request_id, method=method, request_digest=digest, reply=reply)
        .on_conflict_do_nothing(index_elements=["request_id"])
        .returning(t.request_replies.c.request_id)
    ).first()
    return stored is not None


# Coalesced `Schedule` calls share one reply, stored once with its cycle: under each of their
# request ids goes this method and the cycle's id (as text), not a copy of the reply (a few
# hundred kB for a pool with thousands of waiting workloads, times the callers of each cycle).
CYCLE_REFERENCE = "Schedule:cycle"


class StoredReply(NamedTuple):
    digest: str
    method: str
    reply: bytes


def stored_replies(conn: Connection, request_ids: Collection[str]) -> dict[str, StoredReply]:
    """The stored reply of each of `request_ids` that has one, in one statement."""
    r = t.request_replies.c
    rows = conn.execute(
        select(r.request_id, r.request_digest, r.method, r.reply).where(
            r.request_id.in_(sorted(request_ids))
        )
    )
    return {
        row.request_id: StoredReply(row.request_digest, row.method, bytes(row.reply))
        for row in rows
    }


def store_cycle_references(conn: Connection, digests: Mapping[str, str], cycle_id: int) -> None:
    """Store a reference to cycle `cycle_id` under each request id of `digests` (id -> request
    digest), in one statement."""
    if not digests:
        return
    ids = sorted(digests)
    conn.execute(
        text(
            "INSERT INTO request_replies (request_id, method, request_digest, reply) "
            "SELECT r.id, :method, r.digest, :reply "
            "FROM unnest(CAST(:ids AS text[]), CAST(:digests AS text[])) AS r(id, digest) "
            "ON CONFLICT (request_id) DO NOTHING"
        ),
        {
            "method": CYCLE_REFERENCE,
            "reply": str(cycle_id).encode(),
            "ids": ids,
            "digests": [digests[i] for i in ids],
        },
    )


def conflict(request_id: str) -> Conflict:
    return Conflict(
        f"request_id {request_id!r} was already used for a different request; "
        "use a new request_id for a new operation"
    )
