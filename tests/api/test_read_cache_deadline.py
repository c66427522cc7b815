"""A read cache's check runs under the deadline of the call that runs it (`api/read_cache.py`):
GetFairShare and GetConfig hand their deadline to the database layer only there, since a reply
from memory does no database work (`DeadlineInterceptor` leaves them alone)."""

from __future__ import annotations

import threading
from collections.abc import Hashable

import grpc

from gpufair.api.interceptors import DeadlineInterceptor
from gpufair.api.read_cache import ReadCache
from gpufair.api.work_slots import FROM_MEMORY
from gpufair.store.deadline import statement_timeout_ms

CAP_MS = 30_000


def test_a_callers_check_runs_under_its_deadline() -> None:
    seen: list[int | None] = []

    def refresh(held: Hashable) -> tuple[Hashable, str | None]:
        seen.append(statement_timeout_ms(CAP_MS))
        return 1, "reply"

    cache: ReadCache[str, str] = ReadCache(staleness_s=0.0)  # every call checks
    assert cache.get("p", refresh, lambda: 2.0) == "reply"
    assert cache.get("p", refresh, None) == "reply"
    cache.close()
    first, second = seen
    # 2 s left, less the 10 % margin: at most 1,800 ms, and the check started at once.
    assert first is not None and 1_500 <= first <= 1_800
    assert second is None  # no deadline given: the engine's default
    assert statement_timeout_ms(CAP_MS) is None  # nothing left behind after the call


def test_the_deadline_interceptor_leaves_the_read_cache_methods_alone() -> None:
    handler = grpc.unary_unary_rpc_method_handler(lambda request, context: request)
    layer = DeadlineInterceptor()
    assert {
        "/gpufair.v1.Ledger/GetFairShare",
        "/gpufair.v1.ClusterAdmin/GetConfig",
    } == FROM_MEMORY
    for method in FROM_MEMORY:
        assert layer.wrap(method, handler) is handler
    wrapped = layer.wrap("/gpufair.v1.Ledger/GetUsage", handler)
    assert wrapped is not handler

    class Context:
        def time_remaining(self) -> float:
            return 2.0

    timeouts: list[int | None] = []
    inner = grpc.unary_unary_rpc_method_handler(
        lambda request, context: timeouts.append(statement_timeout_ms(CAP_MS))
    )
    call = threading.Thread(
        target=layer.wrap("/gpufair.v1.Ledger/GetUsage", inner).unary_unary,
        args=(None, Context()),
    )
    call.start()
    call.join(5)
    (timeout,) = timeouts
    assert timeout is not None and 1_500 <= timeout <= 1_800
