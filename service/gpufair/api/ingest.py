"""Ledger.ReportEvents and Ledger.StreamEvents: events from protobuf to committed, and the reply.

ReportEvents calls that arrive together share a transaction: while one group of them is in the
database, the next calls wait, and the first of them then writes all that waited in one
(`GroupCommit`, `ingest_pipeline.write_group`): one read, one COPY, one set of writes and one
commit for the group instead of per call. Each caller is answered once the group's commit is
done, with the outcomes its message would get alone.

A stream is written one message after the other on one connection, each message in its own
transaction, which starts only after the previous one committed (its stops may pair with the
starts before it). What overlaps is work without the database. While the database reads for
message N, the outcomes of N-1 go into the reply; while it takes N's COPY, and while it applies
N's writes, message N+1, if it has arrived, is converted and prepared. One thread does all of it, so the parts do not contend for
the GIL (a writer thread beside this one was measured: no faster).

How much of N+1 to prepare during N's COPY, and how much during its writes, depends on the
events: a message of new runs has many writes, a message of heartbeats nearly none. The split is
balanced as the stream goes (`_Split`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from itertools import repeat
from operator import attrgetter, sub

from sqlalchemy import Connection, Engine

from gpufair.api.convert_ledger import events_from_proto
from gpufair.api.event_results import (
    SHORT,
    SHORT_HEAD,
    STATUS,
    STORED_TAIL,
    ReplyBudget,
    result_bytes,
)
from gpufair.api.group_commit import GroupCommit
from gpufair.api.prefetch import Pending, Prefetch
from gpufair.domain.errors import InvalidInputError, Violation
from gpufair.domain.ledger import LedgerEvent
from gpufair.domain.limits import MAX_EVENTS_PER_BATCH
from gpufair.metrics import observe_events
from gpufair.store import ingest_pipeline
from gpufair.store.ingest_pipeline import EventStatus, Outcomes
from gpufair.store.known_workloads import KnownWorkloads
from gpufair.v1 import ledger_pb2 as pb

Converted = LedgerEvent | tuple[str, str]

# Messages of concurrent ReportEvents calls written in one transaction at most: a process runs
# 32 calls at once by default (`serve --workers`), so a group seldom reaches it.
GROUP_MAX_MESSAGES = 32


@dataclass(slots=True)
class _Message:
    """One request on its way through ingestion."""

    converted: list[Converted]
    now_s: float
    batch: ingest_pipeline.PreparedBatch
    outcomes: Outcomes | None = None


def _report(reply: pb.ReportEventsResponse | EncodedReply, message: _Message) -> None:
    """Append the outcomes of a committed message to `reply`, and count them in the metrics.

    The results are appended as their encoded bytes, parsed by the protobuf runtime in one call:
    setting two fields on each of thousands of result objects cost the stream's thread more than
    encoding them (`result_bytes`). A stored event, nearly every one, has no error: its bytes
    are put together in place, without a call; and when every event of the message is stored,
    under ids of one length in ASCII (canonical UUIDs), the results are one join of the ids."""
    outcomes = message.outcomes
    if outcomes is None:
        raise RuntimeError("a message is reported only once written")
    statuses = outcomes.final()
    errors = outcomes.errors
    stored, head, tail = EventStatus.STORED, SHORT_HEAD, STORED_TAIL
    counts = {s: n for s in EventStatus if (n := statuses.count(s))}
    event_ids = outcomes.event_ids
    lengths = set(map(len, event_ids))
    if counts.get(stored, 0) == len(event_ids) and len(lengths) == 1:
        # Every event stored, and its ids of one length: canonical UUIDs, as clients send them.
        # If they are ASCII, each result is the same head, the id and the same tail, and the
        # whole is one join, in C.
        (n,) = lengths
        ids = "".join(event_ids)
        if n < SHORT and ids.isascii():
            between = (tail + head[n]).decode()
            reply.MergeFromString(head[n] + between.join(event_ids).encode() + tail)
            event_ids = []
    if event_ids:
        encoded = [
            head[len(eid)] + eid + tail
            if status is stored and len(eid := event_id.encode()) < SHORT
            else result_bytes(event_id, STATUS[status], errors.get(i))
            for i, (event_id, status) in enumerate(zip(event_ids, statuses, strict=True))
        ]
        reply.MergeFromString(b"".join(encoded))
    now_s = message.now_s
    candidates = message.batch.candidates
    if counts.get(stored, 0) == len(candidates):  # every candidate stored: in C
        lags = list(map(sub, repeat(now_s), map(_OCCURRED_AT, candidates)))
    else:
        lags = [now_s - c.event.occurred_at_s for c in candidates if statuses[c.position] is stored]
    observe_events(lags, {s.value: n for s, n in counts.items()})


_OCCURRED_AT = attrgetter("event.occurred_at_s")


class EncodedReply:
    """A ReportEventsResponse kept as its bytes in the protobuf wire format: what ingestion
    sends back, as grpc sends it (`ledger.add_ledger_to_server` registers the methods with a
    serializer that passes bytes on). `_report` appends results to it as to a message; the
    message's runtime would parse each part into result objects, only to encode them all again
    when the reply is sent (about 320 ns per event between the two)."""

    __slots__ = ("_parts",)

    def __init__(self) -> None:
        self._parts: list[bytes] = []

    def MergeFromString(self, data: bytes) -> None:
        """Append results encoded in the wire format, as the message's method does: a repeated
        field's entries that follow the ones before in the encoding follow them once parsed."""
        self._parts.append(data)

    def encoded(self) -> bytes:
        return b"".join(self._parts)


class _Split:
    """The share of message N+1 prepared while the database takes N's COPY; the rest is prepared
    while it applies N's writes. After each message the share moves a step toward the side where
    the thread waited longer for the database, so that it waits as little as it can in both."""

    STEP = 0.05

    def __init__(self, share: float = 0.5) -> None:
        self.share = share

    def update(self, copy_wait_s: float, writes_wait_s: float) -> None:
        if copy_wait_s > writes_wait_s:
            self.share = min(1.0, self.share + self.STEP)
        elif writes_wait_s > copy_wait_s:
            self.share = max(0.0, self.share - self.STEP)


class Ingest:
    """Ingestion for one server: its engine, clock and the workloads it has seen to exist."""

    def __init__(
        self, engine: Engine, clock: Callable[[], float] = time.time, *, writers: int = 2
    ) -> None:
        self.engine = engine
        self.clock = clock
        self.known = KnownWorkloads()
        self.group: GroupCommit[_Message] = GroupCommit(
            self.write_group, writers=writers, max_items=GROUP_MAX_MESSAGES
        )

    def unary(self, request: pb.ReportEventsRequest) -> bytes:
        """A message is committed before its reply, with the messages of concurrent calls that
        wait for a writer meanwhile (`GroupCommit`, `write_group`). The reply, a
        ReportEventsResponse, comes encoded (`EncodedReply`)."""
        reply = EncodedReply()
        message = self.prepare(request, "events")
        ReplyBudget().admit(message.batch.outcomes.event_ids, "events", 0)
        if message.batch.candidates:
            self.group.submit(message)
        else:  # nothing to store: every outcome is known already
            message.outcomes = message.batch.outcomes
        _report(reply, message)
        return reply.encoded()

    def write_group(self, messages: Sequence[_Message]) -> list[BaseException | None]:
        """Write `messages` (of concurrent calls), each committed before this returns; one entry
        per message: None once written, or the error it got. Those that can share a transaction
        (`ingest_pipeline.groupable`, no event id in common) go in one; the others, and all of
        them when the shared transaction cannot be committed as it is, each in its own, as if
        alone: an event of one caller never changes another's outcomes."""
        together, alone = _compose(messages)
        if len(together) > 1:
            with self.engine.connect() as conn:
                written = ingest_pipeline.write_group(
                    conn, [messages[i].batch for i in together], known=self.known
                )
            if written:
                for i in together:
                    messages[i].outcomes = messages[i].batch.outcomes
            else:
                alone = sorted(together + alone)
        else:
            alone = sorted(together + alone)
        errors: list[BaseException | None] = [None] * len(messages)
        for i in alone:
            try:
                self.write(messages[i])
            except Exception as error:
                errors[i] = error
        return errors

    def stream(self, requests: Iterator[pb.ReportEventsRequest]) -> bytes:
        """Each message is committed as it is written; the reply, a ReportEventsResponse
        encoded (`EncodedReply`), lists every event's outcome. If
        the stream breaks, what was committed stays, and a client resending everything is safe:
        stored events come back as duplicates. A message that could make the reply larger than
        gRPC sends is refused before it is written (`event_results.ReplyBudget`).

        A message's commit goes with its last writes, in one round trip. Committing several
        messages together was measured no faster (the commit overlaps the preparation of the
        next message already), and a transaction that kept one message's row locks while
        taking the next one's could deadlock with another stream's."""
        reply = EncodedReply()
        inbox: Prefetch[pb.ReportEventsRequest] = Prefetch(requests)
        split = _Split()
        try:
            message = self.next_message(inbox, 0)
            if message is None:
                return reply.encoded()
            # One connection for the whole stream: a checkout per message would cost a round
            # trip (the pool's liveness check) each time.
            with self.engine.connect() as conn:
                n, replaying, unreported = 0, False, None
                budget = ReplyBudget()
                while message is not None:
                    budget.admit(message.batch.outcomes.event_ids, f"messages[{n}]", n)
                    ahead = _Ahead(self, inbox, n + 1, reply, unreported, split.share)
                    self.write_in(conn, message, replaying, ahead)
                    budget.spend(message.batch.outcomes)
                    ahead.written()
                    if ahead.waits is not None:
                        split.update(*ahead.waits)
                    ahead.report_previous()
                    unreported = message
                    # A client resending a stream that broke sends what is stored already: once
                    # a message had duplicates, expect more rather than try a COPY bound to fail.
                    replaying = message.outcomes is not None and (
                        EventStatus.DUPLICATE in message.outcomes.statuses
                    )
                    n += 1
                    message = ahead.following()
            if unreported is not None:
                _report(reply, unreported)
        finally:
            inbox.close()
        return reply.encoded()

    def start(self, request: pb.ReportEventsRequest, field: str) -> ingest_pipeline.Preparation:
        if len(request.events) > MAX_EVENTS_PER_BATCH:
            raise InvalidInputError(
                [Violation(field, f"at most {MAX_EVENTS_PER_BATCH} events per message")]
            )
        return ingest_pipeline.Preparation(self.clock())

    @staticmethod
    def convert(
        events: Iterable[pb.LedgerEvent],
        converted: list[Converted],
        preparation: ingest_pipeline.Preparation,
    ) -> None:
        """Append `events` as domain events, or (event_id, why not) for those that cannot be
        one, to `converted`, and prepare them."""
        part = events_from_proto(events)
        converted.extend(part)
        preparation.add(part)

    def prepare(self, request: pb.ReportEventsRequest, field: str) -> _Message:
        """The part of ingesting a message that needs no database."""
        preparation = self.start(request, field)
        converted: list[Converted] = []
        self.convert(request.events, converted, preparation)
        return _Message(converted, preparation.now_s, preparation.batch())

    def next_message(self, inbox: Prefetch[pb.ReportEventsRequest], n: int) -> _Message | None:
        request = inbox.take(wait=True)
        if request is None or request is Pending.NOT_YET:
            return None
        return self.prepare(request, f"messages[{n}].events")

    def write(self, message: _Message) -> None:
        """Write and commit `message` in a transaction of its own."""
        with self.engine.connect() as conn:
            self.write_in(conn, message)

    def write_in(
        self,
        conn: Connection,
        message: _Message,
        expect_duplicates: bool = False,
        overlap: ingest_pipeline.Overlap | None = None,
    ) -> None:
        """Write and commit `message` in a transaction of its own on `conn`."""
        message.outcomes = ingest_pipeline.write(
            conn,
            message.batch,
            expect_duplicates=expect_duplicates,
            overlap=overlap,
            commit=True,
            known=self.known,
        )
        conn.commit()  # what `write` left to commit, if anything; acknowledged only after


def _compose(messages: Sequence[_Message]) -> tuple[list[int], list[int]]:
    """The positions of the messages that can share a transaction, and of the rest: a message
    with an event id of one before it in the group would be a duplicate or a reuse of it, which
    only a transaction after that one's tells apart, so it goes alone, after them."""
    together: list[int] = []
    alone: list[int] = []
    ids: set[str] = set()
    for i, message in enumerate(messages):
        batch = message.batch
        mine = {c.event_id for c in batch.candidates}
        if ingest_pipeline.groupable(batch) and ids.isdisjoint(mine):
            together.append(i)
            ids |= mine
        else:
            alone.append(i)
    return together, alone


class _Ahead(ingest_pipeline.Overlap):
    """A stream's work while message N is in the database: the outcomes of message N-1,
    committed already, go into the reply, and message N+1, if it has arrived, is converted and
    prepared: `share` of it during N's COPY, the rest during N's writes and commit (half of it
    each, when an overlap check makes the commit wait on its own). What goes wrong with
    N+1 is kept, and raised by `following` once N is committed. It also times how long the
    thread waited for the database after each of the two, for `_Split`."""

    def __init__(
        self,
        ingest: Ingest,
        inbox: Prefetch[pb.ReportEventsRequest],
        n: int,
        reply: EncodedReply,
        previous: _Message | None,
        share: float,
    ) -> None:
        self._ingest, self._inbox, self._n = ingest, inbox, n
        self._reply, self._previous, self._share = reply, previous, share
        self._taken = False
        self._request: pb.ReportEventsRequest | None = None
        self._converted: list[Converted] = []
        self._preparation: ingest_pipeline.Preparation | None = None
        self._error: Exception | None = None
        self._marks: dict[str, float] = {}
        self.waits: tuple[float, float] | None = None  # (after the COPY's share, after the rest)

    def report_previous(self) -> None:
        if self._previous is not None:
            _report(self._reply, self._previous)
            self._previous = None

    def reading(self) -> None:
        self.report_previous()

    def copying(self) -> None:
        self._advance(self._share)
        self._marks["copying"] = time.perf_counter()

    def copied(self) -> None:
        self._marks["copied"] = time.perf_counter()

    def writing(self) -> None:
        # Half of what is left; the rest during the commit, which follows at once when it
        # travels with the writes, and is a wait of its own after an overlap check.
        self._advance((1.0 + self._share) / 2)

    def committing(self) -> None:
        self._advance(1.0)
        self._marks["writing"] = time.perf_counter()

    def written(self) -> None:
        marks = self._marks
        if marks.keys() >= {"copying", "copied", "writing"}:
            self.waits = (
                marks["copied"] - marks["copying"],
                time.perf_counter() - marks["writing"],
            )

    def following(self) -> _Message | None:
        """Message N+1 prepared (waiting for it if need be), or None once the stream ended."""
        if self._error is not None:
            raise self._error  # about message N+1, now that the ones before are committed
        if not self._taken:
            return self._ingest.next_message(self._inbox, self._n)
        if self._request is None:
            return None  # the stream ended
        self._advance(1.0)
        if self._error is not None:
            raise self._error
        if self._preparation is None:
            raise RuntimeError("a message taken was left unprepared")
        return _Message(self._converted, self._preparation.now_s, self._preparation.batch())

    def _advance(self, share: float) -> None:
        """Convert and prepare message N+1 up to `share` of its events, if it has arrived."""
        try:
            if not self._taken:
                request = self._inbox.take(wait=False)
                if request is Pending.NOT_YET:
                    return
                self._taken, self._request = True, request
            if self._request is None:
                return
            if self._preparation is None:
                self._preparation = self._ingest.start(self._request, f"messages[{self._n}].events")
            events = self._request.events
            done, upto = len(self._converted), math.ceil(len(events) * share)
            if upto > done:
                self._ingest.convert(events[done:upto], self._converted, self._preparation)
        except Exception as error:
            self._error = error
