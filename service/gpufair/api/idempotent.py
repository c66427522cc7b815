"""Mutating RPCs with a request id: the first reply is stored in the same transaction as the
change it reports, so a replay after a lost reply (or a crash after commit) returns it unchanged,
and a crash before commit leaves neither. Two attempts running at once (a retry before the first
answered) both do the work, but only the first to commit keeps it: the other's insert of the
reply waits for it, finds the reply stored, and rolls its own work back."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from google.protobuf.message import Message
from sqlalchemy import Connection, Engine

from gpufair.store import locks
from gpufair.store.idempotency import request_digest, store_reply, stored_reply

R = TypeVar("R", bound=Message)


def run_mutation(
    engine: Engine,
    *,
    method: str,
    request: Message,
    request_id: str,
    dry_run: bool,
    lock_key: int | None,
    reply_type: type[R],
    work: Callable[[Connection], R],
) -> R:
    """Run `work` in one transaction under `lock_key`; with a request id, at most once."""
    digest = request_digest(method, request.SerializeToString(deterministic=True))
    with engine.connect() as conn:
        if lock_key is not None:
            locks.xact_lock(conn, lock_key)
        if request_id and not dry_run:
            previous = stored_reply(conn, request_id, digest)
            if previous is not None:
                conn.rollback()
                return reply_type.FromString(previous)
        reply = work(conn)
        if dry_run:
            conn.rollback()  # a dry run decides, but nothing it touched may last
            return reply
        if request_id and not store_reply(
            conn, request_id, method, digest, reply.SerializeToString()
        ):
            # Two attempts of one request ran at once (a client retrying before its first
            # attempt answered) and the other committed first: this one's work is undone, and
            # it answers what the other stored, so a request id has one reply and one effect.
            conn.rollback()
            previous = stored_reply(conn, request_id, digest)
            conn.rollback()
            if previous is not None:
                return reply_type.FromString(previous)
            raise RuntimeError(f"request id {request_id!r}: a reply was stored, then not found")
        conn.commit()
        return reply
