"""`bench/bench_ingest.py` times the stream and the raw COPY from the same start: both warm. The
COPY's connection is open before its clock starts; so must the server's database connections
be, for every worker that takes a timed stream (round 29 found one worker opening its connection
inside the timed stream, about 5 ms of the database's CPU the COPY did not pay)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

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
