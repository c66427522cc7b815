"""What a tick of the periodic jobs costs when nothing is due, for two checkouts side by side.

    python bench/jobs_tick.py --baseline CHECKOUT [--pools 1] [--ticks 300] [--rounds 3]
    python bench/jobs_tick.py --baseline CHECKOUT --instructions [--ticks 100]

A scratch database gets a cluster of `--pools` pools; then, round by round, each checkout in
turn (the order swapped every round) runs `jobs_tick.py --child` with its own `service/` on the
path: a `PeriodicJobs` at a fixed instant ticks once (every job's period runs and is claimed),
then `--ticks` more ticks, with nothing due, are measured. Per tick: the statements the job
runner's engine sent (SQLAlchemy's cursor executions), its transactions (begins), the CPU time
of the process (`time.process_time`, every thread: the base takes each job's period on the
job's lane), the CPU of the PostgreSQL backends of its connections (`/proc/<pid>/stat`, so
PostgreSQL must run on this machine), and wall time. Every run ticks at one instant, the
parent's, so only the first run's first tick finds anything due.

`--instructions`: the instructions of the process per tick, under Valgrind (cachegrind without
its cache simulation), steady where time is not: each checkout's child runs twice, with
`--ticks` measured ticks and with none, and the difference is divided by `--ticks`.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()
TICKS_PER_S = os.sysconf("SC_CLK_TCK")


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS_PER_S


def child(url: str, ticks: int, at_s: float) -> dict[str, float]:
    from sqlalchemy import event

    from gpufair.jobs.runner import JobSettings, PeriodicJobs
    from gpufair.store.database import make_engine

    engine = make_engine(url, pool_size=8)
    backends: set[int] = set()
    counts = {"statements": 0, "begins": 0}

    @event.listens_for(engine, "connect")
    def _backend(dbapi_conn: Any, _record: Any) -> None:
        with dbapi_conn.cursor() as cur:
            cur.execute("SELECT pg_backend_pid()")
            backends.add(int(cur.fetchone()[0]))
        dbapi_conn.rollback()

    @event.listens_for(engine, "before_cursor_execute")
    def _statement(*_args: Any) -> None:
        counts["statements"] += 1

    @event.listens_for(engine, "begin")
    def _begin(*_args: Any) -> None:
        counts["begins"] += 1

    jobs = PeriodicJobs(engine, JobSettings(), clock=lambda: at_s, replica=f"bench-{os.getpid()}")
    jobs.tick()  # every job's period runs and is claimed
    for _ in range(20):  # warm up, with nothing due
        jobs.tick()
    counts.update(statements=0, begins=0)
    pids = sorted(backends)
    db_before = sum(_cpu_s(p) for p in pids)
    cpu_before, wall_before = time.process_time(), time.perf_counter()
    for _ in range(ticks):
        jobs.tick()
    cpu_s, wall_s = time.process_time() - cpu_before, time.perf_counter() - wall_before
    db_s = sum(_cpu_s(p) for p in pids) - db_before
    jobs.stop(5.0)
    engine.dispose()
    per = max(1, ticks)
    return {
        "statements": counts["statements"] / per,
        "begins": counts["begins"] / per,
        "cpu_ms": 1000 * cpu_s / per,
        "db_cpu_ms": 1000 * db_s / per,
        "wall_ms": 1000 * wall_s / per,
    }


def _run_child(tree: Path, url: str, ticks: int, at_s: float, valgrind: bool) -> tuple[str, str]:
    env = {**os.environ, "PYTHONPATH": str(tree / "service"), "PYTHONHASHSEED": "0"}
    command = [sys.executable, str(HERE), "--child", url, "--ticks", str(ticks), "--at", str(at_s)]
    if valgrind:
        command = [
            *("valgrind", "--tool=cachegrind", "--cache-sim=no"),
            "--cachegrind-out-file=/dev/null",
            *command,
        ]
    done = subprocess.run(command, env=env, check=True, capture_output=True, text=True)
    return done.stdout, done.stderr


def instructions(tree: Path, url: str, ticks: int, at_s: float) -> float:
    """Instructions per tick: a child with `ticks` measured ticks less one with none."""
    refs = []
    for n in (ticks, 0):
        _, err = _run_child(tree, url, n, at_s, valgrind=True)
        found = re.search(r"I\s+refs:\s+([\d,]+)", err)
        assert found, err[-2000:]
        refs.append(int(found.group(1).replace(",", "")))
    return (refs[0] - refs[1]) / ticks


def cluster(pools: int) -> Any:
    from gpufair.v1 import cluster_pb2

    config = cluster_pb2.ClusterConfig()
    config.gpu_types.add(name="a100", memory_gib=80, compute_weight=10.0)
    queue = config.queues.add(name="alpha")
    for i in range(pools):
        config.pools.add(name=f"pool-{i}")
        config.nodes.add(name=f"n{i}", pool=f"pool-{i}", gpu_type="a100", gpu_count=8)
        queue.quotas.add(pool=f"pool-{i}", deserved_cu=20)
    return config


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--baseline", help="the other checkout (its service/ is imported)")
    parser.add_argument("--pools", type=int, default=1)
    parser.add_argument("--ticks", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--instructions", action="store_true", help="under Valgrind")
    parser.add_argument("--child", metavar="URL", help=argparse.SUPPRESS)
    parser.add_argument("--at", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.ticks, args.at)))
        return

    from gpufair.api.server import build_server
    from gpufair.client import GpufairClient
    from gpufair.store import migrate
    from gpufair.store.database import make_engine
    from gpufair.store.scratch import scratch_database, test_server

    trees = {"new": HERE.parents[1]}
    if args.baseline:
        trees = {"base": Path(args.baseline).resolve(), **trees}
    results: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
    with test_server() as server, scratch_database(server.url) as url:
        migrate.upgrade(url)
        engine = make_engine(url)
        running = build_server(engine, "127.0.0.1:0")
        with GpufairClient(f"127.0.0.1:{running.port}", attempts=1) as client:
            client.apply_config(cluster(args.pools))
        running.stop(1.0)
        engine.dispose()
        at_s = time.time()
        _run_child(trees["new"], url, 0, at_s, valgrind=False)  # every period claimed, done
        if args.instructions:
            for name, tree in trees.items():
                per_tick = instructions(tree, url, args.ticks, at_s)
                print(f"{name}: {per_tick / 1e6:.3f} M instructions per tick")
            return
        for round_ in range(args.rounds):
            order = list(trees) if round_ % 2 == 0 else list(reversed(trees))
            for name in order:
                out, _ = _run_child(trees[name], url, args.ticks, at_s, valgrind=False)
                got = json.loads(out.strip().splitlines()[-1])
                results[name].append(got)
                print(
                    f"round {round_ + 1} {name}: "
                    + ", ".join(f"{k} {v:.3f}" for k, v in got.items())
                )
    jobs = f"{args.pools} pool(s), {args.pools + 3} jobs"
    print(f"\n{jobs}, {args.ticks} ticks a run, medians of {args.rounds} runs:")
    for name, runs in results.items():
        medians = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        print(f"{name}: " + ", ".join(f"{k} {v:.3f}" for k, v in medians.items()))


if __name__ == "__main__":
    main()
