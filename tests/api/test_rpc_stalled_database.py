"""RPCs when the database stops answering without refusing: a hung host or a network path that
drops packets (tests/stall_support.py). No server-side timeout can fire then; the engine's own
bound (store/stall_guard.py) ends the handler's wait and the call answers UNAVAILABLE, instead of
holding its thread and connection until TCP gives up (with the relay frozen: never)."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import grpc
import pytest
from outage_support import wait_for
from prometheus_client import REGISTRY
from sqlalchemy import Engine
from stall_support import FreezableRelay, relay_to

from gpufair.api.server import RunningServer, build_server
from gpufair.client import GpufairClient
from gpufair.config_file import load_config_file
from gpufair.store.database import make_engine
from tests.jobs.test_periodic_jobs import EXAMPLE


@pytest.fixture
def relayed(database_url: str, db: Engine) -> Iterator[tuple[FreezableRelay, RunningServer]]:
    with relay_to(database_url) as relay:
        engine = make_engine(relay.url_for(database_url), pool_size=2)
        # Health probes by hand only: the test is about the handlers' own connections.
        running = build_server(engine, "127.0.0.1:0", max_workers=4, health_interval_s=3600)
        try:
            yield relay, running
        finally:
            relay.thaw()
            running.stop(1.0)
            engine.dispose()


def _call(port: int, timeout_s: float | None) -> tuple[threading.Thread, list[object]]:
    """ListWorkloads (a read of the database on every call) on a thread of its own; the list
    gets the reply or the error."""
    ended: list[object] = []

    def run() -> None:
        with GpufairClient(f"127.0.0.1:{port}", attempts=1, timeout_s=timeout_s) as client:
            try:
                ended.append(client.list_workloads(pool="default"))
            except grpc.RpcError as error:
                ended.append(error)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, ended


def _handled(code: str) -> float:
    labels = {"method": "ListWorkloads", "code": code}
    return REGISTRY.get_sample_value("gpufair_rpcs_total", labels) or 0.0


@pytest.mark.parametrize("timeout_s", [None, 8.0])
def test_a_call_on_a_silent_database_answers_unavailable(
    relayed: tuple[FreezableRelay, RunningServer], timeout_s: float | None
) -> None:
    relay, running = relayed
    with GpufairClient(f"127.0.0.1:{running.port}", attempts=1, timeout_s=30) as client:
        client.apply_config(load_config_file(EXAMPLE))
        assert list(client.list_workloads(pool="default")) == []  # a pooled connection now
    codes = ("UNAVAILABLE", "DEADLINE_EXCEEDED")
    before = {code: _handled(code) for code in codes}
    relay.freeze()
    thread, ended = _call(running.port, timeout_s)
    thread.join(timeout=60)  # without the bound: minutes (the frozen relay: never)
    assert not thread.is_alive(), "the call still waits on the silent database"
    (error,) = ended
    assert isinstance(error, grpc.RpcError)
    if timeout_s is None:
        assert error.code() == grpc.StatusCode.UNAVAILABLE, error
    else:  # the client's own deadline passed first
        assert error.code() == grpc.StatusCode.DEADLINE_EXCEEDED, error
    # The handler itself ended (its thread and connection free again), as UNAVAILABLE: the
    # server counted the call.
    wait_for(
        lambda: sum(_handled(code) - before[code] for code in codes) == 1,
        timeout_s=60,
        what="the handler's end",
    )
    assert _handled("UNAVAILABLE") == before["UNAVAILABLE"] + 1
    relay.thaw()
    with GpufairClient(f"127.0.0.1:{running.port}", attempts=1, timeout_s=30) as client:
        assert list(client.list_workloads(pool="default")) == []  # served again
