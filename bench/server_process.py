"""What the benchmarks that run `gpufair serve` as a process of its own share: a free port,
waiting until it serves, and the CPU time of a process (with its workers) and of PostgreSQL's
backends."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import time
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from sqlalchemy import create_engine, text

from gpufair.store.database import normalise_url

TICKS_PER_S = os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS_PER_S  # utime + stime


def tree(pid: int) -> list[int]:
    """`pid` and its descendants (`gpufair serve --processes N` is a parent and N workers)."""
    pids = [pid]
    with contextlib.suppress(FileNotFoundError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(FileNotFoundError):
                for child in (task / "children").read_text().split():
                    pids += tree(int(child))
    return pids


def tree_cpu_s(pid: int) -> float:
    """CPU time so far of `pid` and its descendants alive now."""
    total = 0.0
    for p in tree(pid):
        with contextlib.suppress(FileNotFoundError):
            total += cpu_seconds(p)
    return total


def wait_serving(address: str, proc: subprocess.Popen[bytes]) -> None:
    """Return once the server at `address` reports SERVING; fail if it exits or takes a minute."""
    with grpc.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        for _ in range(600):
            if proc.poll() is not None:
                raise RuntimeError("gpufair serve exited during start-up")
            try:
                status = stub.Check(health_pb2.HealthCheckRequest(), timeout=1).status
            except grpc.RpcError:
                status = None  # not listening yet
            if status == health_pb2.HealthCheckResponse.SERVING:
                return
            time.sleep(0.1)
    raise RuntimeError("gpufair serve is not serving")


def backend_cpu_s(url: str) -> dict[int, float] | None:
    """CPU time so far of each PostgreSQL backend serving `url`'s database, when they run on
    this machine (their /proc entries are readable); None otherwise."""
    engine = create_engine(normalise_url(url))
    try:
        with engine.connect() as conn:
            pids = conn.execute(
                text(
                    "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                    "AND pid <> pg_backend_pid()"
                )
            ).scalars()
            return {pid: cpu_seconds(pid) for pid in pids}
    except OSError:
        return None
    finally:
        engine.dispose()


def backends_used(before: dict[int, float] | None, after: dict[int, float] | None) -> float | None:
    """CPU the backends alive at the end used in between: a lower bound, as backends that ended
    meanwhile are not counted."""
    if before is None or after is None:
        return None
    return sum(cpu - before.get(pid, 0.0) for pid, cpu in after.items())
