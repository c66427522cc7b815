"""Ledger: event ingestion (unary batch and client stream, in `ingest`) and the read side of fair
share."""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable, Iterator, Sequence
from typing import Any, cast

import grpc
from sqlalchemy import Engine

from gpufair.api.ingest import Ingest
from gpufair.api.read_cache import ReadCache
from gpufair.api.usage import get_usage
from gpufair.domain.errors import InvalidInputError, NotFound, Violation
from gpufair.domain.request_rules import name_violations, time_range_violations
from gpufair.domain.stored_limits import within_limits
from gpufair.services.recompute import history_warnings, recompute_pool
from gpufair.store import config_repo, fairshare_repo
from gpufair.store.commit_watch import key_commit_count
from gpufair.store.fairshare_repo import StoredShare
from gpufair.store.read_versions import KeyReader
from gpufair.v1 import fairshare_pb2, ledger_pb2_grpc
from gpufair.v1 import ledger_pb2 as pb

SERVICE = "gpufair.v1.Ledger"

MAX_HISTORY_POINTS = 100_000


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


def _fields(ts: Any) -> tuple[int, int]:
    return int(ts.seconds), int(ts.nanos)


def _instant(ts: Any) -> float:
    """A set Timestamp as seconds: the epoch itself (0, 0) included."""
    return float(ts.seconds + ts.nanos / 1e9)


class LedgerServicer(ledger_pb2_grpc.LedgerServicer):
    def __init__(
        self,
        engine: Engine,
        clock: Callable[[], float] = time.time,
        fair_shares: ReadCache[str, pb.GetFairShareResponse] | None = None,
        keys: KeyReader | None = None,
    ) -> None:
        self.engine = engine
        self.clock = clock
        self.ingest = Ingest(engine, clock)
        # GetFairShare's replies per pool, current with what any replica committed.
        self.keys = keys if keys is not None else KeyReader(engine)
        self.fair_shares = (
            fair_shares if fair_shares is not None else ReadCache(key_commit_count(engine))
        )

    def ReportEvents(  # type: ignore[override]  # bytes: `add_ledger_to_server`
        self, request: pb.ReportEventsRequest, context: grpc.ServicerContext
    ) -> bytes:
        """The ReportEventsResponse, encoded: served by `add_ledger_to_server`'s handlers."""
        return self.ingest.unary(request)

    def StreamEvents(  # type: ignore[override]  # bytes: `add_ledger_to_server`
        self, request_iterator: Iterator[pb.ReportEventsRequest], context: grpc.ServicerContext
    ) -> bytes:
        """See `gpufair.api.ingest`; the reply as for ReportEvents."""
        return self.ingest.stream(request_iterator)

    def GetFairShare(
        self, request: pb.GetFairShareRequest, context: grpc.ServicerContext
    ) -> pb.GetFairShareResponse:
        """The latest recompute of the pool, from memory (`api/read_cache.py`); the first call
        for a pool computes it. The reply is shared: nothing may change it."""
        violations = name_violations("pool", request.pool)
        if violations:
            raise InvalidInputError(violations)
        return self.fair_shares.get(
            request.pool,
            lambda held: self._fair_share(request.pool, held),
            context.time_remaining,
        )

    def _fair_share(
        self, pool: str, held: Hashable
    ) -> tuple[Hashable, pb.GetFairShareResponse | None]:
        """The check of `fair_shares` (`api/read_cache.py`): the key of the pool's latest run and
        config version, and the reply when the key is not `held`. The key is read before what
        it names, so a reply is never older than its key."""
        version = self.keys.fair_share_key(pool)
        if version == held:
            return version, None
        with self.engine.connect() as conn:
            if version[0] is None:
                config_repo.load_config(conn).pool(pool)  # NOT_FOUND if unknown
                warnings: Sequence[str] = recompute_pool(conn, pool, self.clock()).warnings
                conn.commit()
                version = self.keys.fair_share_key(pool)
                run = fairshare_repo.latest_run(conn, pool)
            else:
                run = fairshare_repo.latest_run(conn, pool)
                config, clamped = within_limits(config_repo.load_config(conn))
                pools = [p for p in config.pools if p.name == pool]
                warnings = (
                    *clamped,
                    *(history_warnings(conn, pools[0], self.clock()) if pools else ()),
                )
            conn.rollback()
        if run is None:
            raise NotFound("fair share of pool", pool)
        reply = pb.GetFairShareResponse(
            pool=run.pool,
            capacity_cu=run.capacity_cu,
            queues=[share_to_proto(s) for s in run.shares],
            warnings=warnings,
        )
        reply.computed_at.FromNanoseconds(round(run.computed_at_s * 1e9))
        return version, reply

    def GetFairShareHistory(
        self, request: pb.GetFairShareHistoryRequest, context: grpc.ServicerContext
    ) -> pb.GetFairShareHistoryResponse:
        """The pool's points in [since, until] (unset: until now, since a day before until),
        whole: a range with more than MAX_HISTORY_POINTS is refused, never cut short. A pool or
        queue that is neither configured nor in the history is NOT_FOUND."""
        violations = name_violations("pool", request.pool)
        violations += name_violations("queue", request.queue, required=False)
        violations += time_range_violations(
            _fields(request.since) if request.HasField("since") else None,
            _fields(request.until) if request.HasField("until") else None,
        )
        if violations:
            raise InvalidInputError(violations)
        until_s = _instant(request.until) if request.HasField("until") else self.clock()
        since_s = _instant(request.since) if request.HasField("since") else until_s - 86400.0
        if since_s > until_s:
            raise InvalidInputError([Violation("since", "is after until (now when unset)")])
        with self.engine.connect() as conn:
            points = fairshare_repo.history(
                conn, request.pool, request.queue or None, since_s, until_s, MAX_HISTORY_POINTS + 1
            )
            if not points:
                if not fairshare_repo.pool_known(conn, request.pool):
                    raise NotFound("pool", request.pool)
                if request.queue and not fairshare_repo.queue_known(
                    conn, request.pool, request.queue
                ):
                    raise NotFound("queue", request.queue)
            conn.rollback()
        if len(points) > MAX_HISTORY_POINTS:
            raise InvalidInputError(
                [
                    Violation(
                        "since",
                        f"more than {MAX_HISTORY_POINTS} points; narrow since/until or name a "
                        "queue",
                    )
                ]
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


def _encoded(reply: bytes | pb.ReportEventsResponse) -> bytes:
    """The ingest methods' reply serializer: their reply is encoded already."""
    return reply if isinstance(reply, bytes) else reply.SerializeToString()


def add_ledger_to_server(servicer: LedgerServicer, server: grpc.Server) -> None:
    """`ledger_pb2_grpc.add_LedgerServicer_to_server`, but ReportEvents and StreamEvents send the
    bytes their handlers return as they are (`ingest.EncodedReply`) instead of serializing a
    message."""
    unary, stream = grpc.unary_unary_rpc_method_handler, grpc.stream_unary_rpc_method_handler
    handlers = {
        "ReportEvents": unary(
            servicer.ReportEvents,
            request_deserializer=pb.ReportEventsRequest.FromString,
            response_serializer=_encoded,
        ),
        "StreamEvents": stream(
            servicer.StreamEvents,
            request_deserializer=pb.ReportEventsRequest.FromString,
            response_serializer=_encoded,
        ),
        "GetFairShare": unary(
            servicer.GetFairShare,
            request_deserializer=pb.GetFairShareRequest.FromString,
            response_serializer=pb.GetFairShareResponse.SerializeToString,
        ),
        "GetFairShareHistory": unary(
            servicer.GetFairShareHistory,
            request_deserializer=pb.GetFairShareHistoryRequest.FromString,
            response_serializer=pb.GetFairShareHistoryResponse.SerializeToString,
        ),
        "GetUsage": unary(
            servicer.GetUsage,
            request_deserializer=pb.GetUsageRequest.FromString,
            response_serializer=pb.GetUsageResponse.SerializeToString,
        ),
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
    # As the generated code registers them too; grpc's type stubs do not list the method yet.
    cast("Any", server).add_registered_method_handlers(SERVICE, handlers)
