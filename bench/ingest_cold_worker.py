"""What a worker that has not written yet pays for a timed stream, against one that has: the
two halves of `bench_ingest.py`'s timed steady stream, message by message, in this process.

    python bench/ingest_cold_worker.py [--events 50000] [--repeats 3]

A database is made as `bench_ingest.py` makes it (its cluster, workloads, the warm method's
warm-up runs and, for the steady mix, the starts of the runs going), and the rows written before
the clock are written as one of its methods writes them, by `Ingest` objects standing for the
server's two workers (each with an engine of its own, as each worker process has):

- `old`: all of them by worker A (`--method old`'s setup stream, which one worker takes); B has
  not written when its half of the timed stream comes;
- `warm`: split by workload as the timed events are, A's half by A and B's by B (`--method
  warm`).

Then the timed stream's two halves go through A and through B, one after the other (not at once:
each half's CPU is its own). For each half it reads the CPU of the thread that runs the stream
(`time.thread_time`, the server's Python, gRPC apart) and of the backend (from
`/proc/<pid>/schedstat`, nanoseconds; a backend that B's stream opens counted from its start),
per message. The two methods alternate, `--repeats` times each. PostgreSQL must run on this
machine.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import bench_ingest
from sqlalchemy import Connection

from gpufair.api.convert_cluster import config_from_proto
from gpufair.api.ingest import Ingest
from gpufair.config_file import parse_config
from gpufair.domain.config_diff import diff_configs
from gpufair.gc_tuning import tune_for_serving
from gpufair.store import config_repo, migrate
from gpufair.store.database import make_engine
from gpufair.store.scratch import scratch_database, test_server
from gpufair.v1 import ledger_pb2 as pb

BATCH = 2000
STREAMS = 2


def backend_ns(pid: int) -> int:
    return int(Path(f"/proc/{pid}/schedstat").read_text().split()[0])


class _Timed(Ingest):
    """Ingest that reads, after each message it commits, its backend's CPU and its thread's."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.marks: list[tuple[int, int, float]] = []  # (backend pid, its ns, thread s)

    def write_in(self, conn: Connection, *args: Any, **kwargs: Any) -> None:
        super().write_in(conn, *args, **kwargs)
        pid = conn.connection.driver_connection.info.backend_pid  # type: ignore[union-attr]
        self.marks.append((pid, backend_ns(pid), time.thread_time()))


def timed_half(ingest: _Timed, raw: list[bytes]) -> dict[str, Any]:
    """One half of the timed stream through `ingest`: backend and thread CPU, ms, in all and of
    the first message."""
    ingest.marks.clear()
    pids = {pid: backend_ns(pid) for pid in _backends(ingest)}
    thread_before = time.thread_time()

    def requests() -> Iterator[pb.ReportEventsRequest]:
        return (pb.ReportEventsRequest.FromString(r) for r in raw)

    reply = ingest.stream(requests())
    results = pb.ReportEventsResponse.FromString(reply).results
    assert all(r.status == pb.EVENT_STATUS_STORED for r in results), "a timed event not stored"
    backend_ms, first_backend_ms = [], 0.0
    previous: dict[int, int] = dict(pids)
    for k, (pid, ns, _) in enumerate(ingest.marks):
        spent = (ns - previous.get(pid, 0)) / 1e6  # a new backend from its start
        previous[pid] = ns
        backend_ms.append(spent)
        if k == 0:
            first_backend_ms = spent
    thread_ms = (ingest.marks[-1][2] - thread_before) * 1e3
    first_thread_ms = (ingest.marks[0][2] - thread_before) * 1e3
    return {
        "backend_ms": round(sum(backend_ms), 2),
        "backend_first_message_ms": round(first_backend_ms, 2),
        "backend_later_messages_ms": round(statistics.median(backend_ms[1:-1]), 2),
        "thread_ms": round(thread_ms, 1),
        "thread_first_message_ms": round(first_thread_ms, 1),
        "new_backend": float(not pids),
    }


def _backends(ingest: Ingest) -> list[int]:
    """The backends of the connections `ingest`'s engine holds in its pool now."""
    found = []
    pool = ingest.engine.pool
    for record in list(getattr(pool, "_pool").queue):  # noqa: B009  (QueuePool's idle ones)
        dbapi = record.dbapi_connection
        if dbapi is not None:
            found.append(dbapi.info.backend_pid)
    return found


def one_round(method: str, n_events: int) -> list[dict[str, Any]]:
    with test_server() as server, scratch_database(server.url, prefix="gpufair_bench") as url:
        migrate.upgrade(url)
        engines = [make_engine(url), make_engine(url)]
        try:
            t0 = time.time() - 3 * 86400
            before, events, n_workloads = bench_ingest.mix_events("steady", n_events, t0)
            runs = bench_ingest.WARM_RUNS_PER_STREAM * STREAMS
            before = bench_ingest.warm_runs(n_workloads, runs, t0) + before
            config, problems = config_from_proto(parse_config(bench_ingest.cluster()))
            assert not problems, problems
            with engines[0].connect() as conn:
                changes = diff_configs(config_repo.load_config(conn), config)
                config_repo.apply_changes(conn, config, changes)
                config_repo.record_version(conn, changes)
                conn.commit()
            bench_ingest.submit_workloads(engines[0], n_workloads + runs, t0)
            workers = [_Timed(engines[0]), _Timed(engines[1])]
            if method == "old":
                workers[0].stream(iter(bench_ingest.messages(before, BATCH)))
            else:
                for worker, part in zip(
                    workers, bench_ingest.split_by_workload(before, STREAMS), strict=True
                ):
                    worker.stream(iter(bench_ingest.messages(part, BATCH)))
            halves = [
                [m.SerializeToString() for m in bench_ingest.messages(part, BATCH)]
                for part in bench_ingest.split_by_workload(events, STREAMS)
            ]
            tune_for_serving()
            return [timed_half(w, h) for w, h in zip(workers, halves, strict=True)]
        finally:
            for engine in engines:
                engine.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=50_000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    found: dict[str, list[list[dict[str, Any]]]] = {"old": [], "warm": []}
    for k in range(args.repeats):
        for method in ("old", "warm") if k % 2 == 0 else ("warm", "old"):
            halves = one_round(method, args.events)
            found[method].append(halves)
            print(json.dumps({"method": method, "A": halves[0], "B": halves[1]}), file=sys.stderr)
    summary = {}
    for method, rounds in found.items():
        summary[method] = {
            worker: {
                key: statistics.median(r[i][key] for r in rounds)
                for key in rounds[0][i]
                if key != "new_backend"
            }
            for i, worker in enumerate(("A", "B"))
        }
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
