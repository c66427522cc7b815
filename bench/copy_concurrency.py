"""The raw COPY of `bench_ingest.py` by one connection and by two at once: what a second
concurrent writer into `ledger_events` costs PostgreSQL, whoever writes.

    PYTHONPATH=service python bench/copy_concurrency.py [--events 100000] [--rounds 3]

The rows are the steady mix's, made as `bench_ingest.copy_rate` makes them, before the clock
starts. Each round empties the table (and checkpoints) before each way of writing: all rows by
one connection, then the same rows split by workload (`bench_ingest.split_by_workload`) between
two connections writing at once, from two threads of this process. Prints the events per second
and the CPU the backends spent per event (read from `/proc`: PostgreSQL must run on this
machine). The two writers' rate is bounded by this process's one interpreter as well, so read
the CPU per event, not the rate.
"""

from __future__ import annotations

import argparse
import threading
import time
from typing import Any

import psycopg
from bench_ingest import RAW_COPY_SQL, libpq_url, raw_row, split_by_workload, steady_events
from server_process import cpu_seconds

from gpufair.store import migrate
from gpufair.store.scratch import scratch_database, test_server


def _write(url: str, rows: list[tuple[Any, ...]], start: threading.Barrier) -> float:
    """COPY `rows` on a connection of its own, once every writer is ready; the backend's CPU."""
    with psycopg.connect(url) as conn:
        found = conn.execute("SELECT pg_backend_pid()").fetchone()
        pid = found[0] if found else 0
        start.wait()
        before = cpu_seconds(pid)
        with conn.cursor() as cur, cur.copy(RAW_COPY_SQL.format(table="ledger_events")) as copy:
            for row in rows:
                copy.write_row(row)
        conn.commit()
        return cpu_seconds(pid) - before


def _round(url: str, parts: list[list[tuple[Any, ...]]]) -> tuple[float, float]:
    """Events per second and the backends' CPU seconds of writing `parts` at once."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("TRUNCATE ledger_events")
        conn.execute("CHECKPOINT")
    start = threading.Barrier(len(parts))
    cpu = [0.0] * len(parts)

    def run(i: int) -> None:
        cpu[i] = _write(url, parts[i], start)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(parts))]
    began = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return sum(map(len, parts)) / (time.perf_counter() - began), sum(cpu)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    _, events, _ = steady_events(args.events, time.time() - 3 * 86400)
    whole = [list(map(raw_row, events))]
    halves = [list(map(raw_row, part)) for part in split_by_workload(events, 2)]
    n = len(events)
    print("| round | writers | events/s | PostgreSQL CPU µs / event |")
    print("|---:|---:|---:|---:|")
    with test_server() as server, scratch_database(server.url, prefix="gpufair_bench") as url:
        migrate.upgrade(url)
        for number in range(1, args.rounds + 1):
            for parts in (whole, halves):
                rate, cpu = _round(libpq_url(url), parts)
                print(
                    f"| {number} | {len(parts)} | {rate:,.0f} | {cpu / n * 1e6:.2f} |", flush=True
                )


if __name__ == "__main__":
    main()
