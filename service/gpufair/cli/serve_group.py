"""`gpufair serve --processes N`: N server processes on one port, one per core.

A Python process serves on one core at a time, so the group is what uses a machine's cores. The
first process (the group's parent) resolves the database (starting the embedded one if need be),
migrates it, and starts N workers, each a `gpufair serve --processes 1` of its own with its own
connections and its own read caches, all listening on the same port with SO_REUSEPORT: the
kernel spreads connections over them. A port of 0 is chosen once by the parent, which keeps it
bound (not listening) for the group's life.

- Periodic jobs run in worker 0 only (and they are claimed once per period across replicas
  anyway, `jobs/runner.py`).
- Metrics: one endpoint per worker, on the metrics port plus the worker's index (9464, 9465, ...
  by default; with a port of 0 each worker picks one and logs it). Each endpoint exports what its
  worker did (RPCs, ingestion, decisions); the state gauges read from the database are exported by
  worker 0 alone, so a sum over the group's targets counts the cluster once.
- A worker reads another worker's commits as it reads another replica's: within the read caches'
  staleness bound (`api/read_cache.py`); a connection stays with one worker, so a client on one
  channel reads its own writes at once.
- SIGTERM (or SIGINT) to the parent is passed to every worker, each stops gracefully
  (`--grace-s`), and the parent exits 0 once all have. A worker that exits on its own takes the
  group down (the others are stopped, the parent exits 1), so the supervisor restarts the whole
  service rather than run it short of a worker or of the one running the jobs. A parent killed
  outright (SIGKILL) takes its workers with it at once, as a crash of the service would
  (`die_with_parent`); where the kernel cannot do that, a worker sees within a second that its
  parent is gone and stops as on SIGTERM.
"""

from __future__ import annotations

import argparse
import ctypes
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path
from types import FrameType

log = logging.getLogger(__name__)

# Set in a worker's environment: its index in the group, and the parent's pid.
WORKER_INDEX_ENV = "GPUFAIR_SERVE_WORKER_INDEX"
PARENT_ENV = "GPUFAIR_SERVE_PARENT"
_PR_SET_PDEATHSIG = 1
# How long past its grace period a stopping worker is waited for before it is killed.
STOP_MARGIN_S = 10.0


def worker_index() -> int | None:
    """This process's index in a group (tied to its parent's life from here on); None when it
    is not a worker of one."""
    value = os.environ.get(WORKER_INDEX_ENV)
    if value is None:
        return None
    die_with_parent(int(os.environ.get(PARENT_ENV, os.getppid())))
    return int(value)


def die_with_parent(parent: int) -> None:
    """Have the kernel kill this worker when its parent dies (Linux's PR_SET_PDEATHSIG); and if
    the parent is already gone, go now. Elsewhere, `gpufair serve` watches its parent instead."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
            log.warning("cannot tie this worker to its parent (errno %d)", ctypes.get_errno())
    if os.getppid() != parent:
        os.kill(os.getpid(), signal.SIGKILL)


def _reserve_port(address: str) -> tuple[str, socket.socket | None]:
    """The address with a concrete port; for port 0, a socket holding the chosen port."""
    host, _, port = address.rpartition(":")
    if int(port) != 0:
        return address, None
    bare = host.strip("[]")
    family = socket.AF_INET6 if ":" in bare else socket.AF_INET
    holder = socket.socket(family, socket.SOCK_STREAM)
    holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    holder.bind((bare or "0.0.0.0", 0))
    return f"{host}:{holder.getsockname()[1]}", holder


def _metrics_address(address: str, index: int) -> str:
    if not address:
        return ""
    host, _, port = address.rpartition(":")
    return f"{host}:{int(port) + index if int(port) else 0}"


def run_group(args: argparse.Namespace, argv: list[str]) -> int:
    """Serve with `args.processes` workers until SIGTERM; `argv` is the command line, which each
    worker is given again with its own settings after it (the last value of an option wins)."""
    from gpufair.store import database, migrate

    db = database.resolve(args.database_url, Path(args.data_dir) if args.data_dir else None)
    holder = None
    workers: list[subprocess.Popen[bytes]] = []
    try:
        log.info("database: %s", db.describe())
        migrate.upgrade(db.url)
        log.info("schema at revision %s", migrate.current_revision(db.url))
        address, holder = _reserve_port(args.address)
        env = {**os.environ, database.DATABASE_URL_ENV: db.url}
        for index in range(args.processes):
            extra = [
                *("--processes", "1", "--address", address),
                *("--metrics-address", _metrics_address(args.metrics_address, index)),
                *(("--no-jobs",) if index else ()),
            ]
            workers.append(
                subprocess.Popen(
                    [sys.executable, "-m", "gpufair.cli", *argv, *extra],
                    env={**env, WORKER_INDEX_ENV: str(index), PARENT_ENV: str(os.getpid())},
                )
            )
        log.info(
            "gpufair serving gRPC on %s with %d processes (pids %s)",
            address,
            len(workers),
            ", ".join(str(w.pid) for w in workers),
        )
        code = _wait(workers)
        log.info("stopping %d workers", len(workers))
        _stop(workers, args.grace_s)
        # A worker still starting when the signal came has no handler yet and ends by it: it had
        # served nothing, so that is a clean stop too.
        failed = [w.pid for w in workers if w.returncode not in (0, -signal.SIGTERM)]
        if failed:
            log.warning("workers %s did not exit cleanly", failed)
            code = 1
        log.info("stopped")
        return code
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.kill()
                worker.wait()
        if holder is not None:
            holder.close()
        db.close()


def _wait(workers: list[subprocess.Popen[bytes]]) -> int:
    """Until a signal (0) or a worker's own exit (1)."""
    stop = threading.Event()

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        log.info("received %s", signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    while not stop.wait(timeout=1.0):
        exited = [w for w in workers if w.poll() is not None]
        if exited:
            log.error(
                "worker %d exited with %d: stopping the group", exited[0].pid, exited[0].returncode
            )
            return 1
    return 0


def _stop(workers: list[subprocess.Popen[bytes]], grace_s: float) -> None:
    for worker in workers:
        if worker.poll() is None:
            worker.send_signal(signal.SIGTERM)
    for worker in workers:
        try:
            worker.wait(timeout=grace_s + STOP_MARGIN_S)
        except subprocess.TimeoutExpired:
            log.warning("worker %d still running after the grace period: killed", worker.pid)
            worker.kill()
            worker.wait()
