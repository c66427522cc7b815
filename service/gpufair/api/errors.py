"""One place that turns exceptions into gRPC statuses.

A caller's mistake is never UNKNOWN or INTERNAL: bad input is INVALID_ARGUMENT with one field
violation per problem (google.rpc.BadRequest), unknown names NOT_FOUND, a database that cannot be
reached UNAVAILABLE (retry later; nothing was acknowledged), a statement cancelled by its timeout
or by the call's deadline DEADLINE_EXCEEDED, a stream that ended under its handler (the client
gone, or the server stopping) CANCELLED. Only a bug in gpufair is INTERNAL, with a reference to
the server log line that has the traceback.
"""

from __future__ import annotations

import logging
import uuid

import grpc
import psycopg
import sqlalchemy.exc
from google.protobuf import any_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_status import rpc_status

from gpufair.domain.errors import (
    Conflict,
    DomainError,
    FailedPrecondition,
    InvalidInputError,
    NotFound,
    Violation,
)
from gpufair.domain.limits import MAX_MESSAGE_CHARS, capped, shorten
from gpufair.store.deadline import DeadlineExceeded

log = logging.getLogger(__name__)


def bad_request_status(message: str, violations: tuple[Violation, ...]) -> status_pb2.Status:
    """INVALID_ARGUMENT with the violations as google.rpc.BadRequest, capped (domain/limits.py):
    the status travels in the trailing metadata, whose size gRPC limits (a client sees only
    RESOURCE_EXHAUSTED beyond about 8 KiB), so a thousand violations become twenty and one
    "and N more" entry, and no entry quotes much of the input."""
    details = error_details_pb2.BadRequest(
        field_violations=[
            error_details_pb2.BadRequest.FieldViolation(field=v.field_path, description=v.message)
            for v in capped(violations)
        ]
    )
    packed = any_pb2.Any()
    packed.Pack(details)
    return status_pb2.Status(
        code=code_pb2.INVALID_ARGUMENT,
        message=shorten(message, MAX_MESSAGE_CHARS),
        details=[packed],
    )


def _is_database_outage(exc: BaseException) -> bool:
    if isinstance(exc, sqlalchemy.exc.DBAPIError) and exc.connection_invalidated:
        return True
    if isinstance(
        exc,
        sqlalchemy.exc.OperationalError
        | sqlalchemy.exc.TimeoutError
        | sqlalchemy.exc.InterfaceError
        | psycopg.OperationalError
        | psycopg.InterfaceError
        | ConnectionError,
    ):
        return True
    orig = getattr(exc, "orig", None)
    return isinstance(orig, psycopg.OperationalError | psycopg.InterfaceError)


def _is_bad_value(exc: BaseException) -> bool:
    orig = getattr(exc, "orig", exc)
    return isinstance(orig, psycopg.DataError) or isinstance(exc, psycopg.DataError)


def _is_timeout(exc: BaseException) -> bool:
    """A statement or lock timeout, or the call's deadline reached (store/deadline.py)."""
    if isinstance(exc, DeadlineExceeded):
        return True
    orig = getattr(exc, "orig", exc)
    return isinstance(orig, psycopg.errors.QueryCanceled | psycopg.errors.LockNotAvailable)


def abort_for(exc: BaseException, context: grpc.ServicerContext, method: str) -> None:
    """Abort the call with the status `exc` deserves. Always raises."""
    if isinstance(exc, InvalidInputError):
        context.abort_with_status(
            rpc_status.to_status(bad_request_status(str(exc), exc.violations))
        )
    message = shorten(str(exc), MAX_MESSAGE_CHARS)
    if isinstance(exc, NotFound):
        context.abort(grpc.StatusCode.NOT_FOUND, message)
    if isinstance(exc, FailedPrecondition):
        context.abort(grpc.StatusCode.FAILED_PRECONDITION, message)
    if isinstance(exc, Conflict):
        context.abort(grpc.StatusCode.ALREADY_EXISTS, message)
    if isinstance(exc, DomainError):
        context.abort_with_status(
            rpc_status.to_status(bad_request_status(message, (Violation("request", message),)))
        )
    if _is_bad_value(exc):
        # What the caller sent cannot be stored as is (a number or an instant out of the
        # database's range): the caller's to fix, and nothing was written. The input limits
        # (domain/limits.py) should have caught it with the field named: a limit is missing.
        detail = str(getattr(exc, "orig", None) or exc).splitlines()[0][:300]
        log.warning("%s: a value passed the input limits but not the database: %s", method, detail)
        refused = f"a value cannot be stored: {detail}"
        context.abort_with_status(
            rpc_status.to_status(bad_request_status(refused, (Violation("request", refused),)))
        )
    if _is_timeout(exc):
        context.abort(
            grpc.StatusCode.DEADLINE_EXCEEDED, "the database did not answer in time; retry"
        )
    if _is_database_outage(exc):
        log.warning("%s: database unavailable: %s", method, exc.__class__.__name__)
        context.abort(
            grpc.StatusCode.UNAVAILABLE,
            "the database is unavailable; nothing was stored by this call, retry later",
        )
    if isinstance(exc, grpc.RpcError):
        # Raised by a stream's request iterator once the call has ended: the client cancelled
        # it, or the server's shutdown did after its grace period. What the stream committed
        # stays; nobody is left to answer.
        log.info("%s: the call ended while its messages were read", method)
        context.abort(grpc.StatusCode.CANCELLED, "the call was cancelled")
    ref = uuid.uuid4().hex[:12]
    log.exception("%s: internal error ref=%s", method, ref)
    context.abort(grpc.StatusCode.INTERNAL, f"internal error (ref {ref} in the server log)")
