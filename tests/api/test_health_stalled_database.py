"""Health when the database stops answering without refusing: a hung host or a network path that
drops packets (tests/stall_support.py). README, "Health": NOT_SERVING when the probe gets no
answer within 3 s, SERVING again when it answers."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from outage_support import wait_for
from prometheus_client import CollectorRegistry
from sqlalchemy import Engine
from stall_support import FreezableRelay, relay_to

from gpufair.api.server import SERVICE_NAMES, build_server
from gpufair.api.state_metrics import StateCollector
from gpufair.store.database import make_engine

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


@pytest.fixture
def relayed(database_url: str) -> Iterator[tuple[FreezableRelay, Engine]]:
    with relay_to(database_url) as relay:
        engine = make_engine(relay.url_for(database_url), pool_size=2)
        yield relay, engine
        relay.thaw()
        engine.dispose()


def test_health_is_not_serving_while_the_database_does_not_answer(
    relayed: tuple[FreezableRelay, Engine],
) -> None:
    relay, engine = relayed
    registry = CollectorRegistry()
    running = build_server(
        engine, "127.0.0.1:0", max_workers=4, metrics_registry=registry, health_interval_s=0.2
    )
    try:
        with grpc.insecure_channel(f"127.0.0.1:{running.port}") as channel:
            stub = health_pb2_grpc.HealthStub(channel)

            def statuses() -> set[int]:
                return {
                    stub.Check(health_pb2.HealthCheckRequest(service=name), timeout=5).status
                    for name in ("", *SERVICE_NAMES)
                }

            assert statuses() == {SERVING}
            assert registry.get_sample_value("gpufair_database_up", {}) == 1.0
            relay.freeze()
            wait_for(lambda: statuses() == {NOT_SERVING}, timeout_s=30, what="NOT_SERVING")
            assert registry.get_sample_value("gpufair_database_up", {}) == 0.0
            relay.thaw()
            wait_for(lambda: statuses() == {SERVING}, timeout_s=30, what="SERVING again")
            assert registry.get_sample_value("gpufair_database_up", {}) == 1.0
    finally:
        relay.thaw()
        running.stop(1.0)


def test_a_scrape_stuck_on_the_silent_database_holds_up_no_other(
    relayed: tuple[FreezableRelay, Engine],
) -> None:
    """A scrape that began reading the state just as the database fell silent waits on it; the
    scrapes after it still answer, `gpufair_database_up 0` once health saw the silence, and the
    state gauges come back with the database."""
    relay, engine = relayed
    # The probe runs by hand here: the first scrape reads while health still says SERVING.
    running = build_server(engine, "127.0.0.1:0", max_workers=4, health_interval_s=3600)
    registry = CollectorRegistry()
    registry.register(StateCollector(engine, running.database_health, cache_s=0.0))
    scrapes: list[dict[str, float]] = []

    def scrape() -> None:
        scrapes.append({m.name: len(m.samples) for m in registry.collect()})

    try:
        scrape()
        assert scrapes[0]["gpufair_database_up"] == 1
        assert "gpufair_fair_share_cu" in scrapes[0]
        relay.freeze()
        stuck = threading.Thread(target=scrape, daemon=True)
        stuck.start()  # reads the state from the silent database: it waits
        probed: list[bool] = []
        threading.Thread(
            target=lambda: probed.append(running.database_health.probe()), daemon=True
        ).start()
        wait_for(lambda: probed == [False], timeout_s=30, what="the probe's failure")
        threading.Thread(target=scrape, daemon=True).start()
        wait_for(lambda: len(scrapes) == 2, timeout_s=30, what="a scrape beside the stuck one")
        assert stuck.is_alive()
        assert scrapes[1] == {"gpufair_database_up": 1}
        assert registry.get_sample_value("gpufair_database_up", {}) == 0.0
        relay.thaw()
        assert running.database_health.probe() is True
        stuck.join(timeout=30)
        assert not stuck.is_alive()
        assert registry.get_sample_value("gpufair_database_up", {}) == 1.0
        assert "gpufair_fair_share_cu" in {m.name for m in registry.collect()}
    finally:
        relay.thaw()
        running.stop(1.0)
