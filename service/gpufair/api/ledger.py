"""Ledger: event ingestion (unary batch and client stream) and the read side of fair share."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import grpc
from sqlalchemy import Engine

from gpufair.api.convert_ledger import event_from_proto
from gpufair.domain.errors import InvalidInput, Violation
from gpufair.domain.ledger import LedgerEvent
from gpufair.store import ledger_repo
from gpufair.store.ledger_repo import EventOutcome, EventStatus
from gpufair.v1 import ledger_pb2 as pb
from gpufair.v1 import ledger_pb2_grpc

MAX_EVENTS_PER_BATCH = 50_000
_STATUS = {
    EventStatus.STORED: pb.EVENT_STATUS_STORED,
    EventStatus.DUPLICATE: pb.EVENT_STATUS_DUPLICATE,
    EventStatus.REJECTED: pb.EVENT_STATUS_REJECTED,
}


def _results(outcomes: list[EventOutcome]) -> list[pb.EventResult]:
    return [
        pb.EventResult(event_id=o.event_id, status=_STATUS[o.status], error=o.error)
        for o in outcomes
    ]


class LedgerServicer(ledger_pb2_grpc.LedgerServicer):
    def __init__(self, engine: Engine, clock: Callable[[], float] = time.time) -> None:
        self.engine = engine
        self.clock = clock

    def _ingest(self, request: pb.ReportEventsRequest, field: str) -> list[pb.EventResult]:
        if len(request.events) > MAX_EVENTS_PER_BATCH:
            raise InvalidInput(
                [Violation(field, f"at most {MAX_EVENTS_PER_BATCH} events per message")]
            )
        converted: list[LedgerEvent | tuple[str, str]] = []
        for msg in request.events:
            event = event_from_proto(msg)
            converted.append((msg.event_id, event) if isinstance(event, str) else event)
        with self.engine.connect() as conn:
            outcomes = ledger_repo.ingest(conn, converted, self.clock())
            conn.commit()  # acknowledged only once this returns
        return _results(outcomes)

    def ReportEvents(
        self, request: pb.ReportEventsRequest, context: grpc.ServicerContext
    ) -> pb.ReportEventsResponse:
        return pb.ReportEventsResponse(results=self._ingest(request, "events"))

    def StreamEvents(
        self, request_iterator: Iterator[pb.ReportEventsRequest], context: grpc.ServicerContext
    ) -> pb.ReportEventsResponse:
        """Each message is committed as it arrives; the reply lists every event's outcome. If the
        stream breaks, what was committed stays, and a client resending everything is safe:
        stored events come back as duplicates."""
        reply = pb.ReportEventsResponse()
        for n, request in enumerate(request_iterator):
            reply.results.extend(self._ingest(request, f"messages[{n}].events"))
        return reply
