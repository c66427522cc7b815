"""`bench/bench_ingest.py` times the stream and the raw COPY from the same start: both warm. The
COPY's connection is open before its clock starts; so must the server's database connections
be, for every worker that takes a timed stream (round 29 found one worker opening its connection
inside the timed stream, about 5 ms of the database's CPU the COPY did not pay)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import cast

import pytest
from sqlalchemy import Engine

from gpufair.api.ingest import Ingest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import bench_ingest


@pytest.mark.parametrize("mix", ["churn", "steady"])
def test_no_database_connection_is_opened_inside_the_timed_stream(mix: str) -> None:
    result = bench_ingest.one_round(mix, 2000, 500, 2, spread=True)
    assert result["postgres_backends_started_in_stream"] == 0
    assert result["postgres_cpu_ms_in_stream"] > 0  # read in nanoseconds, so never 0 here
    assert sum(result["streams_by_worker"]) == 2


def test_the_warm_up_runs_end_before_the_mix_and_name_workloads_of_their_own() -> None:
    t0 = 1.7e9
    for mix in ("churn", "steady"):
        before, events, n_workloads = bench_ingest.mix_events(mix, 2000, t0)
        warm = bench_ingest.warm_runs(n_workloads, 4, t0)
        assert len(warm) == 4 * bench_ingest.EVENTS_PER_WORKLOAD
        assert max(e.occurred_at_s for e in warm) < min(e.occurred_at_s for e in before + events)
        mixed = {e.workload_uid for e in before + events}
        assert {e.workload_uid for e in warm} == {f"w{n_workloads + j}" for j in range(4)}
        assert mixed.isdisjoint(e.workload_uid for e in warm)
        # Split over two streams by the number in the uid, as the timed events are.
        parts = bench_ingest.split_by_workload(warm, 2)
        assert [len(p) for p in parts] == [10, 10]


def test_the_parts_of_the_warm_method_switch_on_alone() -> None:
    """`--warm` names parts of the warm method; the old method is none of them. `connect` alone
    opens each worker's database connection before the clock (old's backend inside the stream
    gone), and each stream's timings name its worker and that worker's backends' CPU."""
    assert bench_ingest.METHODS["old"] == frozenset()
    assert bench_ingest.METHODS["warm"] <= set(bench_ingest.WARM_PARTS)
    old = bench_ingest.one_round("steady", 2000, 500, 2, spread=True, method="old")
    assert old["postgres_backends_started_in_stream"] >= 1
    connected = bench_ingest.one_round(
        "steady", 2000, 500, 2, spread=True, warm=frozenset({"connect"})
    )
    assert connected["method"] == "connect"
    assert connected["postgres_backends_started_in_stream"] == 0
    for result in (old, connected):
        timings = result["stream_timings"]
        assert len(timings) == 2
        # The setup stream went over the client's connection: one of the two timed streams
        # at most is on its worker.
        assert sum(t["client_worker"] for t in timings) <= 1
        assert all(t["reply_s"] > t["last_taken_s"] >= t["first_taken_s"] >= 0 for t in timings)
        assert all(t["backend_cpu_ms"] > 0 for t in timings)
        assert result["server_cpu_ms_in_copy"] >= 0
        assert result["postgres_other_cpu_ms_in_copy"] >= 0


def test_the_transport_warm_up_is_refused_before_the_database() -> None:
    """`--warm transport` sends a message as large as each stream's first, of events refused
    for their ids alone, so that it writes nothing and opens no database connection."""
    _, events, _ = bench_ingest.mix_events("steady", 2000, 1.7e9)
    parts = [bench_ingest.messages(p, 500) for p in bench_ingest.split_by_workload(events, 2)]
    refused = bench_ingest.refused_messages(parts)
    assert len(refused) == 2
    for message, part in zip(refused, parts, strict=True):
        assert message.ByteSize() == part[0].ByteSize()
        assert all(len(e.event_id) == 36 and "-" not in e.event_id for e in message.events)
        # Nothing of it is a candidate to store: ReportEvents answers it without the database.
        prepared = Ingest(cast("Engine", None)).prepare(message, "events")
        assert prepared.batch.candidates == []
        errors = prepared.batch.outcomes.errors
        assert len(errors) == len(message.events)
        assert all(error.endswith("is not a UUID") for error in errors.values())
