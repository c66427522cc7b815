"""Stored replies of mutating RPCs, keyed by the caller's request id.

A replay of a request id returns the first reply byte for byte; the same id with a different request
is refused, since the caller has mixed up two operations.
"""

from __future__ import annotations

import hashlib

from sqlalchemy import Connection, select
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
        raise Conflict(
            f"request_id {request_id!r} was already used for a different request; "
            "use a new request_id for a new operation"
        )
    return bytes(row.reply)


def store_reply(conn: Connection, request_id: str, method: str, digest: str, reply: bytes) -> None:
    conn.execute(
        pg_insert(t.request_replies)
        .values(request_id=request_id, method=method, request_digest=digest, reply=reply)
        .on_conflict_do_nothing(index_elements=["request_id"])
    )
