"""Server interceptors: metrics, the call's deadline and error mapping, around every unary-reply
handler.

Bytes that are not a valid request message do not reach grpc's own error path (INTERNAL
"Exception deserializing request", before any interceptor could count it): the error-mapping
interceptor installs a deserializer that turns them into a `MalformedRequest`, and its handler
answers that with INVALID_ARGUMENT naming the field `request` (or `messages[n]` of a stream), so
the call is counted in the metrics like every other refused one.
"""

from __future__ import annotations

import abc
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import grpc

from gpufair.api.errors import abort_for
from gpufair.api.work_slots import EXEMPT_PREFIXES, FROM_MEMORY, SELF_SLOTTED, WorkSlots
from gpufair.domain.errors import InvalidInputError, Violation
from gpufair.domain.limits import shorten
from gpufair.metrics import RPC_SECONDS, RPCS
from gpufair.store.deadline import call_deadline

Behavior = Callable[[Any, grpc.ServicerContext], Any]

# One line per RPC: method, final code, duration, and the request's id and pool when it has them
# (fields of the line's record, so `--log-format json` gives them as keys).
rpc_log = logging.getLogger("gpufair.rpc")
_ROOT = logging.getLogger()

# An RPC's line as the RPC's thread makes it: (time.time(), method, code, duration_s,
# the request's `request_id` attribute or None, its `pool` attribute or None). Everything the
# line shows is worked out from these on the writing thread (`rpc_line_message`,
# `rpc_line_fields`), which formats the lines a batch at a time.
RpcLine = tuple[float, str, str, float, Any, Any]


def rpc_line_message(line: RpcLine) -> str:
    """The line's message, as `"%s %s %.1f ms" % (method, code, milliseconds)`."""
    return f"{line[1]} {line[2]} {line[3] * 1000:.1f} ms"


def rpc_line_fields(line: RpcLine) -> dict[str, Any]:
    """The line's fields: `method`, `code`, `duration_s`, and `request_id` and `pool` when the
    request has them set as strings (at most 200 characters each; not those of a stream)."""
    fields: dict[str, Any] = {"method": line[1], "code": line[2], "duration_s": round(line[3], 6)}
    request_id, pool = line[4], line[5]
    if isinstance(request_id, str) and request_id:
        fields["request_id"] = request_id[:200]
    if isinstance(pool, str) and pool:
        fields["pool"] = pool[:200]
    return fields


class RpcLines:
    """Where the server's logging takes RPC lines as plain tuples (`cli/logs.py`): `put` queues
    an `RpcLine` for its writing thread, beside the records of the other lines in one queue, so
    the order of lines holds. It stands for `handlers`, the root logger's handlers when it was
    set: while those are still the root's only handlers and `gpufair.rpc` has none of its own
    (a test's capturing handler, say), an RPC's line is that tuple, with no `LogRecord`, no
    handler lock and no logging call on the RPC's thread; otherwise it is an `RpcRecord`
    handled as any record."""

    put: Callable[[RpcLine], None] | None = None
    handlers: list[logging.Handler] = []  # noqa: RUF012 (replaced whole with `put`)


class RpcRecord(logging.LogRecord):
    """An RPC's line as a log record, made with what the line carries only. `LogRecord`'s own
    constructor also works out the source file's name and module from a path (there is none:
    the server does not walk the stack for it), the thread, the process and their names, per
    call; here the attributes every record has and that are the same for every RPC line are
    copied in from one dict (`_SAME_FOR_EVERY_LINE`), and the line's fields are set as `extra=`
    would have set them."""

    def __init__(self, line: RpcLine) -> None:
        # Not LogRecord.__init__ (above): what it would set from its arguments and the clock.
        now = line[0]
        fields = self.__dict__
        fields.update(_SAME_FOR_EVERY_LINE)
        self.msg, self.args = "%s %s %.1f ms", (line[1], line[2], line[3] * 1000)
        self.created, self.msecs = now, int((now - int(now)) * 1000) + 0.0
        self.relativeCreated = (now - _STARTED_S) * 1000
        fields.update(rpc_line_fields(line))


_STARTED_S = time.time()  # `relativeCreated` is from here (logging's own start differs little)
_SAME_FOR_EVERY_LINE = {
    **vars(logging.LogRecord("", 0, "", 0, "", None, None)),
    "name": rpc_log.name,
    "levelno": logging.INFO,
    "levelname": "INFO",
    "pathname": "(unknown file)",
    "filename": "(unknown file)",
    "module": "(unknown file)",
    "lineno": 0,
    "funcName": "(unknown function)",
    "thread": None,
    "threadName": None,
    "process": None,
    "processName": None,
}


def log_rpc(method: str, code: str, duration_s: float, request: Any) -> None:
    """Logs an RPC's line (when `gpufair.rpc` logs INFO): a tuple handed to `RpcLines.put`
    when it stands, else an `RpcRecord` through the logger."""
    if not rpc_log.isEnabledFor(logging.INFO):
        return
    line = (
        time.time(),
        method,
        code,
        duration_s,
        getattr(request, "request_id", None),
        getattr(request, "pool", None),
    )
    put = RpcLines.put
    if put is not None and _ROOT.handlers == RpcLines.handlers and not rpc_log.handlers:
        put(line)
    else:
        rpc_log.handle(RpcRecord(line))


def _aborted(context: grpc.ServicerContext) -> Any:
    return getattr(context, "code", lambda: None)()


def _rewrap(handler: Any, decorate: Callable[[Behavior], Behavior]) -> Any:
    """The same handler with its behaviour decorated (unary and client-stream requests)."""
    if handler is None:
        return None
    if handler.unary_unary is not None:
        return grpc.unary_unary_rpc_method_handler(
            decorate(handler.unary_unary),
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )
    if handler.stream_unary is not None:
        return grpc.stream_unary_rpc_method_handler(
            decorate(handler.stream_unary),
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )
    return handler


class _Memo:
    """Each method's decorated handler, reused while the handler it decorates is the very same
    object (the servicer's, or an inner interceptor's memoized one): an interceptor's wrapping is
    built once per method rather than once per call. One entry per method, replaced when the
    inner handler changes (an interceptor that builds a handler per call simply misses)."""

    def __init__(self) -> None:
        self._last: dict[str, tuple[Any, Any]] = {}

    def get(self, method: str, inner: Any, build: Callable[[Any], Any]) -> Any:
        last = self._last.get(method)
        if last is not None and last[0] is inner:
            return last[1]
        outer = build(inner)
        if inner is not None:
            self._last[method] = (inner, outer)
        return outer


class Layer(grpc.ServerInterceptor):  # type: ignore[type-arg]
    """An interceptor whose wrapping of a handler depends on the method and that handler only
    (what it does per call, it does inside the wrapped behaviour): built once per method."""

    def __init__(self) -> None:
        self._memo = _Memo()

    @abc.abstractmethod
    def wrap(self, method: str, inner: Any) -> Any:
        """`inner`, the handler of `method` (or None: no such method), as this layer serves it."""

    def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Any],
        details: grpc.HandlerCallDetails,
    ) -> Any:
        method = details.method
        return self._memo.get(method, continuation(details), lambda h: self.wrap(method, h))


class Layers(Layer):
    """Several layers as one interceptor, the first outermost: per call, one lookup of the
    method's composed handler instead of one interceptor call each.

    grpc's synchronous server finds a call's handler on its one polling thread, the thread that
    also receives every call and hands it to the pool, and it runs the interceptors there, each
    through a continuation made for the call. With six of them that was six calls, six
    continuations and six lookups of a memoized wrapping per RPC on the thread every RPC goes
    through (`bench/results/serving.md`)."""

    def __init__(self, layers: Sequence[Layer]) -> None:
        super().__init__()
        self.layers = tuple(layers)

    def wrap(self, method: str, inner: Any) -> Any:
        for layer in reversed(self.layers):
            inner = layer.wrap(method, inner)
        return inner


class MalformedRequest:
    """What a request message deserializes to when its bytes are not a valid message."""

    def __init__(self, error: Exception) -> None:
        self.error = error

    def violation(self, field: str, method: str) -> Violation:
        detail = shorten(str(self.error) or self.error.__class__.__name__, 120)
        return Violation(field, f"not a valid {method} request message ({detail})")


def _tolerant(deserializer: Callable[[bytes], Any] | None) -> Callable[[bytes], Any] | None:
    if deserializer is None:
        return None

    def deserialize(data: bytes) -> Any:
        try:
            return deserializer(data)
        except Exception as exc:  # any decoding failure is the sender's
            return MalformedRequest(exc)

    return deserialize


def _checked_stream(requests: Iterator[Any], method: str) -> Iterator[Any]:
    for n, request in enumerate(requests):
        if isinstance(request, MalformedRequest):
            raise InvalidInputError([request.violation(f"messages[{n}]", method)])
        yield request


class ErrorMappingInterceptor(Layer):
    """No exception leaves a handler as UNKNOWN: each gets the status `abort_for` gives it, and
    malformed request bytes are INVALID_ARGUMENT (module docstring)."""

    def wrap(self, method: str, inner: Any) -> Any:
        short = method.rsplit("/", 1)[-1]
        # Only a client stream's requests come as an iterator (checked message by message).
        streamed = inner is not None and inner.unary_unary is None

        def decorate(behavior: Behavior) -> Behavior:
            def guarded(request: Any, context: grpc.ServicerContext) -> Any:
                try:
                    if isinstance(request, MalformedRequest):
                        raise InvalidInputError([request.violation("request", short)])
                    if streamed and isinstance(request, Iterator):
                        request = _checked_stream(request, short)
                    return behavior(request, context)
                except Exception as exc:
                    if _aborted(context) is not None:  # the servicer aborted on purpose
                        raise
                    abort_for(exc, context, method)
                    raise  # unreachable: abort_for always raises

            return guarded

        handler = _rewrap(inner, decorate)
        if handler is None or handler.request_deserializer is None:
            return handler
        if handler.unary_unary is not None:
            return grpc.unary_unary_rpc_method_handler(
                handler.unary_unary,
                request_deserializer=_tolerant(handler.request_deserializer),
                response_serializer=handler.response_serializer,
            )
        if handler.stream_unary is not None:
            return grpc.stream_unary_rpc_method_handler(
                handler.stream_unary,
                request_deserializer=_tolerant(handler.request_deserializer),
                response_serializer=handler.response_serializer,
            )
        return handler


class DeadlineInterceptor(Layer):
    """Hands the call's deadline to the database layer for as long as the handler runs, so its
    transactions get a statement timeout no longer than the caller waits (store/deadline.py).
    Placed outside the auth interceptor, whose token lookup is database work too. The read
    caches' methods (`FROM_MEMORY`) hand it down themselves, around the check a caller runs
    (`api/read_cache.py`), and a token lookup does for its own query (`api/auth.py`): a reply
    from memory does no database work, and setting the deadline for it cost more than the rest
    of the handler (`bench/results/serving.md`)."""

    def wrap(self, method: str, inner: Any) -> Any:
        if method in FROM_MEMORY:
            return inner

        def decorate(behavior: Behavior) -> Behavior:
            def bounded(request: Any, context: grpc.ServicerContext) -> Any:
                with call_deadline(context.time_remaining()):
                    return behavior(request, context)

            return bounded

        return _rewrap(inner, decorate)


class MetricsInterceptor(Layer):
    """Counts, times and logs every RPC by method and final status (placed outermost)."""

    def wrap(self, full: str, inner: Any) -> Any:
        method = full.rsplit("/", 1)[-1]
        # Probes and tooling call health and reflection all day: counted, not logged.
        logged = not full.startswith(("/grpc.health.", "/grpc.reflection."))
        # The method's metric children, looked up once each (a label lookup takes the metric's
        # lock and builds its key on every call otherwise).
        counted: dict[str, Any] = {}
        timings: list[Any] = []

        def count(code: str, duration_s: float) -> None:
            child = counted.get(code)
            if child is None:
                child = counted[code] = RPCS.labels(method, code)
            child.inc()
            if not timings:
                timings.append(RPC_SECONDS.labels(method))
            timings[0].observe(duration_s)

        def decorate(behavior: Behavior) -> Behavior:
            def timed(request: Any, context: grpc.ServicerContext) -> Any:
                start = time.perf_counter()
                code = "OK"
                try:
                    return behavior(request, context)
                except Exception:
                    status = _aborted(context)
                    code = status.name if status is not None else "UNKNOWN"
                    raise
                finally:
                    duration_s = time.perf_counter() - start
                    count(code, duration_s)
                    if logged:
                        log_rpc(method, code, duration_s, request)

            return timed

        return _rewrap(inner, decorate)


class WorkSlotInterceptor(Layer):
    """Each call holds one of `slots` while its handler runs (`api/work_slots.py`); placed inside
    error mapping, so a deadline passed while waiting is answered as such."""

    def __init__(self, slots: WorkSlots) -> None:
        super().__init__()
        self.slots = slots

    def wrap(self, method: str, inner: Any) -> Any:
        if method in SELF_SLOTTED or method.startswith(EXEMPT_PREFIXES):
            return inner
        slots = self.slots

        def decorate(behavior: Behavior) -> Behavior:
            def slotted(request: Any, context: grpc.ServicerContext) -> Any:
                with slots.held(context.time_remaining()):
                    return behavior(request, context)

            return slotted

        return _rewrap(inner, decorate)


class SharedReplyInterceptor(Layer):
    """Encodes a reply object once however many calls return it: the members of a coalesced
    `Schedule` cycle (`api/cycle_gate.py`) all get the one reply message, which grpc would
    otherwise serialize per call (at 200 callers and 3,000 waiting workloads, about 100 copies
    of 300 kB each cycle), and the read caches (`api/read_cache.py`) return one reply per entry
    until it is rebuilt. The last few replies are kept with their bytes, matched by identity;
    a reply is not changed once returned (it is the slot's or the cache entry's, shared)."""

    def __init__(self, methods: frozenset[str], keep: int = 8) -> None:
        super().__init__()
        self._methods = methods
        self._keep = keep
        self._lock = threading.Lock()
        self._last: list[tuple[Any, bytes]] = []

    def _serialize(self, message: Any) -> bytes:
        for kept, encoded in self._last:  # the list is replaced whole, never changed in place
            if kept is message:
                return encoded
        data: bytes = message.SerializeToString()
        with self._lock:
            self._last = [*self._last[-(self._keep - 1) :], (message, data)]
        return data

    def wrap(self, method: str, handler: Any) -> Any:
        if method not in self._methods or handler is None or handler.unary_unary is None:
            return handler
        return grpc.unary_unary_rpc_method_handler(
            handler.unary_unary,
            request_deserializer=handler.request_deserializer,
            response_serializer=self._serialize,
        )
