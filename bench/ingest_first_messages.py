"""PostgreSQL's CPU for each message of one stream on a new connection, message by message.

    python bench/ingest_first_messages.py [--events 26000] [--mix steady] [--repeats 3]

A database is made as `bench_ingest.py` makes it (its cluster, workloads and, for the steady
mix, the starts of the runs going), then the timed events go through `Ingest.stream` in this
process, as `ingest_python.py --stream` sends them, on a connection opened for the stream (a
worker of `gpufair serve` that has not written yet opens one so). After each message is
committed the backend's CPU so far is read from `/proc/<pid>/schedstat` (nanoseconds on CPU),
so each message's share is known: a connection's first messages cost the database more than
the later ones (its catalog caches fill, and statements the driver has not prepared yet are
parsed and planned each time). Prints the CPU of each message, in ms, per repeat, and the
medians of messages 0, 1-5 and 6 on. PostgreSQL must run on this machine.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
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


def cpu_seconds(pid: int) -> float:
    """The process's time on CPU, from the scheduler's count in nanoseconds (`/proc/<pid>/stat`
    counts in ticks of 10 ms, too coarse for a message)."""
    return int(Path(f"/proc/{pid}/schedstat").read_text().split()[0]) / 1e9


class _Timed(Ingest):
    """Ingest that reads its connection's backend CPU after each message it commits."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.marks: list[float] = []

    def write_in(self, conn: Connection, *args: Any, **kwargs: Any) -> None:
        super().write_in(conn, *args, **kwargs)
        pid = conn.connection.driver_connection.info.backend_pid  # type: ignore[union-attr]
        self.marks.append(cpu_seconds(pid))


def one_stream(n_events: int, mix: str) -> list[float]:
    """The backend's CPU of each message of the timed stream, in ms (the first one counted from
    the connection's start)."""
    with test_server() as server, scratch_database(server.url, prefix="gpufair_bench") as url:
        migrate.upgrade(url)
        engine = make_engine(url)
        try:
            t0 = time.time() - 3 * 86400
            before, events, n_workloads = bench_ingest.mix_events(mix, n_events, t0)
            config, problems = config_from_proto(parse_config(bench_ingest.cluster()))
            assert not problems, problems
            with engine.connect() as conn:
                changes = diff_configs(config_repo.load_config(conn), config)
                config_repo.apply_changes(conn, config, changes)
                config_repo.record_version(conn, changes)
                conn.commit()
            bench_ingest.submit_workloads(engine, n_workloads, t0)
            ingest = _Timed(engine)
            if before:
                ingest.stream(iter(bench_ingest.messages(before, BATCH)))
            raw = [m.SerializeToString() for m in bench_ingest.messages(events, BATCH)]
            engine.dispose()  # the timed stream on a connection of its own
            ingest.marks.clear()
            tune_for_serving()

            def requests() -> Iterator[pb.ReportEventsRequest]:
                return (pb.ReportEventsRequest.FromString(r) for r in raw)

            reply = ingest.stream(requests())
            bench_ingest.assert_all_stored([pb.ReportEventsResponse.FromString(reply)], len(events))
        finally:
            engine.dispose()
    marks = ingest.marks
    # The first message's share is counted from the backend's start: its CPU at the first mark.
    return [marks[0] * 1e3] + [(b - a) * 1e3 for a, b in itertools.pairwise(marks)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=26_000)
    parser.add_argument("--mix", choices=["steady", "churn"], default="steady")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    if not Path("/proc/self/schedstat").exists():
        raise SystemExit("needs /proc/<pid>/schedstat (Linux)")
    runs = [one_stream(args.events, args.mix) for _ in range(args.repeats)]
    for run in runs:
        print(" ".join(f"{ms:.2f}" for ms in run))
    full = [run[:-1] for run in runs]  # the last message may be short
    first = [r[0] for r in full]
    early = [m for r in full for m in r[1:6]]
    later = [m for r in full for m in r[6:]]

    def median(values: list[float]) -> str:
        return f"{statistics.median(values):.2f} ms" if values else "none"

    print(
        f"{args.mix}, {args.events} events, messages of {BATCH}, backend CPU per message, "
        f"medians: message 0 {median(first)}, 1-5 {median(early)}, 6 on {median(later)}"
    )


if __name__ == "__main__":
    main()
