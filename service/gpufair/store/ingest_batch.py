"""A batch of events on its way into the ledger (`ingest_pipeline`): what `prepare` makes of it
(`PreparedBatch`: a `Candidate` per event that may be stored), the outcome of each of its items
(`Outcomes`), and the hooks through which the caller does work of its own while `write` waits
for the database (`Overlap`). The getters at the end read candidates and events in the C loops
(`map`, `filter`, `sorted`) of the steps that follow.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from operator import attrgetter
from typing import NamedTuple, cast

from gpufair.domain.ledger import LedgerEvent


class EventStatus(enum.StrEnum):
    STORED = "stored"
    DUPLICATE = "duplicate"
    REJECTED = "rejected"


@dataclass(frozen=True, slots=True)
class EventOutcome:
    event_id: str
    status: EventStatus
    error: str = ""


REUSED = "event_id reused with a different payload"


class Outcomes:
    """The outcome of each item of a batch, as a status per item and the reasons of the rejected
    ones: an object per event would cost more (to make and to garbage-collect) than it says."""

    __slots__ = ("errors", "event_ids", "statuses")

    def __init__(self, event_ids: list[str]) -> None:
        self.event_ids = event_ids
        self.statuses: list[EventStatus | None] = [None] * len(event_ids)
        self.errors: dict[int, str] = {}

    def reject(self, index: int, error: str) -> None:
        self.statuses[index] = EventStatus.REJECTED
        self.errors[index] = error

    def final(self) -> list[EventStatus]:
        """The statuses, once every item has one."""
        if None in self.statuses:
            raise RuntimeError("an item of the batch was left without an outcome")
        return cast("list[EventStatus]", self.statuses)

    def as_list(self) -> list[EventOutcome]:
        return [
            EventOutcome(event_id, status, self.errors.get(i, ""))
            for i, (event_id, status) in enumerate(zip(self.event_ids, self.final(), strict=True))
        ]


class Candidate(NamedTuple):
    """An event that passed the checks `prepare` can make."""

    position: int  # its place in the batch
    event: LedgerEvent  # as received
    event_id: str  # canonical id
    payload: bytes
    digest: str
    copy_row: bytes  # its row of the COPY
    # Run events: the event as it will read back from the database (PostgreSQL's id text and
    # microsecond instant), so that runs come out the same whichever batch an event arrived in.
    read_back: LedgerEvent | None


class Overlap:
    """Work of the caller's that needs no database, done while `write` waits for it. Each hook
    is called at most once, in the order below, from the thread that called `write`; what was
    not called (a batch with nothing to store, a replay), the caller does after `write` returns.
    They must not touch the connection. This base does nothing; a stream overrides them."""

    def reading(self) -> None:
        """While the database reads what the batch needs."""

    def copying(self) -> None:
        """While the database takes the batch's COPY."""

    def copied(self) -> None:
        """The COPY is done (a mark in time, for a caller that measures its waits)."""

    def writing(self) -> None:
        """While the database applies the batch's writes."""

    def committing(self) -> None:
        """While the database commits (called right after `writing` when the commit travels
        with the writes; later, on its own, when it waits for the overlap check's answer)."""


@dataclass(slots=True)
class PreparedBatch:
    now_s: float
    internal: bool
    outcomes: Outcomes
    candidates: list[Candidate]
    # What `Preparation` saw of the candidates as it went, so that the steps after it need not
    # walk thousands of heartbeats again: the workloads of the plain heartbeats among them (no
    # pods, node or GPU count), and the other candidates, in order. `others` None: not known,
    # every candidate counts as other (and `plain_uids` is empty).
    plain_uids: set[str] = field(default_factory=set)
    others: list[Candidate] | None = None

    def not_plain(self) -> list[Candidate]:
        """The candidates that are not among the plain heartbeats of `plain_uids`, in order."""
        return self.candidates if self.others is None else self.others


_BY_ID = attrgetter("event_id")
_EVENT, _KIND, _UID = attrgetter("event"), attrgetter("kind"), attrgetter("workload_uid")
_NODE, _PODS = attrgetter("node"), attrgetter("pods")
_DIGEST = attrgetter("digest")
_POSITION, _ROW, _READ_BACK = (
    attrgetter("position"),
    attrgetter("copy_row"),
    attrgetter("read_back"),
)
