"""`gpufair serve --processes 2`: two workers on one port, the connections spread over them, one
metrics endpoint each (the state gauges on worker 0's alone), and SIGTERM stops the whole group."""

from __future__ import annotations

import os
import re
import signal
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from serve_support import ServeProcess, free_port

from gpufair.api.read_cache import DEFAULT_STALENESS_S
from gpufair.client import GpufairClient
from gpufair.store.database import Database
from gpufair.store.scratch import scratch_database
from gpufair.v1 import cluster_pb2


def cluster(gpus: int) -> cluster_pb2.ClusterConfig:
    config = cluster_pb2.ClusterConfig()
    config.gpu_types.add(name="a100", memory_gib=80, compute_weight=10.0)
    config.pools.add(name="default")
    config.nodes.add(name="n1", pool="default", gpu_type="a100", gpu_count=gpus)
    config.queues.add(name="alpha").quotas.add(pool="default", deserved_cu=20)
    return config


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
        return str(reply.read().decode())


def scrape_if_up(port: int) -> str:
    """`scrape`, or nothing while the worker's endpoint is not listening yet."""
    try:
        return scrape(port)
    except OSError:
        return ""


def rpcs(text: str) -> float:
    return sum(
        float(m.group(1))
        for m in re.finditer(
            r'^gpufair_rpcs_total\{[^}]*method="[^"]*GetConfig"[^}]*\} (\S+)$', text, re.M
        )
    )


@pytest.fixture
def database_url(pg_server: Database) -> Iterator[str]:
    with scratch_database(pg_server.url) as url:
        yield url


def test_two_processes_share_the_port_and_stop_together(database_url: str, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUFAIR_")}
    metrics = free_port(2)
    log = tmp_path / "serve.log"
    group = ServeProcess(
        [
            *("--database-url", database_url, "--processes", "2", "--grace-s", "1"),
            *("--metrics-address", f"127.0.0.1:{metrics}"),
        ],
        env,
        log,
    )
    try:
        group.wait_serving()
        with GpufairClient(group.address, attempts=1) as writer:
            assert writer.apply_config(cluster(8)).config_version == 1
            writer.get_fair_share("default")
        time.sleep(DEFAULT_STALENESS_S)
        # Each channel is one connection, which the kernel gives to one worker: whichever it
        # is, it reads what the other committed. The workers start on their own, so on a busy
        # machine the second may bind the port after the first answered: reads go on, 20 at a
        # time, until both have answered some (or 200 were made). While the second comes up,
        # a connection can be refused although the first already answered (a CI run's failure:
        # UNAVAILABLE, connection refused, on a reader's first call); a refused call reached no
        # worker, so the readers retry it, as a client of a starting service does, and the
        # RPC counts below stay exact.
        reads = 0
        while reads < 200:
            for _ in range(20):
                with GpufairClient(group.address, attempts=3) as reader:
                    reply = reader.get_config()
                    assert reply.config_version == 1
                    assert [n.gpu_count for n in reply.config.nodes] == [8]
            reads += 20
            if all(rpcs(scrape_if_up(port)) > 0 for port in (metrics, metrics + 1)):
                break

        # The state gauges are read at most every 2 s (api/state_metrics.py): the first read
        # may predate the recompute.
        deadline = time.monotonic() + 20
        while True:
            first, second = scrape(metrics), scrape(metrics + 1)
            if "gpufair_fair_share_cu{" in first or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert rpcs(first) > 0 and rpcs(second) > 0, (rpcs(first), rpcs(second))
        assert rpcs(first) + rpcs(second) == reads
        assert 'gpufair_fair_share_cu{pool="default",queue="alpha"}' in first, [
            line for line in first.splitlines() if line.startswith("gpufair_")
        ]
        assert "gpufair_fair_share_cu{" not in second
    finally:
        code = group.terminate()
    text = log.read_text()
    assert code == 0, text
    started = re.search(r"with 2 processes \(pids (\d+), (\d+)\)", text)
    assert started is not None, text
    pids = [int(p) for p in started.groups()]
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    # The parent speaks for the group; its workers say their start and stop at DEBUG.
    assert text.count("received SIGTERM") == 1
    assert "stopping 2 workers" in text and text.rstrip().endswith("stopped")
    assert "WARNING" not in text


def test_workers_stop_when_the_parent_is_killed(database_url: str, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUFAIR_")}
    log = tmp_path / "serve.log"
    group = ServeProcess(
        ["--database-url", database_url, "--processes", "2", "--grace-s", "1", "--no-jobs"],
        env,
        log,
    )
    try:
        group.wait_serving()
        started = None
        deadline = time.monotonic() + 30
        while started is None and time.monotonic() < deadline:
            started = re.search(r"with 2 processes \(pids (\d+), (\d+)\)", log.read_text())
            time.sleep(0.1)
        assert started is not None, log.read_text()
        pids = [int(p) for p in started.groups()]
    finally:
        group.proc.send_signal(signal.SIGKILL)
        group.proc.wait(timeout=30)
    deadline = time.monotonic() + 30
    alive = pids
    while alive and time.monotonic() < deadline:
        time.sleep(0.2)
        alive = [pid for pid in pids if _running(pid)]
    assert alive == [], log.read_text()


def _running(pid: int) -> bool:
    """Whether `pid` runs (an orphan reaped by init, or a zombie, is not running)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"
