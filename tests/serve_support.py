"""`gpufair serve` as a child process, for tests of restarts, signals and several replicas."""

from __future__ import annotations

import contextlib
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

# Ports are picked below the kernel's range of ephemeral ports (Linux: 32768 and up), so that no
# outgoing connection of a test running beside this one (a client's socket to PostgreSQL, say)
# takes the port between the pick and the server's bind. A CI run failed so: the metrics port
# of a group's second worker (the first's + 1) was already some connection's.
_PICKED = range(20000, 32768)


def free_port(count: int = 1) -> int:
    """A port P such that P, P + 1, ..., P + count - 1 are all free now (`gpufair serve
    --processes N` serves metrics on the given port and the N - 1 after it)."""
    picker = random.Random()
    for _ in range(500):
        first = picker.randrange(_PICKED.start, _PICKED.stop - count)
        with contextlib.ExitStack() as held:
            try:
                for port in range(first, first + count):
                    held.enter_context(socket.socket()).bind(("127.0.0.1", port))
            except OSError:
                continue
        return first
    raise RuntimeError(f"no {count} free consecutive ports in {_PICKED}")


class ServeProcess:
    def __init__(self, args: list[str], env: dict[str, str], log: Path) -> None:
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.log = log
        with log.open("ab") as out:
            self.proc = subprocess.Popen(
                [
                    *(sys.executable, "-m", "gpufair.cli", "serve"),
                    *("--address", self.address, "--metrics-address", ""),
                    *args,
                ],
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    def wait_serving(self, timeout_s: float = 60) -> None:
        deadline = time.monotonic() + timeout_s
        with grpc.insecure_channel(self.address) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    raise AssertionError(f"server exited early:\n{self.log.read_text()}")
                try:
                    reply = stub.Check(health_pb2.HealthCheckRequest(), timeout=1)
                    if reply.status == health_pb2.HealthCheckResponse.SERVING:
                        return
                except grpc.RpcError:
                    time.sleep(0.2)
        raise AssertionError(f"server not serving after {timeout_s} s:\n{self.log.read_text()}")

    def terminate(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=60)
