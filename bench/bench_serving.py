"""Serving: GetFairShare through `h2load` against `gpufair serve` and against a trivial gRPC
Python server answering the same bytes, in one run.

    python bench/bench_serving.py [--processes N] [--seconds 10] [--connections 32 --streams 1]
                                  [--baseline CHECKOUT] [--rounds R]

`gpufair serve --processes N` (default: the number of cores) runs on a scratch database with the
cluster of `load.py` (pool `main`: 60 nodes, four queues) and its first recompute; the reply it
gives for `main` is saved and `trivial_server.py` answers it byte for byte, first as one process
(what one Python process can serve), then as N processes on one port. `h2load` (nghttp2) sends
the same gRPC request over `connections` x `streams` concurrent streams for `seconds` after a
warm-up of two seconds (every target is driven the same way); it is written in C and uses one thread, so the load generator is not
the limit (its CPU time is printed beside the servers'). Rates are replies per second of wall
time; latencies come from h2load's per-request log. The JSON printed is what `results/serving.md`
shows.

CPU is counted over h2load's measured period only, the period its log and summary cover: each
target's CPU time (the whole process tree, from /proc) and h2load's own are read when h2load
says that period starts and again when it says it is over (it prints both lines as they
happen). Read before and after the whole h2load run instead (until round 22), the warm-up's
CPU and the connections' set-up and close were divided by the measured period's replies only,
which overstated CPU per reply by about (warm-up + seconds) / seconds, 1.2 x at 10 seconds
(`results/serving.md`, round 22). Counting the warm-up's replies in the divisor instead is not
possible alike for every target: h2load reports none of them, and only gpufair logs its calls.
`server_cpu_ms_per_reply_whole_run` is the old accounting, printed beside for comparison with
the figures recorded before.

With `--baseline`, gpufair is also run from another checkout's `service/` (the code before a
change) in the same run, on a database of its own. Every target is started before the first
measurement and stays up to the end; `--rounds R` drives each of them once per round, the order
rotated by one each round (so no target is always measured first or last while the machine's
other load comes and goes), and prints each round's figures and ratios (a ratio is between
neighbouring measurements of one round) with the median of each ratio over the rounds. `spread` is how the
kernel's SO_REUSEPORT hash dealt h2load's connections to the server's processes (read with `ss`
during the run): with 8 connections and 2 workers, 4 + 4 is even, 5 + 3 or worse is not.

The 32 streams come from 32 connections of one stream each by default, as from a fleet of
clients that each wait for their reply before the next call. With fewer connections than that,
each carrying several streams (8 x 4 until issue 16's last round), the run measured the
kernel's deal of a handful of connections more than either server: the hash gave one of two
processes 6 of 8 connections in about half the runs, and that process served three quarters of
the streams on one core while the other idled (`results/serving.md`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from load import cluster
from server_process import cpu_seconds, free_port, tree, tree_cpu_s, wait_serving

from gpufair.client import GpufairClient
from gpufair.store.scratch import scratch_database, test_server
from gpufair.v1 import ledger_pb2

HERE = Path(__file__).resolve().parent
PATH = "/gpufair.v1.Ledger/GetFairShare"


def percentile(ordered: list[float], q: float) -> float:
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def connection_spread(port: int, server_pid: int) -> list[int]:
    """Established connections to `port` per process of the server's tree, most first."""
    pids = set(tree(server_pid))
    out = subprocess.run(
        ["ss", "-Htnp", "state", "established", f"( sport = :{port} )"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    counts: Counter[int] = Counter()
    for line in out.splitlines():
        for owner in line.split("pid=")[1:]:
            pid = int(owner.split(",", 1)[0])
            if pid in pids:
                counts[pid] += 1
    return sorted(counts.values(), reverse=True)


def wait_listening(port: int, sockets: int, timeout_s: float = 120.0) -> None:
    """Until `sockets` sockets listen on `port` (one per process of a group sharing it): h2load
    connects all at once, and a process not yet listening would get none of them."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        out = subprocess.run(
            ["ss", "-Htln", f"( sport = :{port} )"], capture_output=True, text=True, check=False
        ).stdout
        if len(out.splitlines()) >= sockets:
            return
        time.sleep(0.2)
    raise TimeoutError(f"fewer than {sockets} sockets listen on port {port}")


# What h2load prints (and flushes) as its measured period starts and ends, with one thread.
MAIN_STARTS = "Main benchmark duration is started"
MAIN_OVER = "Main benchmark duration is over"


def run_h2load(command: list[str], server_pid: int) -> tuple[str, dict[str, tuple[float, float]]]:
    """Run h2load; its output, and at each of its two lines that bound the measured period, the
    CPU seconds so far of the server's process tree and of h2load itself."""
    marks: dict[str, tuple[float, float]] = {}
    lines: list[str] = []
    with subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    ) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            for mark in (MAIN_STARTS, MAIN_OVER):
                if line.startswith(mark):
                    h2load_cpu = cpu_seconds(proc.pid)
                    marks[mark] = (tree_cpu_s(server_pid), h2load_cpu)
    out = "".join(lines)
    if proc.returncode != 0:
        raise subprocess.CalledProcessError(proc.returncode, command, out)
    if len(marks) != 2:
        raise RuntimeError(f"h2load did not say when its measured period started and ended:\n{out}")
    return out, marks


def h2load(
    port: int, body: Path, seconds: float, connections: int, streams: int, server_pid: int
) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "requests.tsv"
        command = [
            *("h2load", "-D", str(round(seconds)), "--warm-up-time", "2"),
            *("-c", str(connections), "-m", str(streams), "-t", "1"),
            *("-H", "content-type: application/grpc", "-H", "te: trailers"),
            *("-d", str(body), "--log-file", str(log)),
            f"http://127.0.0.1:{port}{PATH}",
        ]
        server_0 = tree_cpu_s(server_pid)
        spread: list[int] = []
        timer = threading.Timer(1.0, lambda: spread.extend(connection_spread(port, server_pid)))
        timer.start()
        out, marks = run_h2load(command, server_pid)
        timer.join()
        server_whole = tree_cpu_s(server_pid) - server_0
        rows = [line.split("\t") for line in log.read_text().splitlines() if line.strip()]
    succeeded = [int(r[2]) / 1000.0 for r in rows if r[1] == "200"]
    failed = len(rows) - len(succeeded)
    # The log holds the measured period only (after the warm-up); its span is the wall time.
    starts = [int(r[0]) / 1e6 for r in rows]
    wall = max(s + int(r[2]) / 1e6 for s, r in zip(starts, rows, strict=True)) - min(starts)
    ordered = sorted(succeeded)
    summary = next(line for line in out.splitlines() if line.startswith("requests:"))
    server_cpu = marks[MAIN_OVER][0] - marks[MAIN_STARTS][0]
    return {
        "replies": len(succeeded),
        "not_200": failed,
        "wall_s": round(wall, 2),
        "per_s": round(len(succeeded) / wall),
        "p50_ms": round(statistics.median(ordered), 2),
        "p99_ms": round(percentile(ordered, 0.99), 2),
        "max_ms": round(ordered[-1], 2),
        "server_cpu_s": round(server_cpu, 2),
        "server_cpu_ms_per_reply": round(1000 * server_cpu / max(1, len(succeeded)), 3),
        "server_cpu_ms_per_reply_whole_run": round(1000 * server_whole / max(1, len(succeeded)), 3),
        "h2load_cpu_s": round(marks[MAIN_OVER][1] - marks[MAIN_STARTS][1], 2),
        "h2load_summary": summary,
        "spread": spread,
    }


def start(command: list[str], log: Any) -> subprocess.Popen[bytes]:
    return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)


def stop(proc: subprocess.Popen[bytes]) -> int:
    proc.send_signal(signal.SIGTERM)
    return proc.wait(timeout=60)


def handler_times(log: Any, since: int) -> dict[str, Any]:
    """From gpufair's RPC log lines written after byte `since` of `log` (the h2load run, its
    warm-up included): how many GetFairShare calls took over 10 ms inside the server's handler
    (waiting there for a check or a rebuild of the read cache, or for the interpreter lock),
    and the 99th percentile of that time. h2load's latency adds the wait before the handler
    and the reply's way back."""
    log.flush()
    log.seek(since)
    calls = [line for line in log.read().splitlines() if b" gpufair.rpc: GetFairShare " in line]
    durations = sorted(
        float(line.rsplit(b" ", 2)[-2])
        for line in calls
        if b" gpufair.rpc: GetFairShare OK " in line and line.endswith(b" ms")
    )
    log.seek(0, os.SEEK_END)
    return {
        # A gRPC error travels in the trailers of an HTTP 200, which h2load counts as a reply:
        # gpufair's own log says whether any call failed.
        "handler_not_ok": sum(1 for line in calls if b" gpufair.rpc: GetFairShare OK " not in line),
        "handler_calls": len(durations),
        "handler_over_10ms": sum(1 for d in durations if d > 10.0),
        "handler_p99_ms": round(percentile(durations, 0.99), 2) if durations else None,
    }


def start_gpufair(
    url: str, env: dict[str, str], args: argparse.Namespace, log: Any
) -> tuple[subprocess.Popen[bytes], int, bytes]:
    """`gpufair serve` on `url` with the cluster of `load.py` and its first recompute, serving
    and listening in every process: the group, its port and its GetFairShare reply's bytes."""
    port = free_port()
    gpufair = subprocess.Popen(
        [
            *(sys.executable, "-m", "gpufair.cli", "serve", "--address", f"127.0.0.1:{port}"),
            *("--database-url", url, "--metrics-address", "", "--grace-s", "5"),
            *("--processes", str(args.processes)),
        ],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        wait_serving(f"127.0.0.1:{port}", gpufair)
        with GpufairClient(f"127.0.0.1:{port}", timeout_s=120) as c:
            c.apply_config(cluster(200))
            reply = c.get_fair_share("main")
        assert len(reply.queues) == 4, reply
        wait_listening(port, args.processes)
    except BaseException:
        stop(gpufair)
        raise
    return gpufair, port, reply.SerializeToString()


@dataclass
class Target:
    name: str
    process: subprocess.Popen[bytes]
    port: int
    log: Any = None  # gpufair's own log (its RPC lines), None for the trivial servers


def record_exit(results: dict[str, Any], name: str, process: subprocess.Popen[bytes]) -> None:
    results[f"{name}_exit_code"] = stop(process)


def measure(target: Target, body: Path, args: argparse.Namespace) -> dict[str, Any]:
    since = target.log.seek(0, os.SEEK_END) if target.log is not None else 0
    figures = h2load(
        target.port, body, args.seconds, args.connections, args.streams, target.process.pid
    )
    if target.log is not None:
        target.log.flush()
        figures.update(handler_times(target.log, since))
    return figures


def ratios(figures: dict[str, Any]) -> dict[str, float]:
    g = figures["gpufair"]["per_s"]
    out = {
        "ratio_to_trivial_1_process": round(g / figures["trivial_1_process"]["per_s"], 2),
        "ratio_to_trivial_n_processes": round(g / figures["trivial_n_processes"]["per_s"], 2),
    }
    if "gpufair_baseline" in figures:
        out["ratio_to_baseline"] = round(g / figures["gpufair_baseline"]["per_s"], 2)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--streams", type=int, default=1, help="concurrent streams per connection")
    parser.add_argument(
        "--baseline",
        type=Path,
        default=None,
        help="also run gpufair from this checkout's service/ (the code before), same run",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="drive every target once per round, in an order rotated each round",
    )
    args = parser.parse_args()
    if shutil.which("h2load") is None:
        print("h2load not found: install nghttp2 (Debian: nghttp2-client)", file=sys.stderr)
        return 2
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUFAIR_")}
    results: dict[str, Any] = {
        "streams": args.connections * args.streams,
        "connections": args.connections,
        "processes": args.processes,
        "cores": os.cpu_count(),
        "load_average_before": round(os.getloadavg()[0], 2),
    }
    with (
        test_server() as server,
        tempfile.TemporaryDirectory() as tmp,
        contextlib.ExitStack() as stack,
    ):
        reply_file, body = Path(tmp) / "reply.bin", Path(tmp) / "request.bin"
        request = ledger_pb2.GetFairShareRequest(pool="main").SerializeToString()
        body.write_bytes(struct.pack(">BI", 0, len(request)) + request)
        kinds = [("gpufair", env)]
        if args.baseline is not None:
            path = str((args.baseline / "service").resolve())
            kinds.append(("gpufair_baseline", {**env, "PYTHONPATH": path}))
        targets: list[Target] = []
        for name, target_env in kinds:
            url = stack.enter_context(scratch_database(server.url, prefix="gpufair_bench"))
            log = stack.enter_context(tempfile.TemporaryFile())
            process, port, reply = start_gpufair(url, target_env, args, log)
            stack.callback(record_exit, results, name, process)
            targets.append(Target(name, process, port, log))
            if name == "gpufair":
                reply_file.write_bytes(reply)
                results["reply_bytes"] = len(reply)
        quiet = stack.enter_context(tempfile.TemporaryFile())
        for name, processes in (("trivial_1_process", 1), ("trivial_n_processes", args.processes)):
            port = free_port()
            trivial = start(
                [
                    *(sys.executable, str(HERE / "trivial_server.py")),
                    *("--address", f"127.0.0.1:{port}", "--reply", str(reply_file)),
                    *("--processes", str(processes)),
                ],
                quiet,
            )
            stack.callback(stop, trivial)
            wait_listening(port, processes)
            targets.append(Target(name, trivial, port))
        time.sleep(1.0)
        rounds: list[dict[str, Any]] = []
        for round_number in range(args.rounds):
            shift = round_number % len(targets)
            order = targets[shift:] + targets[:shift]
            figures = {target.name: measure(target, body, args) for target in order}
            rounds.append({"order": [t.name for t in order], **figures, **ratios(figures)})
    results["load_average_after"] = round(os.getloadavg()[0], 2)
    if args.rounds == 1:
        del rounds[0]["order"]
        results.update(rounds[0])
    else:
        results["rounds"] = rounds
        for key in rounds[0]:
            if key.startswith("ratio_"):
                results[f"median_{key}"] = statistics.median(float(r[key]) for r in rounds)
    print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
