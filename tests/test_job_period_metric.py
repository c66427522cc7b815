"""`gpufair_periodic_job_period_seconds` as a real `gpufair serve` exports it on its metrics
endpoint: the replica that runs the periodic jobs says every job's period (a sweep period given
on its command line included); a replica started with `--no-jobs` says only the pools' recompute
intervals, which are configured in the database, and leaves the others to the replicas that run
them (the alert takes the max over replicas)."""

from __future__ import annotations

import os
import urllib.request
from pathlib import Path

from outage_support import wait_for
from serve_support import ServeProcess, free_port

from gpufair.client import GpufairClient
from gpufair.config_file import load_config_file
from gpufair.store.database import Database
from gpufair.store.scratch import scratch_database

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "clusters" / "llm-vs-vision.yaml"
NAME = "gpufair_periodic_job_period_seconds"


def _periods(port: int) -> list[str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
            text = reply.read().decode()
    except OSError:  # not listening yet
        return []
    return sorted(line for line in text.splitlines() if line.startswith(NAME + "{"))


def test_a_served_replica_exports_each_job_period(pg_server: Database, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "GPUFAIR_DATABASE_URL"}
    with scratch_database(pg_server.url) as url:
        common = ["--database-url", url, "--grace-s", "1", "--processes", "1"]
        ports = [free_port(), free_port()]
        jobs_args = ["--job-tick-s", "0.5", "--sweep-period-s", "45"]
        jobs_args += ["--metrics-address", f"127.0.0.1:{ports[0]}"]
        jobs = ServeProcess([*common, *jobs_args], env, tmp_path / "jobs.log")
        no_jobs: ServeProcess | None = None
        try:
            jobs.wait_serving()
            no_jobs = ServeProcess(
                [*common, "--no-jobs", "--metrics-address", f"127.0.0.1:{ports[1]}"],
                env,
                tmp_path / "no-jobs.log",
            )
            no_jobs.wait_serving()
            config = load_config_file(EXAMPLE)
            config.pools[0].policy.recompute_interval_s = 21600
            with GpufairClient(jobs.address, attempts=1, timeout_s=30) as client:
                client.apply_config(config)
            expected = [
                f'{NAME}{{periodic_job="recompute:default"}} 21600.0',
                f'{NAME}{{periodic_job="retention"}} 86400.0',
                f'{NAME}{{periodic_job="rollup"}} 3600.0',
                f'{NAME}{{periodic_job="sweep"}} 45.0',
            ]
            for port, exported in ((ports[0], expected), (ports[1], expected[:1])):
                try:
                    wait_for(lambda p=port, e=exported: _periods(p) == e, 60, f"{exported}")
                except AssertionError as exc:
                    raise AssertionError(f"{exc}; found {_periods(port)}") from None
        finally:
            for serve in (no_jobs, jobs):
                if serve is not None and serve.proc.poll() is None:
                    assert serve.terminate() == 0
