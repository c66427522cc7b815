"""Bearer-token authentication and per-RPC roles.

A client sends `authorization: Bearer gpf_...` metadata (GpufairClient does with `token=`). Every
RPC of ClusterAdmin, Scheduler and Ledger is listed in `RPC_ROLES` with the roles that may call it;
an RPC missing from the table is refused to everyone (a test checks the table against the proto
descriptors, so a new RPC cannot ship unmapped). Health and reflection stay open: load balancers
and `grpcurl` need them, and they reveal only what the proto files already say.

- no or malformed credentials, an unknown or a revoked token: UNAUTHENTICATED;
- a valid token whose role may not call the RPC: PERMISSION_DENIED;
- the database cannot be asked: the status `abort_for` gives (UNAVAILABLE for an outage).

Lookups are cached in memory by token digest for `cache_ttl_s` (5 s by default), negative answers
too, so a busy client costs one query per replica every few seconds rather than one per call, and
a client retrying a bad token cannot hammer the database. The price: a revoked token keeps working
on a replica for up to `cache_ttl_s` after `gpufair token revoke`. A newly created token works at
once (it was never cached). A cache miss also sets the token's `last_used_at` when that is more
than a minute old (store/token_repo.py).

Auth is off unless the server is started with tokens required (`auth_interceptor(engine,
required=True)`): the quick start on 127.0.0.1 needs no token. `gpufair.cli.auth.check_listen`
refuses to serve a non-loopback address that way.

The interceptor sits inside MetricsInterceptor (refused calls are counted with their status) and
outside ErrorMappingInterceptor (which would otherwise treat its aborts as a handler's).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import grpc
from grpc_health.v1 import health
from grpc_reflection.v1alpha import reflection
from sqlalchemy import Engine

from gpufair.api.errors import abort_for
from gpufair.api.interceptors import Behavior, Layer, _rewrap
from gpufair.store import token_repo
from gpufair.store.deadline import call_deadline
from gpufair.store.token_repo import TokenRecord
from gpufair.tokens import Role, digest, looks_like_token

log = logging.getLogger(__name__)

DEFAULT_CACHE_TTL_S = 5.0
MAX_CACHED_TOKENS = 10_000

_ADMIN = frozenset({Role.ADMIN})
_WRITERS = frozenset({Role.ADMIN, Role.SCHEDULER})
_READERS = frozenset({Role.ADMIN, Role.SCHEDULER, Role.REPORTER})

# Who may call what: the one place. Admin may call everything, and is listed for every RPC so a
# reader of this table needs no other rule.
RPC_ROLES: Mapping[str, frozenset[Role]] = {
    "/gpufair.v1.ClusterAdmin/ApplyConfig": _ADMIN,
    "/gpufair.v1.ClusterAdmin/DeleteObjects": _ADMIN,
    "/gpufair.v1.ClusterAdmin/GetConfig": _READERS,
    # A batch system's node controller (SCHEDULER role) owns nodes, not the rest of the config.
    "/gpufair.v1.ClusterAdmin/UpsertNodes": _WRITERS,
    "/gpufair.v1.ClusterAdmin/SetNodesReady": _WRITERS,
    "/gpufair.v1.Scheduler/SubmitWorkloads": _WRITERS,
    "/gpufair.v1.Scheduler/CancelWorkload": _WRITERS,
    "/gpufair.v1.Scheduler/Schedule": _WRITERS,
    "/gpufair.v1.Scheduler/ExplainWorkload": _READERS,
    "/gpufair.v1.Scheduler/ListWorkloads": _READERS,
    "/gpufair.v1.Ledger/ReportEvents": _WRITERS,
    "/gpufair.v1.Ledger/StreamEvents": _WRITERS,
    "/gpufair.v1.Ledger/GetFairShare": _READERS,
    "/gpufair.v1.Ledger/GetFairShareHistory": _READERS,
    "/gpufair.v1.Ledger/GetUsage": _READERS,
}

OPEN_SERVICES = frozenset({health.SERVICE_NAME, reflection.SERVICE_NAME})

_BEARER = "bearer "


class TokenCache:
    """Token digest -> (expiry, record or None), for `ttl_s` on the `clock` (monotonic)."""

    def __init__(
        self,
        lookup: Callable[[str], TokenRecord | None],
        *,
        ttl_s: float = DEFAULT_CACHE_TTL_S,
        clock: Callable[[], float] = time.monotonic,
        max_entries: int = MAX_CACHED_TOKENS,
    ) -> None:
        self._lookup = lookup
        self._ttl_s = ttl_s
        self._clock = clock
        self._max_entries = max_entries
        self._entries: dict[bytes, tuple[float, TokenRecord | None]] = {}
        self._lock = threading.Lock()

    def get(
        self, token: str, time_left: Callable[[], float | None] | None = None
    ) -> TokenRecord | None:
        """The token's record (None: unknown or revoked). A lookup runs under the caller's
        deadline, `time_left()` (gRPC's `context.time_remaining`; `store/deadline.py`), so it
        holds for the read caches' methods too, which set no deadline for a reply from memory."""
        key = digest(token)
        now = self._clock()
        with self._lock:
            hit = self._entries.get(key)
        if hit is not None and hit[0] > now:
            return hit[1]
        # Outside the lock: a slow database must not hold up calls whose tokens are cached.
        if time_left is None:
            record = self._lookup(token)
        else:
            with call_deadline(time_left()):
                record = self._lookup(token)
        with self._lock:
            if len(self._entries) >= self._max_entries:
                # Only a flood of made-up tokens fills it; starting over keeps memory bounded
                # and costs real clients one lookup each.
                self._entries.clear()
            self._entries[key] = (now + self._ttl_s, record)
        return record


def database_lookup(engine: Engine) -> Callable[[str], TokenRecord | None]:
    """Find an unrevoked token, noting its use at most once a minute."""

    def lookup(token: str) -> TokenRecord | None:
        record = token_repo.find_active(engine, token)
        if record is None:
            return None
        last = record.last_used_at
        if last is None or datetime.now(UTC) - last >= timedelta(seconds=token_repo.TOUCH_EVERY_S):
            try:
                token_repo.touch(engine, record.id)
            except Exception:
                # A hint for operators; the call it came with must not fail for it.
                log.warning("could not record the use of token %r", record.name, exc_info=True)
        return record

    return lookup


def bearer_token(metadata: Sequence[tuple[str, Any]] | None) -> str | None:
    """The token of the one `authorization: Bearer <token>` entry, or None."""
    values = [v for k, v in (metadata or ()) if k == "authorization"]
    if len(values) != 1 or not isinstance(values[0], str):
        return None
    value = values[0].strip()
    if not value.lower().startswith(_BEARER):
        return None
    return value[len(_BEARER) :].strip() or None


def _guard(handler: Any, decorate: Callable[[Behavior], Behavior]) -> Any:
    """The handler with its behaviour decorated, whatever its kind. `_rewrap` does unary replies
    only (the other interceptors need no more); an RPC with streamed replies must not slip past
    the check that way, should one be added."""
    if not handler.response_streaming:
        return _rewrap(handler, decorate)
    if handler.request_streaming:
        return grpc.stream_stream_rpc_method_handler(
            decorate(handler.stream_stream),
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )
    return grpc.unary_stream_rpc_method_handler(
        decorate(handler.unary_stream),
        request_deserializer=handler.request_deserializer,
        response_serializer=handler.response_serializer,
    )


class AuthInterceptor(Layer):
    """Checks the caller's token and role before the handler runs (in the handler's thread, not
    gRPC's polling thread: a lookup may wait on the database). The check reads the call's
    metadata when the call runs, so the wrapping is the method's alone, built once."""

    def __init__(
        self, tokens: TokenCache, rpc_roles: Mapping[str, frozenset[Role]] = RPC_ROLES
    ) -> None:
        super().__init__()
        self._tokens = tokens
        self._rpc_roles = rpc_roles

    def wrap(self, method: str, handler: Any) -> Any:
        if handler is None or method.lstrip("/").split("/", 1)[0] in OPEN_SERVICES:
            return handler
        allowed = self._rpc_roles.get(method, frozenset())
        name = method.rsplit("/", 1)[-1]

        def authorize(context: grpc.ServicerContext) -> None:
            token = bearer_token(context.invocation_metadata())
            if token is None:
                context.abort(
                    grpc.StatusCode.UNAUTHENTICATED,
                    "missing credentials: send 'authorization: Bearer <token>' "
                    "(gpufair --token or $GPUFAIR_TOKEN)",
                )
            try:
                record = (
                    self._tokens.get(token, context.time_remaining)
                    if looks_like_token(token)
                    else None
                )
            except Exception as exc:
                abort_for(exc, context, method)
                raise  # unreachable: abort_for always raises
            if record is None:
                context.abort(grpc.StatusCode.UNAUTHENTICATED, "invalid or revoked token")
            if record.role not in allowed:
                needs = (
                    f"needs {', '.join(sorted(r.value for r in allowed))}"
                    if allowed
                    else "is open to no role"  # not in the table: closed until it is
                )
                context.abort(
                    grpc.StatusCode.PERMISSION_DENIED,
                    f"token {record.name!r} has role {record.role.value}; {name} {needs}",
                )

        def decorate(behavior: Behavior) -> Behavior:
            def checked(request: Any, context: grpc.ServicerContext) -> Any:
                authorize(context)
                return behavior(request, context)

            return checked

        return _guard(handler, decorate)


def auth_interceptor(
    engine: Engine,
    required: bool,
    *,
    cache_ttl_s: float = DEFAULT_CACHE_TTL_S,
    clock: Callable[[], float] = time.monotonic,
) -> AuthInterceptor | None:
    """The interceptor that requires tokens, or None when they are not required (auth off)."""
    if not required:
        return None
    return AuthInterceptor(TokenCache(database_lookup(engine), ttl_s=cache_ttl_s, clock=clock))
