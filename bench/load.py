"""Load: concurrent clients mixing GetFairShare, ReportEvents and Schedule against `gpufair serve`.

    python bench/load.py [--clients 200] [--seconds 60]

`gpufair serve` runs as a child process with its default settings (one process per core, 32 work
slots and 256 Schedule waiter threads each, periodic jobs on; `--processes` sets the count) on a scratch database, loopback only. The cluster has two pools of 8-GPU nodes: `main`
(60 nodes), with a backlog of 3,000 waiting workloads that `Schedule` places, and `batch` (four
GPUs per client), whose workloads the clients run by reporting events. Each client has its own channel (its own TCP connection),
connected before the clock starts, and calls one RPC after another without pause, choosing each call by weight:

- GetFairShare of either pool;
- ReportEvents: what a batch system reports: `started` for the binds its last Schedule gave it
  (with the pods gpufair chose), `stopped` for those that ran their few seconds, and for its own
  `batch` workloads a new `started`, `heartbeat`s for the others and a `stopped` for the oldest;
- Schedule of `main`. Calls that arrive while a cycle runs share the next one; the first client
  to receive a cycle's reply starts its binds (the others got the same decisions).

Every event is valid, so every one must be stored: a rejected event counts as an error, as does
any failed call, and any error fails the run (exit status 1). The server's resident memory is
read from /proc/<pid>/status every second; the run fails if it grows by 10 % or more over the
second half. Afterwards the database is checked: every acknowledged event stored, no GPU of
`main` held twice.

The clients are asyncio tasks of one process (grpc.aio), so that 200 of them cost one thread;
`--client-processes N` spreads them over N processes (client i in process i mod N), so that the
replies of one coalesced cycle, which arrive together, are not read one after another by one
event loop (that wait counts in the latencies). On a small machine they share its cores with the
server and PostgreSQL; the CPU time each used is printed, to show whether the clients or the
server were the limit.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import random
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import defaultdict, deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from server_process import backend_cpu_s, backends_used, free_port, tree, tree_cpu_s, wait_serving
from sqlalchemy import create_engine, text

from gpufair.client import GpufairClient
from gpufair.config_file import parse_config
from gpufair.store.database import normalise_url
from gpufair.store.scratch import scratch_database, test_server
from gpufair.v1 import ledger_pb2, ledger_pb2_grpc, scheduler_pb2, scheduler_pb2_grpc

NODES = 60
BACKLOG = 3000  # waiting workloads of `main`
OWN_WORKLOADS = 50  # `batch` workloads per client, reused (as new runs) once all have run
OWN_SLOTS = 4  # GPUs of `batch` each client runs on at once
MAIN_RUN_S = (3.0, 10.0)  # how long a workload placed by Schedule runs
RPCS = ("GetFairShare", "ReportEvents", "Schedule")
SLOW_S = 2.0  # calls slower than this are counted by when they ended in the run
TAKEN_FLAGS = 1 << 20  # cycle ids a run of several client processes can tell apart (`Stats`)


QUEUES = (("llm", 0.4), ("vision", 0.3), ("speech", 0.2), ("robotics", 0.1))


def batch_nodes(clients: int) -> int:
    """Enough 8-GPU nodes that no two clients ever report a run on the same GPU."""
    return max(1, -(-clients * OWN_SLOTS // 8))


def cluster(clients: int) -> Any:
    nodes = {"main": NODES, "batch": batch_nodes(clients)}
    return parse_config(
        {
            "gpu_types": [{"name": "a100", "memory_gib": 80, "compute_weight": 1}],
            "pools": [{"name": p} for p in nodes],
            "nodes": [
                {
                    "name": f"{p}-n{i:03d}",
                    "pool": p,
                    "gpu_type": "a100",
                    "gpu_count": 8,
                    "cpu_millicores": 128000,
                    "memory_mib": 1048576,
                }
                for p, count in nodes.items()
                for i in range(count)
            ],
            "queues": [
                {
                    "name": q,
                    "quotas": [{"pool": p, "deserved_cu": 8 * n * s} for p, n in nodes.items()],
                }
                for q, s in QUEUES
            ],
        }
    )


def backlog() -> list[scheduler_pb2.Workload]:
    rng = random.Random(7)
    return [
        scheduler_pb2.Workload(
            uid=f"m{i}",
            queue=QUEUES[i % 4][0],
            pool="main",
            pods=rng.choice([1, 1, 1, 2]),
            gpus_per_pod=rng.choice([1, 1, 2, 4, 8]),
            cpu_millicores_per_pod=8000,
            memory_mib_per_pod=65536,
        )
        for i in range(BACKLOG)
    ]


def own_workloads(clients: int) -> list[scheduler_pb2.Workload]:
    return [
        scheduler_pb2.Workload(
            uid=f"b{c}-{k}", queue=QUEUES[c % 4][0], pool="batch", pods=1, gpus_per_pod=1
        )
        for c in range(clients)
        for k in range(OWN_WORKLOADS)
    ]


def event(
    kind: ledger_pb2.EventKind.ValueType, uid: str, at_s: float, pods: Any = ()
) -> ledger_pb2.LedgerEvent:
    msg = ledger_pb2.LedgerEvent(event_id=str(uuid.uuid4()), workload_uid=uid, kind=kind)
    msg.occurred_at.FromNanoseconds(round(at_s * 1e9))
    for p in pods:
        msg.pods.add(node=p.node, gpu_indices=p.gpu_indices, gpu_fraction=p.gpu_fraction)
    return msg


@dataclass
class OwnPod:
    node: str
    gpu_indices: list[int]
    gpu_fraction: float = 1.0


@dataclass
class Stats:
    latencies: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    errors: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    acknowledged: int = 0
    binds: int = 0
    # Cycles whose binds a client has taken on. Calls of one pool that arrive while a cycle
    # runs share it or the next one (api/cycle_gate.py): every caller gets the same binds, and,
    # as one batch system with several callers would, only the first to see a cycle starts them.
    # With several client processes the first is found across them (`taken`, one flag per
    # cycle id in shared memory): a cycle may reach the clients of one process only, and its
    # binds, never started, would hold their GPUs for the rest of the run.
    cycles_taken: set[int] = field(default_factory=set)
    taken: Any = None  # multiprocessing.Array of flags by cycle id, or None in one process
    # For each Schedule call: its cycle's id less the highest cycle id any client of this
    # process had received when the call was sent. 1: the cycle running at the call (or the next
    # to start); each cycle of the pool the caller waited through adds one. Unlike the latency
    # it does not stretch when other work slows the machine down.
    latest_cycle: int = 0
    cycles_after_known: list[int] = field(default_factory=list)
    window_s: float = 0.0  # from the clients' start (connected) to the last one's end
    seconds: float = 0.0  # the run's length asked for
    slow: dict[int, int] = field(default_factory=lambda: defaultdict(int))  # by 5 s step

    def takes(self, cycle_id: int) -> bool:
        if cycle_id in self.cycles_taken:
            return False
        self.cycles_taken.add(cycle_id)
        if self.taken is None:
            return True
        with self.taken.get_lock():
            if self.taken[cycle_id % TAKEN_FLAGS]:
                return False
            self.taken[cycle_id % TAKEN_FLAGS] = 1
        return True

    def plain(self) -> dict[str, Any]:
        """What a client process sends back (picklable)."""
        return {
            "latencies": dict(self.latencies),
            "errors": dict(self.errors),
            "acknowledged": self.acknowledged,
            "binds": self.binds,
            "cycles_after_known": self.cycles_after_known,
            "window_s": self.window_s,
            "slow": dict(self.slow),
        }

    def add(self, plain: dict[str, Any]) -> None:
        for rpc, values in plain["latencies"].items():
            self.latencies[rpc].extend(values)
        for error, count in plain["errors"].items():
            self.errors[error] += count
        self.acknowledged += plain["acknowledged"]
        self.binds += plain["binds"]
        self.cycles_after_known += plain["cycles_after_known"]
        self.window_s = max(self.window_s, plain["window_s"])
        for step, count in plain["slow"].items():
            self.slow[step] += count


class Client:
    """One batch system: its channel, its workloads, what it has running."""

    def __init__(self, index: int, address: str, weights: list[float], stats: Stats) -> None:
        self.index = index
        self.weights = weights
        self.stats = stats
        self.rng = random.Random(index)
        # A subchannel pool of its own gives the channel its own TCP connection.
        self.channel = grpc.aio.insecure_channel(
            address, options=[("grpc.use_local_subchannel_pool", 1)]
        )
        self.ledger = ledger_pb2_grpc.LedgerStub(self.channel)
        self.scheduler = scheduler_pb2_grpc.SchedulerStub(self.channel)
        self.fresh: deque[str] = deque(f"b{index}-{k}" for k in range(OWN_WORKLOADS))
        self.running: deque[tuple[str, int]] = deque()  # own workloads and their GPU slot
        self.free_slots = list(range(OWN_SLOTS))
        self.to_start: list[scheduler_pb2.BindDecision] = []
        self.main_running: list[tuple[str, float]] = []  # uid, when it finishes

    def own_pod(self, slot: int) -> OwnPod:
        gpu = self.index * OWN_SLOTS + slot  # the client's own GPUs of `batch`
        return OwnPod(f"batch-n{gpu // 8:03d}", [gpu % 8])

    def report(self) -> list[ledger_pb2.LedgerEvent]:
        now = time.time()
        events = []
        for bind in self.to_start:
            events.append(event(ledger_pb2.EVENT_KIND_STARTED, bind.uid, now, bind.pods))
            self.main_running.append((bind.uid, now + self.rng.uniform(*MAIN_RUN_S)))
        self.to_start = []
        done = [uid for uid, end in self.main_running if end <= now]
        self.main_running = [(uid, end) for uid, end in self.main_running if end > now]
        events += [event(ledger_pb2.EVENT_KIND_STOPPED, uid, now) for uid in done]
        if not self.free_slots:
            uid, slot = self.running.popleft()
            events.append(event(ledger_pb2.EVENT_KIND_STOPPED, uid, now))
            self.fresh.append(uid)  # runs again later, as a new run of the same workload
            self.free_slots.append(slot)
        events += [event(ledger_pb2.EVENT_KIND_HEARTBEAT, uid, now) for uid, _ in self.running]
        uid, slot = self.fresh.popleft(), self.free_slots.pop()
        events.append(event(ledger_pb2.EVENT_KIND_STARTED, uid, now, [self.own_pod(slot)]))
        self.running.append((uid, slot))
        return events

    async def call(self, rpc: str) -> None:
        if rpc == "GetFairShare":
            pool = self.rng.choice(("main", "batch"))
            await self.ledger.GetFairShare(ledger_pb2.GetFairShareRequest(pool=pool), timeout=30)
        elif rpc == "ReportEvents":
            request = ledger_pb2.ReportEventsRequest(events=self.report())
            ack = await self.ledger.ReportEvents(request, timeout=30)
            for r in ack.results:
                if r.status == ledger_pb2.EVENT_STATUS_STORED:
                    self.stats.acknowledged += 1
                else:
                    self.stats.errors[f"ReportEvents event {r.status}: {r.error}"] += 1
        else:
            known = self.stats.latest_cycle
            cycle = await self.scheduler.Schedule(
                scheduler_pb2.ScheduleRequest(pool="main", request_id=str(uuid.uuid4())),
                timeout=30,
            )
            if known:
                self.stats.cycles_after_known.append(cycle.cycle_id - known)
            self.stats.latest_cycle = max(self.stats.latest_cycle, cycle.cycle_id)
            if self.stats.takes(cycle.cycle_id):
                self.to_start += cycle.binds
                self.stats.binds += len(cycle.binds)

    async def run(self, until: float, budget: list[int]) -> None:
        while time.monotonic() < until and budget[0] > 0:
            budget[0] -= 1
            rpc = self.rng.choices(RPCS, self.weights)[0]
            start = time.perf_counter()
            try:
                await self.call(rpc)
            except grpc.aio.AioRpcError as exc:
                self.stats.errors[f"{rpc} {exc.code().name}: {exc.details()}"] += 1
                continue
            took = time.perf_counter() - start
            self.stats.latencies[rpc].append(took)
            if took > SLOW_S:  # when in the run the slow calls ended, in 5 s steps
                self.stats.slow[int((time.monotonic() - until + self.stats.seconds) // 5) * 5] += 1
        await self.channel.close(None)


def read_rss_kib(pid: int) -> int:
    """Resident memory of `pid` and its workers (`gpufair serve --processes N`)."""
    total = 0
    for p in tree(pid):
        for line in Path(f"/proc/{p}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                total += int(line.split()[1])
    if not total:
        raise RuntimeError(f"no VmRSS for {pid}")
    return total


def sample_rss(pid: int, stop: threading.Event, samples: list[tuple[float, int]]) -> None:
    start = time.monotonic()
    while not stop.is_set():
        samples.append((time.monotonic() - start, read_rss_kib(pid)))
        stop.wait(1.0)


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def drive(
    address: str,
    clients: int,
    seconds: float,
    weights: list[float],
    max_calls: int,
    share: tuple[int, int] = (0, 1),
    taken: Any = None,
) -> Stats:
    """Run the clients of process `share[0]` of `share[1]` for `seconds`; `taken`: the cycles
    whose binds a client of any process has taken on (`Stats.taken`)."""
    stats = Stats(seconds=seconds, taken=taken)
    budget = [max_calls]
    k, n = share
    pool = [Client(i, address, weights, stats) for i in range(k, clients, n)]
    # Connected first: the latencies are of calls, not of 200 TCP and HTTP/2 handshakes at once.
    await asyncio.gather(*(c.channel.channel_ready() for c in pool))
    start = time.monotonic()
    until = start + seconds
    await asyncio.gather(*(c.run(until, budget) for c in pool))
    stats.window_s = time.monotonic() - start
    return stats


def drive_process(
    address: str,
    clients: int,
    seconds: float,
    weights: list[float],
    max_calls: int,
    share: tuple[int, int],
    out: Any,
    taken: Any,
) -> None:
    """A client process: its share of the clients; its results go to `out` (a queue)."""
    stats = asyncio.run(drive(address, clients, seconds, weights, max_calls, share, taken))
    out.put(stats.plain())


def drive_processes(
    address: str, clients: int, seconds: float, weights: list[float], max_calls: int, n: int
) -> Stats:
    """The clients spread over `n` processes (started fresh: the parent has used grpc)."""
    context = multiprocessing.get_context("spawn")
    out = context.Queue()
    taken = context.Array("b", TAKEN_FLAGS)  # zeroed; cycle ids of a run stay far below
    procs = [
        context.Process(
            target=drive_process,
            args=(address, clients, seconds, weights, max_calls // n, (k, n), out, taken),
        )
        for k in range(n)
    ]
    for p in procs:
        p.start()
    stats = Stats()
    for _ in procs:
        stats.add(out.get())
    for p in procs:
        p.join()
        if p.exitcode != 0:
            stats.errors[f"client process exited {p.exitcode}"] += 1
    return stats


def round_or_none(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds, 1)


DATABASE_WORK = (
    "xact_commit",
    "xact_rollback",
    "tup_returned",
    "tup_fetched",
    "tup_inserted",
    "tup_updated",
    "blks_hit",
)


def database_work(url: str) -> dict[str, int]:
    """The database's cumulative counters (pg_stat_database): the run reports their growth per
    call, what each call costs PostgreSQL (transactions, rows scanned and read, pages touched)."""
    engine = create_engine(normalise_url(url))
    try:
        with engine.connect() as conn:
            conn.execute(text("SELECT pg_stat_clear_snapshot()"))
            row = conn.execute(
                text(
                    f"SELECT {', '.join(DATABASE_WORK)} FROM pg_stat_database "
                    "WHERE datname = current_database()"
                )
            ).one()
    finally:
        engine.dispose()
    return dict(zip(DATABASE_WORK, (int(v) for v in row), strict=True))


def check_database(url: str, acknowledged: int) -> dict[str, Any]:
    engine = create_engine(normalise_url(url))
    try:
        with engine.connect() as conn:
            events = conn.execute(text("SELECT count(*) FROM ledger_events")).scalar_one()
            holders = conn.execute(
                text(
                    "SELECT uid, 'bound' AS how, binding->'pods' AS pods, "
                    "(binding->>'cycle_id')::bigint AS cycle FROM workloads "
                    "WHERE pool = 'main' AND state = 'bound' UNION ALL "
                    "SELECT i.workload_uid, 'running', i.pods, (w.binding->>'cycle_id')::bigint "
                    "FROM allocation_intervals i JOIN workloads w ON w.uid = i.workload_uid "
                    "WHERE i.pool = 'main' AND i.ended_at IS NULL"
                )
            ).all()
            use: dict[tuple[str, int], float] = defaultdict(float)
            held_by: dict[tuple[str, int], list[str]] = defaultdict(list)
            for uid, how, pods, cycle in holders:
                for pod in pods:
                    for index in pod["gpu_indices"]:
                        use[(pod["node"], index)] += pod["gpu_fraction"]
                        held_by[(pod["node"], index)].append(f"{uid} {how}, bound by cycle {cycle}")
            cycles = conn.execute(text("SELECT count(*) FROM schedule_cycles")).scalar_one()
    finally:
        engine.dispose()
    twice = sorted(gpu for gpu, used in use.items() if used > 1 + 1e-9)
    return {
        "events_stored": events,
        "events_acknowledged": acknowledged,
        "schedule_cycles": cycles,
        "max_use_of_one_gpu": max(use.values(), default=0.0),
        "gpus_held_twice": {f"{n}/{i}": held_by[(n, i)] for n, i in twice[:5]},
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=200)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument(
        "--mix",
        default="50,45,5",
        help="weights of GetFairShare, ReportEvents, Schedule (default 50,45,5)",
    )
    parser.add_argument(
        "--server-workers",
        type=int,
        default=32,
        help="RPCs at once of the server (serve --workers)",
    )
    parser.add_argument(
        "--processes", type=int, default=None, help="gpufair serve --processes (its default: cores)"
    )
    parser.add_argument("--max-calls", type=int, default=2_000_000, help="stop after this many")
    parser.add_argument(
        "--server-tree",
        type=Path,
        default=None,
        help="run the server from this checkout's service/ (another commit, side by side); "
        "the clients and checks stay this one's",
    )
    parser.add_argument(
        "--client-processes",
        type=int,
        default=1,
        help="processes the clients are spread over (default 1: asyncio tasks of this one)",
    )
    args = parser.parse_args()
    weights = [float(w) for w in args.mix.split(",")]
    env = {k: v for k, v in os.environ.items() if k != "GPUFAIR_DATABASE_URL"}
    if args.server_tree is not None:
        env["PYTHONPATH"] = str((args.server_tree / "service").resolve())

    with (
        test_server() as server,
        scratch_database(server.url, prefix="gpufair_bench") as url,
        tempfile.TemporaryFile() as log,
    ):
        address = f"127.0.0.1:{free_port()}"
        proc = subprocess.Popen(
            [
                *(sys.executable, "-m", "gpufair.cli", "serve", "--address", address),
                *("--database-url", url, "--metrics-address", "", "--grace-s", "5"),
                *("--workers", str(args.server_workers)),
                *(("--processes", str(args.processes)) if args.processes else ()),
            ],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            wait_serving(address, proc)
            with GpufairClient(address, timeout_s=120) as c:
                c.apply_config(cluster(args.clients))
                c.submit_workloads(backlog())
                mine = own_workloads(args.clients)
                for i in range(0, len(mine), 5000):
                    c.submit_workloads(mine[i : i + 5000])
                c.get_fair_share("main")
                c.get_fair_share("batch")
                # The cycle time of `main` alone (dry runs: nothing stored), the unit in which
                # Schedule's latencies under load are read.
                cycle_s = []
                for _ in range(5):
                    t0 = time.monotonic()
                    c.schedule("main", dry_run=True)
                    cycle_s.append(time.monotonic() - t0)

            samples: list[tuple[float, int]] = []
            stop = threading.Event()
            sampler = threading.Thread(target=sample_rss, args=(proc.pid, stop, samples))
            load_before = os.getloadavg()
            server_cpu_0 = tree_cpu_s(proc.pid)
            backends_0 = backend_cpu_s(url)
            database_0 = database_work(url)
            own_0 = resource.getrusage(resource.RUSAGE_SELF)
            children_0 = resource.getrusage(resource.RUSAGE_CHILDREN)
            sampler.start()
            started = time.monotonic()
            if args.client_processes > 1:
                stats = drive_processes(
                    address,
                    args.clients,
                    args.seconds,
                    weights,
                    args.max_calls,
                    args.client_processes,
                )
            else:
                stats = asyncio.run(
                    drive(address, args.clients, args.seconds, weights, args.max_calls)
                )
            elapsed = time.monotonic() - started
            stop.set()
            sampler.join()
            own_1 = resource.getrusage(resource.RUSAGE_SELF)
            # The client processes, joined by now (the server is still running: not counted).
            children_1 = resource.getrusage(resource.RUSAGE_CHILDREN)
            server_cpu = tree_cpu_s(proc.pid) - server_cpu_0
            backends_1 = backend_cpu_s(url)
            database_1 = database_work(url)
            load_after = os.getloadavg()
            alive = proc.poll() is None
        finally:
            proc.send_signal(signal.SIGTERM)
            exit_code = proc.wait(timeout=60)
        log.seek(0)
        internal = log.read().decode(errors="replace").count("internal error")
        database = check_database(url, stats.acknowledged)

    # Rates over the clients' own window: client processes take seconds to start.
    window = stats.window_s or elapsed
    # Memory over the second half of that window.
    half = [rss for t, rss in samples if t >= elapsed - window / 2]
    growth = (max(half) - half[0]) / half[0]
    calls = {rpc: len(stats.latencies[rpc]) for rpc in RPCS}
    cycles = database["schedule_cycles"]
    under_load_s = window / cycles if cycles else None
    client_cpu = own_1.ru_utime + own_1.ru_stime - own_0.ru_utime - own_0.ru_stime
    client_cpu += children_1.ru_utime + children_1.ru_stime
    client_cpu -= children_0.ru_utime + children_0.ru_stime
    result = {
        "clients": args.clients,
        "client_processes": args.client_processes,
        "server_workers": args.server_workers,
        "seconds": round(window, 1),
        "wall_s": round(elapsed, 1),
        "mix": dict(zip(RPCS, weights, strict=True)),
        "calls": sum(calls.values()),
        "throughput_per_s": round(sum(calls.values()) / window, 1),
        "per_rpc": {
            rpc: {
                "calls": calls[rpc],
                "per_s": round(calls[rpc] / window, 1),
                "p50_ms": round(1000 * statistics.median(stats.latencies[rpc]), 1),
                "p90_ms": round(1000 * percentile(stats.latencies[rpc], 0.90), 1),
                "p99_ms": round(1000 * percentile(stats.latencies[rpc], 0.99), 1),
            }
            for rpc in RPCS
            if stats.latencies[rpc]
        },
        "cycle_ms_alone": round(1000 * statistics.median(cycle_s), 1),
        "schedule_p99_in_cycles": (
            round(percentile(stats.latencies["Schedule"], 0.99) / statistics.median(cycle_s), 1)
            if stats.latencies["Schedule"]
            else None
        ),
        # The cycle under this load: the run's wall time over the cycles it stored.
        "cycle_ms_under_load": round(1000 * under_load_s, 1) if under_load_s else None,
        "schedule_p50_p99_in_cycles_under_load": (
            [
                round(statistics.median(stats.latencies["Schedule"]) / under_load_s, 1),
                round(percentile(stats.latencies["Schedule"], 0.99) / under_load_s, 1),
            ]
            if stats.latencies["Schedule"] and under_load_s
            else None
        ),
        "schedule_cycles_after_known": (
            {
                "p50": statistics.median(stats.cycles_after_known),
                "p90": percentile(stats.cycles_after_known, 0.90),
                "p99": percentile(stats.cycles_after_known, 0.99),
                "max": max(stats.cycles_after_known),
            }
            if stats.cycles_after_known
            else None
        ),
        f"calls_over_{SLOW_S:g}_s_by_5_s_of_the_run": dict(sorted(stats.slow.items())),
        "errors": dict(stats.errors),
        "binds": stats.binds,
        "rss_mib": {
            "start": round(samples[0][1] / 1024, 1),
            "half": round(half[0] / 1024, 1),
            "max_second_half": round(max(half) / 1024, 1),
            "end": round(samples[-1][1] / 1024, 1),
            "growth_second_half_pct": round(100 * growth, 2),
        },
        "cpu_s": {
            "server": round(server_cpu, 1),
            "clients": round(client_cpu, 1),
            "client_ms_per_call": round(1000 * client_cpu / max(1, sum(calls.values())), 2),
            "postgres_backends_at_least": round_or_none(backends_used(backends_0, backends_1)),
            "available": round(elapsed * (os.cpu_count() or 1), 1),
            "load_average_before": round(load_before[0], 2),
            "load_average_after": round(load_after[0], 2),
        },
        "database_work": {
            name: round((database_1[name] - database_0[name]) / max(1, sum(calls.values())), 1)
            for name in database_0
        },
        "server_alive_after": alive,
        "server_exit_code": exit_code,
        "internal_errors_logged": internal,
        "database": database,
    }
    print(json.dumps(result, indent=2))
    failed = [
        reason
        for reason, bad in (
            ("errors", bool(stats.errors)),
            ("memory grew 10 % or more over the second half", growth >= 0.10),
            ("server died", not alive or exit_code != 0),
            ("events stored != acknowledged", database["events_stored"] != stats.acknowledged),
            ("a GPU of main held twice", database["max_use_of_one_gpu"] > 1 + 1e-9),
        )
        if bad
    ]
    if failed:
        print("FAILED: " + "; ".join(failed), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
