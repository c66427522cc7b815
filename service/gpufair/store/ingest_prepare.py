"""`prepare`'s work (`ingest_pipeline`), which needs no database: conversion results, canonical
ids, payloads, digests and COPY rows, duplicates within the batch, and every check that depends
only on the event and the clock. `Preparation` takes a batch a part at a time, so that a stream
can spread the work on its next message over the waits of the one in the database.

Its loop (`Preparation.add`) runs once per event of every message: the hot path of ingestion.
Nearly every event of a working cluster is a plain heartbeat, which it passes on conditions it
tests inline, with one call for its payload, digest and COPY row (`plain_heartbeat`).
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterable
from functools import partial
from itertools import repeat
from operator import itemgetter

from gpufair.domain.ledger import (
    CANONICAL_UUID,
    MAX_AGE_S,
    MAX_FUTURE_SKEW_S,
    RUN_KINDS,
    EventKind,
    LedgerEvent,
    canonical_event_id,
    static_problem,
    static_problem_of_uuid,
)
from gpufair.domain.limits import MAX_UID_LEN
from gpufair.store.event_codec import (
    canonical_ids_bytes,
    copy_row,
    id_bytes,
    payload_json,
    plain_heartbeat,
    stored_epoch_s,
)
from gpufair.store.ingest_batch import (
    _BY_ID,
    _DIGEST,
    REUSED,
    Candidate,
    EventStatus,
    Outcomes,
    PreparedBatch,
)

# Made from a tuple by the C constructor: the hot path pays no Python call per event for the names.
_candidate = partial(tuple.__new__, Candidate)
_FIRST = itemgetter(0)
_ID16 = struct.Struct("16s")  # each id's bytes in `canonical_ids_bytes`


class Preparation:
    """`prepare`, a part of the batch at a time, so that a stream can spread the work on its
    next message over the waits of the one in the database."""

    def __init__(self, now_s: float, *, internal: bool = False) -> None:
        self.now_s = now_s
        self._internal = internal
        self._outcomes = Outcomes([])
        self._candidates: list[Candidate] = []
        self._plain_uids: set[str] = set()
        self._others: list[Candidate] = []
        self._first_seen: dict[str, str] = {}  # canonical event_id -> digest, within the batch
        # The ids of the parts whose ids were all canonical and new to the batch, and where
        # their candidates begin: the names and digests of those candidates are owed to
        # `_first_seen` until a part that could repeat one of them comes (`_settle`).
        self._fresh_ids: list[set[str]] = []
        self._owed_from = 0

    def add(self, events: Iterable[LedgerEvent | tuple[str, str]]) -> None:
        """Prepare the next items of the batch, in order.

        A plain heartbeat (no pods, node or GPU count; an instant within the accepted window; a
        short printable uid; a canonical id), nearly every event of a working cluster, passes
        every check of `static_problem_of_uuid` by those conditions alone: its payload, digest
        and COPY row come from one call (`plain_heartbeat`) and its checks are not made again.
        Its candidate is the one the general path would make. The ids are checked for the
        canonical form, and turned into bytes, for all the items at once
        (`canonical_ids_bytes`); one at a time only when one of them is not. A part of canonical
        ids that repeats none of its own or of the batch's so far (`_fresh`) holds no duplicate:
        its plain heartbeats are not looked up among the ids seen, only owed to them
        (`_settle`)."""
        items = events if type(events) is list else list(events)
        outcomes, candidates, first_seen = self._outcomes, self._candidates, self._first_seen
        plain_uid, other = self._plain_uids.add, self._others.append
        event_ids, statuses = outcomes.event_ids, outcomes.statuses
        now_s, internal = self.now_s, self._internal
        stale, run_kinds, heartbeat = EventKind.STALE, RUN_KINDS, EventKind.HEARTBEAT
        sha256, canonical = hashlib.sha256, CANONICAL_UUID.match
        # `static_problem_of_uuid`'s window for the instant; a NaN fails both comparisons.
        earliest, latest = now_s - MAX_AGE_S, now_s + MAX_FUTURE_SKEW_S
        max_uid = MAX_UID_LEN
        ids = list(map(_FIRST, items))
        all_bytes = canonical_ids_bytes(ids)
        start = len(event_ids)
        event_ids += ids
        statuses += repeat(None, len(ids))
        # A part of canonical ids, none repeated in it or given before, has no duplicate: its
        # plain heartbeats are not looked up in `_first_seen`, only owed to it (`_settle`).
        fresh = all_bytes is not None and self._fresh(ids)
        new = tuple.__new__  # as `_candidate`, without the partial's call
        if not fresh:
            self._settle()
        # Each id's bytes when all are canonical; else none (b"", without end).
        raws = map(_FIRST, _ID16.iter_unpack(all_bytes)) if all_bytes is not None else repeat(b"")
        for i, item, raw in zip(range(start, start + len(items)), items, raws, strict=False):
            if type(item) is not LedgerEvent:
                outcomes.reject(i, item[1])
                continue
            # Unpacked from a plain tuple's copy: a named tuple is unpacked by an iterator.
            event_id, kind, at, uid, pods, node, count = item[:]
            if all_bytes is not None:  # every id canonical
                key: str | None = event_id
            else:
                # `canonical_event_id`: the canonical form recognised here, the rest goes there.
                key = event_id if canonical(event_id) else canonical_event_id(event_id)
            name = key or event_id  # what duplicates are found by
            plain = (
                kind is heartbeat
                and key is not None
                and not pods
                and not node
                and type(count) is int
                and count == 0
                and type(at) is float
                and at > 0.0
                and earliest <= at <= latest
                and len(uid) <= max_uid
                and uid.isprintable()
            )
            if plain:
                payload, digest, row = plain_heartbeat(raw or id_bytes(name), at, uid)
                if fresh:
                    candidates.append(new(Candidate, (i, item, key, payload, digest, row, None)))
                    plain_uid(uid)
                    continue
            else:
                payload = payload_json(item).encode()
                digest = sha256(payload).hexdigest()  # `payload_digest`, without a call per event
            seen = first_seen.get(name)
            if seen is not None:
                if seen == digest:
                    statuses[i] = EventStatus.DUPLICATE
                else:
                    outcomes.reject(i, REUSED)
                continue
            first_seen[name] = digest
            if plain:
                candidates.append(_candidate((i, item, key, payload, digest, row, None)))
                plain_uid(uid)
                continue
            # The sweeper's own events skip the checks meant for reports (see `_validate`);
            # still, only a UUID can be stored.
            if key is None:
                outcomes.reject(i, static_problem(item, now_s=now_s) or "")
                continue
            if not (internal and kind is stale):
                problem = static_problem_of_uuid(item, now_s=now_s)
                if problem:
                    outcomes.reject(i, problem)
                    continue
            read_back = (
                LedgerEvent(key, kind, stored_epoch_s(at), uid, pods) if kind in run_kinds else None
            )
            row = copy_row(key, uid, kind, at, payload, digest)
            candidate = _candidate((i, item, key, payload, digest, row, read_back))
            candidates.append(candidate)
            other(candidate)

    def _fresh(self, ids: list[str]) -> bool:
        """Whether `ids` (canonical) hold no id twice and none of an earlier part's; if so they
        are kept, for the parts that follow."""
        part = set(ids)
        if len(part) != len(ids) or not part.isdisjoint(self._first_seen):
            return False
        if not all(map(part.isdisjoint, self._fresh_ids)):
            return False
        self._fresh_ids.append(part)
        return True

    def _settle(self) -> None:
        """Write the owed names and digests into `_first_seen`, before a part that may repeat
        one of them: the candidates of the fresh parts, each under its canonical id (those
        not plain heartbeats are there already, with the same digest)."""
        candidates = self._candidates
        if self._fresh_ids:
            owed = candidates[self._owed_from :]
            self._first_seen.update(zip(map(_BY_ID, owed), map(_DIGEST, owed), strict=True))
            self._fresh_ids.clear()
        self._owed_from = len(candidates)

    def batch(self) -> PreparedBatch:
        return PreparedBatch(
            self.now_s,
            self._internal,
            self._outcomes,
            self._candidates,
            self._plain_uids,
            self._others,
        )
