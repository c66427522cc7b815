"""The server's Python per ingested event without the database: protobuf to domain events, the
batch's preparation (payload, digest, checks, COPY row) and the reply, as a stream does them.

    python bench/ingest_python.py [--mix steady|churn] [--passes 15] [--callgrind]
    python bench/ingest_python.py --stream [--mix steady|churn] [--events 50000]

The events are those of `bench_ingest.py`'s mixes (4,020 steady events: heartbeats of 400 runs,
one run in 200 replaced per round; or 4,000 churn events of 800 short runs), in messages of
2,000, serialized before the clock starts. Every event is taken as stored. Prints the CPU
(`time.process_time`) per event of the fastest pass and of the median one: on a shared machine
the fastest is the steadier figure; compare two versions of the code by running this with each
in turn, several times.

With `--callgrind` it runs one pass inside `operator.call`, for an instruction count that load
does not change:

    valgrind --tool=callgrind --collect-atstart=no --toggle-collect=_operator_call \\
        python bench/ingest_python.py --mix steady --callgrind

With `--stream` it measures the whole of a stream's work instead, database included:
`Ingest.stream` in this process over a scratch database, with `bench_ingest.py`'s events of
`--mix` (`--events`, in messages of 2,000; for steady, the runs going when the clock starts
sent first), the collector tuned as `gpufair serve` tunes it. It prints the CPU per event of the stream's
thread and of the process (the reader thread parses the messages): the server's CPU per event
of `bench_ingest.py` without gRPC's share. The stream runs inside `operator.call`, so the
valgrind command above counts its instructions (setup excluded) with `--stream` in place of
`--mix steady --callgrind`.
"""

from __future__ import annotations

import argparse
import operator
import random
import time
import uuid

from gpufair.api.ingest import EncodedReply, Ingest, _report
from gpufair.domain.ledger import LedgerEvent
from gpufair.store.ingest_pipeline import EventStatus
from gpufair.v1 import ledger_pb2 as pb

T0 = 1.7e9
BATCH = 2000


def _event(
    rng: random.Random,
    kind: pb.EventKind.ValueType,
    at: float,
    uid: str,
    pods: tuple[tuple[str, int], ...] = (),
) -> pb.LedgerEvent:
    msg = pb.LedgerEvent(
        event_id=str(uuid.UUID(int=rng.getrandbits(128), version=4)), workload_uid=uid, kind=kind
    )
    msg.occurred_at.FromNanoseconds(round(at * 1e9))
    for node, gpu in pods:
        msg.pods.add(node=node, gpu_indices=[gpu], gpu_fraction=1.0)
    return msg


def events_of(mix: str) -> list[pb.LedgerEvent]:
    rng = random.Random(1)
    events: list[pb.LedgerEvent] = []
    if mix == "steady":
        slots = 400
        for k in range(1, 11):
            for j in range(slots):
                if j % 200 == k % 200:
                    events.append(_event(rng, pb.EVENT_KIND_STOPPED, T0 + 30 * k, f"w{j}"))
                    pods = ((f"n{j % 64}", j % 8),)
                    start = T0 + 30 * k + 0.5
                    events.append(_event(rng, pb.EVENT_KIND_STARTED, start, f"w{j}x{k}", pods))
                else:
                    events.append(_event(rng, pb.EVENT_KIND_HEARTBEAT, T0 + 30 * k, f"w{j}"))
        return events
    for w in range(800):
        start = T0 + w * 0.5
        pods = ((f"n{w % 64}", w % 8),)
        events.append(_event(rng, pb.EVENT_KIND_STARTED, start, f"w{w}", pods))
        for k in range(1, 4):
            events.append(_event(rng, pb.EVENT_KIND_HEARTBEAT, start + 60 * k, f"w{w}"))
        events.append(_event(rng, pb.EVENT_KIND_STOPPED, start + 300, f"w{w}"))
    return events


def stream_cpu(n_events: int, mix: str = "steady") -> None:
    """`--stream`: one stream of `mix` through `Ingest.stream` against a scratch database."""
    import bench_ingest
    from sqlalchemy import Engine

    from gpufair.api.convert_cluster import config_from_proto
    from gpufair.config_file import parse_config
    from gpufair.domain.config_diff import diff_configs
    from gpufair.gc_tuning import tune_for_serving
    from gpufair.store import config_repo, migrate
    from gpufair.store.database import make_engine
    from gpufair.store.scratch import scratch_database, test_server

    def serialized(events: list[LedgerEvent]) -> list[bytes]:
        return [m.SerializeToString() for m in bench_ingest.messages(events, BATCH)]

    with test_server() as server, scratch_database(server.url, prefix="gpufair_bench") as url:
        migrate.upgrade(url)
        engine: Engine = make_engine(url)
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
            ingest = Ingest(engine)
            if before:
                setup = ingest.stream(
                    pb.ReportEventsRequest.FromString(r) for r in serialized(before)
                )
                bench_ingest.assert_all_stored(
                    [pb.ReportEventsResponse.FromString(setup)], len(before)
                )
            raw = serialized(events)
            tune_for_serving()
            process, thread = time.process_time(), time.thread_time()
            start = time.perf_counter()
            reply = operator.call(  # the span `--callgrind` counts
                ingest.stream, (pb.ReportEventsRequest.FromString(r) for r in raw)
            )
            wall = time.perf_counter() - start
            thread, process = time.thread_time() - thread, time.process_time() - process
        finally:
            engine.dispose()
    n = len(events)
    bench_ingest.assert_all_stored([pb.ReportEventsResponse.FromString(reply)], n)
    print(
        f"{mix} stream: {n} events, CPU per event {thread / n * 1e6:.2f} µs (stream thread), "
        f"{process / n * 1e6:.2f} µs (process), wall {wall / n * 1e6:.2f} µs"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mix", choices=["steady", "churn"], default="steady")
    parser.add_argument("--passes", type=int, default=15)
    parser.add_argument("--callgrind", action="store_true")
    parser.add_argument(
        "--stream", action="store_true", help="a whole steady stream, database included"
    )
    parser.add_argument("--events", type=int, default=50_000, help="with --stream")
    args = parser.parse_args()
    if args.stream:
        stream_cpu(args.events, args.mix)
        return
    events = events_of(args.mix)
    raw = [
        pb.ReportEventsRequest(events=events[i : i + BATCH]).SerializeToString()
        for i in range(0, len(events), BATCH)
    ]
    ingest = Ingest(None, clock=lambda: T0 + 3 * 86400)  # type: ignore[arg-type]

    def one_pass() -> int:
        reply = EncodedReply()
        for data in raw:
            message = ingest.prepare(pb.ReportEventsRequest.FromString(data), "events")
            outcomes = message.outcomes = message.batch.outcomes
            for c in message.batch.candidates:
                outcomes.statuses[c.position] = EventStatus.STORED
            _report(reply, message)
        return len(reply.encoded())

    one_pass()  # imports and caches warm
    if args.callgrind:
        operator.call(one_pass)
        print(f"{len(events)} events in one pass")
        return
    spent = []
    for _ in range(args.passes):
        before = time.process_time()
        one_pass()
        spent.append(time.process_time() - before)
    spent.sort()
    n = len(events)
    print(
        f"{args.mix}: {n} events, CPU per event {spent[0] / n * 1e6:.2f} µs (fastest pass), "
        f"{spent[len(spent) // 2] / n * 1e6:.2f} µs (median pass)"
    )


if __name__ == "__main__":
    main()
