"""Ledger: event ingestion (unary batch and client stream) and the read side of fair share."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import grpc
from sqlalchemy import Engine

from gpufair.api.convert_ledger import event_from_proto
from gpufair.api.prefetch import Pending, Prefetch
from gpufair.api.usage import get_usage
from gpufair.domain.errors import InvalidInputError, NotFound, Violation
from gpufair.domain.ledger import LedgerEvent
from gpufair.jobs.recompute import pool_of, recompute_pool
from gpufair.metrics import observe_events
from gpufair.store import config_repo, fairshare_repo, ledger_repo
from gpufair.store.fairshare_repo import StoredShare
from gpufair.store.ledger_repo import EventStatus, Outcomes
from gpufair.v1 import fairshare_pb2, ledger_pb2_grpc
from gpufair.v1 import ledger_pb2 as pb

MAX_EVENTS_PER_BATCH = 50_000
MAX_HISTORY_POINTS = 100_000
_STATUS = {
    EventStatus.STORED: pb.EVENT_STATUS_STORED,
    EventStatus.DUPLICATE: pb.EVENT_STATUS_DUPLICATE,
    EventStatus.REJECTED: pb.EVENT_STATUS_REJECTED,
}


Converted = LedgerEvent | tuple[str, str]


@dataclass(slots=True)
class _Message:
    """One request on its way through ingestion."""

    converted: list[Converted]
    now_s: float
    batch: ledger_repo.PreparedBatch
    outcomes: Outcomes | None = None


def _report(reply: pb.ReportEventsResponse, message: _Message) -> None:
    """Append the message's outcomes to `reply` and count them in the metrics."""
    outcomes = message.outcomes
    if outcomes is None:
        raise RuntimeError("a message is reported only once written")
    statuses = outcomes.final()
    add, errors, stored = reply.results.add, outcomes.errors, EventStatus.STORED
    lags: list[float] = []
    for i, (item, event_id, status) in enumerate(
        zip(message.converted, outcomes.event_ids, statuses, strict=True)
    ):
        if status is stored:
            add(event_id=event_id, status=pb.EVENT_STATUS_STORED)
            if isinstance(item, LedgerEvent):
                lags.append(message.now_s - item.occurred_at_s)
        elif i in errors:
            add(event_id=event_id, status=_STATUS[status], error=errors[i])
        else:
            add(event_id=event_id, status=_STATUS[status])
    observe_events(lags, Counter(s.value for s in statuses))


def share_to_proto(s: StoredShare) -> fairshare_pb2.QueueShare:
    msg = fairshare_pb2.QueueShare(
        queue=s.queue,
        parent=s.parent or "",
        priority=s.priority,
        deserved_cu=s.deserved_cu,
        demand_cu=s.demand_cu,
        allocated_cu=s.allocated_cu,
        weight_share=s.weight_share,
        usage_share=s.usage_share,
        priority_weight=s.priority_weight,
        effective_weight=s.effective_weight,
        fair_share_cu=s.fair_share_cu,
        decayed_usage_cu_s=s.decayed_usage_cu_s,
        fair_share_gpus_by_type=s.fair_share_gpus_by_type,
    )
    if s.limit_cu is not None:
        msg.limit_cu = s.limit_cu
    return msg


def _seconds(ts: Any, default: float) -> float:
    if ts.seconds == 0 and ts.nanos == 0:
        return default
    return float(ts.seconds + ts.nanos / 1e9)


class _Ahead:
    """A stream's work while message N is in the database (see `LedgerServicer.StreamEvents`):
    the outcomes of message N-1, committed already, go into the reply, and message N+1 is taken
    if it has arrived, converted, then prepared. What goes wrong with N+1 is kept, and raised by
    `following` once N is committed."""

    def __init__(
        self,
        servicer: LedgerServicer,
        inbox: Prefetch[pb.ReportEventsRequest],
        n: int,
        reply: pb.ReportEventsResponse,
        previous: _Message | None,
    ) -> None:
        self._servicer, self._inbox, self._n = servicer, inbox, n
        self._reply, self._previous = reply, previous
        self._taken = False
        self._request: pb.ReportEventsRequest | None = None
        self._converted: list[Converted] | None = None
        self._message: _Message | None = None
        self._error: Exception | None = None

    def report_previous(self) -> None:
        if self._previous is not None:
            _report(self._reply, self._previous)
            self._previous = None

    def reading(self) -> None:
        self.report_previous()

    def copying(self) -> None:
        try:
            self._take()
            self._convert()
        except Exception as error:
            self._error = error

    def writing(self) -> None:
        try:
            self._take()
            self._convert()
            if self._converted is not None and self._message is None:
                self._message = self._servicer._prepare(self._converted)
        except Exception as error:
            self._error = error

    def following(self) -> _Message | None:
        """Message N+1 prepared (waiting for it if need be), or None once the stream ended."""
        if self._error is not None:
            raise self._error  # about message N+1, now that the ones before are committed
        if self._message is not None:
            return self._message
        if not self._taken:
            return self._servicer._next_message(self._inbox, self._n)
        self._convert()
        if self._converted is None:
            return None  # the stream ended
        return self._servicer._prepare(self._converted)

    def _take(self) -> None:
        if not self._taken:
            request = self._inbox.take(wait=False)
            if request is not Pending.NOT_YET:
                self._taken, self._request = True, request

    def _convert(self) -> None:
        if self._request is not None and self._converted is None:
            self._converted = self._servicer._convert(self._request, f"messages[{self._n}].events")


class LedgerServicer(ledger_pb2_grpc.LedgerServicer):
    def __init__(self, engine: Engine, clock: Callable[[], float] = time.time) -> None:
        self.engine = engine
        self.clock = clock

    def _convert(self, request: pb.ReportEventsRequest, field: str) -> list[Converted]:
        """The request's events as domain events, or (event_id, why not) for those that cannot
        be one."""
        if len(request.events) > MAX_EVENTS_PER_BATCH:
            raise InvalidInputError(
                [Violation(field, f"at most {MAX_EVENTS_PER_BATCH} events per message")]
            )
        converted: list[Converted] = []
        for msg in request.events:
            event = event_from_proto(msg)
            converted.append((msg.event_id, event) if isinstance(event, str) else event)
        return converted

    def _prepare(self, converted: list[Converted]) -> _Message:
        """The part of ingesting a message that needs no database."""
        now_s = self.clock()
        return _Message(converted, now_s, ledger_repo.prepare(converted, now_s))

    def _write(
        self,
        message: _Message,
        expect_duplicates: bool = False,
        overlap: ledger_repo.Overlap | None = None,
    ) -> None:
        with self.engine.connect() as conn:
            message.outcomes = ledger_repo.write(
                conn,
                message.batch,
                expect_duplicates=expect_duplicates,
                overlap=overlap,
                commit=True,
            )
            conn.commit()  # what `write` left to commit, if anything; acknowledged only after

    def ReportEvents(
        self, request: pb.ReportEventsRequest, context: grpc.ServicerContext
    ) -> pb.ReportEventsResponse:
        reply = pb.ReportEventsResponse()
        message = self._prepare(self._convert(request, "events"))
        self._write(message)
        _report(reply, message)
        return reply

    def StreamEvents(
        self, request_iterator: Iterator[pb.ReportEventsRequest], context: grpc.ServicerContext
    ) -> pb.ReportEventsResponse:
        """Each message is committed as it arrives; the reply lists every event's outcome. If the
        stream breaks, what was committed stays, and a client resending everything is safe:
        stored events come back as duplicates.

        Messages are written one after the other, each in its own transaction, and a message's
        transaction starts only after the previous one committed (its events may be the starts
        the next message's stops pair with). What overlaps is work without the database: while
        the database reads for message N, the outcomes of N-1 go into the reply; while it takes
        N's COPY, message N+1, if it has arrived, is converted; while it applies N's writes and
        commits, N+1 is checked and encoded. One thread does all of it, so the parts do not
        contend for the GIL (a writer thread beside this one was measured: no faster).
        """
        reply = pb.ReportEventsResponse()
        inbox: Prefetch[pb.ReportEventsRequest] = Prefetch(request_iterator)
        try:
            message = self._next_message(inbox, 0)
            n, replaying, unreported = 0, False, None
            while message is not None:
                ahead = _Ahead(self, inbox, n + 1, reply, unreported)
                self._write(message, replaying, ahead)
                ahead.report_previous()
                unreported = message
                # A client resending a stream that broke sends what is stored already: once a
                # message had duplicates, expect more rather than try a COPY bound to fail.
                replaying = message.outcomes is not None and (
                    EventStatus.DUPLICATE in message.outcomes.statuses
                )
                n += 1
                message = ahead.following()
            if unreported is not None:
                _report(reply, unreported)
        finally:
            inbox.close()
        return reply

    def _next_message(self, inbox: Prefetch[pb.ReportEventsRequest], n: int) -> _Message | None:
        request = inbox.take(wait=True)
        if request is None or request is Pending.NOT_YET:
            return None
        return self._prepare(self._convert(request, f"messages[{n}].events"))

    def GetFairShare(
        self, request: pb.GetFairShareRequest, context: grpc.ServicerContext
    ) -> pb.GetFairShareResponse:
        """The latest recompute of the pool; the first call for a pool computes it."""
        if not request.pool:
            raise InvalidInputError([Violation("pool", "is required")])
        with self.engine.connect() as conn:
            run = fairshare_repo.latest_run(conn, request.pool)
            if run is None:
                pool_of(config_repo.load_config(conn), request.pool)  # NOT_FOUND if unknown
                recompute_pool(conn, request.pool, self.clock())
                conn.commit()
                run = fairshare_repo.latest_run(conn, request.pool)
        if run is None:
            raise NotFound("fair share of pool", request.pool)
        reply = pb.GetFairShareResponse(
            pool=run.pool,
            capacity_cu=run.capacity_cu,
            queues=[share_to_proto(s) for s in run.shares],
        )
        reply.computed_at.FromNanoseconds(round(run.computed_at_s * 1e9))
        return reply

    def GetFairShareHistory(
        self, request: pb.GetFairShareHistoryRequest, context: grpc.ServicerContext
    ) -> pb.GetFairShareHistoryResponse:
        if not request.pool:
            raise InvalidInputError([Violation("pool", "is required")])
        now_s = self.clock()
        since_s = _seconds(request.since, now_s - 86400.0)
        until_s = _seconds(request.until, now_s)
        if since_s > until_s:
            raise InvalidInputError([Violation("since", "is after until")])
        with self.engine.connect() as conn:
            points = fairshare_repo.history(
                conn, request.pool, request.queue or None, since_s, until_s, MAX_HISTORY_POINTS
            )
        reply = pb.GetFairShareHistoryResponse()
        for s in points:
            point = reply.points.add(share=share_to_proto(s))
            point.computed_at.FromNanoseconds(round(s.computed_at_s * 1e9))
        return reply

    def GetUsage(
        self, request: pb.GetUsageRequest, context: grpc.ServicerContext
    ) -> pb.GetUsageResponse:
        return get_usage(self.engine, request, self.clock())
