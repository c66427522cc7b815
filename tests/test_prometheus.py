"""Against the real thing: a real Prometheus scrapes a real `gpufair serve` while work is driven
through the API, and every expression of the Grafana dashboard and of the alert rules returns
data through Prometheus's HTTP API.

The dashboard's expressions must return at least one finite number (the work is driven in two
rounds, so every counter and histogram has grown between two scrapes and its rate is not 0/0).
Each alert's expression returns data once its condition is made true: ledger events that arrive
2.5 hours late (stale ingest), a budget that usage already overran, a periodic job whose latest
run is recorded as failed, a database that refuses connections, and finally a stopped gpufair.

Needs the `prometheus` and `promtool` commands (Debian package `prometheus`). Without them the
test is skipped, unless GPUFAIR_REQUIRE_PROMETHEUS=1 (set by CI) makes that a failure.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml
from google.protobuf.timestamp_pb2 import Timestamp
from grpc_health.v1 import health_pb2, health_pb2_grpc
from outage_support import database_unreachable, wait_for
from serve_support import ServeProcess, free_port
from sqlalchemy import create_engine, text

from gpufair.client import GpufairClient
from gpufair.config_file import load_config_file
from gpufair.store.database import Database, normalise_url
from gpufair.store.scratch import scratch_database
from gpufair.v1 import cluster_pb2, ledger_pb2, scheduler_pb2

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
DASHBOARD = DEPLOY / "grafana" / "dashboards" / "gpufair.json"
ALERTS = DEPLOY / "prometheus" / "alerts.yml"
EXAMPLE = ROOT / "examples" / "clusters" / "llm-vs-vision.yaml"
REQUIRE_ENV = "GPUFAIR_REQUIRE_PROMETHEUS"


def prometheus_tools() -> tuple[str, str]:
    """(prometheus, promtool): skipped where not installed, failed when CI requires them."""
    prometheus, promtool = shutil.which("prometheus"), shutil.which("promtool")
    if prometheus and promtool:
        return prometheus, promtool
    if os.environ.get(REQUIRE_ENV) == "1":
        pytest.fail(f"prometheus and promtool are required ({REQUIRE_ENV}=1) but not installed")
    pytest.skip("prometheus/promtool not installed (Debian package `prometheus`)")


def dashboard_expressions() -> list[str]:
    panels = json.loads(DASHBOARD.read_text())["panels"]
    return [t["expr"] for p in panels for t in p.get("targets", [])]


def alert_expressions() -> dict[str, str]:
    groups = yaml.safe_load(ALERTS.read_text())["groups"]
    return {r["alert"]: r["expr"] for g in groups for r in g["rules"]}


class Prometheus:
    """A Prometheus server of the test's own, on a free loopback port, stopped by its pid."""

    def __init__(self, binary: str, folder: Path, metrics_ports: list[int]) -> None:
        config = {
            # A scrape reads the database: on a busy machine it may take more than a second.
            "global": {
                "scrape_interval": "2s",
                "scrape_timeout": "2s",
                "evaluation_interval": "2s",
            },
            "rule_files": [str(ALERTS)],
            "scrape_configs": [
                {
                    "job_name": "gpufair",
                    "static_configs": [
                        {"targets": [f"127.0.0.1:{port}" for port in metrics_ports]}
                    ],
                }
            ],
        }
        (folder / "prometheus.yml").write_text(yaml.safe_dump(config))
        self.port = free_port()
        self.log = folder / "prometheus.log"
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                [
                    binary,
                    f"--config.file={folder / 'prometheus.yml'}",
                    f"--storage.tsdb.path={folder / 'data'}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    def get(self, path: str, **params: str) -> Any:
        url = f"http://127.0.0.1:{self.port}{path}"
        if params:
            url += "?" + urllib.parse.urlencode(params)
        with urllib.request.urlopen(url, timeout=10) as reply:
            return json.loads(reply.read())

    def wait_ready(self, timeout_s: float = 60) -> None:
        def ready() -> bool:
            if self.proc.poll() is not None:
                raise AssertionError(f"prometheus exited:\n{self.log.read_text()}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/-/ready", timeout=2):
                    return True
            except OSError:
                return False

        wait_for(ready, timeout_s, "prometheus ready")

    def query(self, expr: str) -> list[dict[str, Any]]:
        reply = self.get("/api/v1/query", query=expr)
        assert reply["status"] == "success", (expr, reply)
        result: list[dict[str, Any]] = reply["data"]["result"]
        return result

    def wait_scraped_after(self, moment: float, timeout_s: float = 60) -> None:
        """Until every target has been scraped, successfully, by a scrape begun after `moment`
        (a sample's timestamp is its scrape's start, or the start it was due at when it began
        up to 2 ms late: never later than the start).

        `timestamp()` reads the samples' own timestamps only of a series selector given to it
        directly: of any other expression (`timestamp(up == 1)`, as this read before) it gives
        the query's evaluation time, which is always after `moment`, so the wait ended at once
        and the second round could come before any scrape of the first."""

        def scraped() -> bool:
            up = {_target(s): float(s["value"][1]) for s in self.query("up")}
            stamps = {_target(s): float(s["value"][1]) for s in self.query("timestamp(up)")}
            return (
                bool(up)
                and set(stamps) == set(up)
                and all(v == 1 for v in up.values())
                and min(stamps.values()) > moment
            )

        wait_for(scraped, timeout_s, f"a scrape of every target after {moment}")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)


def _target(sample: dict[str, Any]) -> tuple[str, str]:
    return sample["metric"]["job"], sample["metric"]["instance"]


def _finite(result: list[dict[str, Any]]) -> bool:
    return any(math.isfinite(float(sample["value"][1])) for sample in result)


def _period_with_a_whole_hour() -> cluster_pb2.BudgetPeriod.ValueType:
    """A budget period whose current period began over an hour ago and ends over an hour from
    now: budgets count whole hours, so the late-reported usage of this test is counted in it,
    and the period is still the one the checks read minutes later (before, the week was taken
    unless it was Monday 00:00-01:00 UTC: a test that ran on past a Sunday's midnight read a new
    week, without that usage). The week, else the month, else the day; within an hour of the
    midnight that begins a Monday the 1st none is, and the week is taken."""
    now = datetime.now(UTC)
    hour = now.replace(minute=0, second=0, microsecond=0)
    day = hour.replace(hour=0)
    month = day.replace(day=1)
    next_month = (month + timedelta(days=32)).replace(day=1)
    week = day - timedelta(days=day.weekday())
    periods = (
        (cluster_pb2.BUDGET_PERIOD_WEEK, week, week + timedelta(days=7)),
        (cluster_pb2.BUDGET_PERIOD_MONTH, month, next_month),
        (cluster_pb2.BUDGET_PERIOD_DAY, day, day + timedelta(days=1)),
    )
    for period, start, end in periods:
        if start <= hour - timedelta(hours=1) and end >= now + timedelta(hours=1):
            return period
    return cluster_pb2.BUDGET_PERIOD_WEEK


def _instant(ts: float) -> Timestamp:
    stamp = Timestamp()
    stamp.FromNanoseconds(int(ts * 1e9))
    return stamp


def _drive_round(client: GpufairClient, n: int, now: float) -> scheduler_pb2.ScheduleResponse:
    """One round of work: two LLM workloads (one 4-GPU pod, one 8-pod gang) and, in the second
    round, one too big for what is free (80 GPUs); a vision run reported 2.5 hours late; a refused call; a
    Schedule. Every round grows the same counter and histogram series."""
    workloads = [
        scheduler_pb2.Workload(
            uid=f"llm-a{n}", queue="llm", pool="default", pods=1, gpus_per_pod=4
        ),
        scheduler_pb2.Workload(
            uid=f"llm-g{n}", queue="llm", pool="default", pods=8, gpus_per_pod=1
        ),
        scheduler_pb2.Workload(
            uid=f"vision-{n}", queue="vision", pool="default", pods=2, gpus_per_pod=4
        ),
    ]
    if n == 2:
        workloads.append(
            scheduler_pb2.Workload(
                uid="llm-big", queue="llm", pool="default", pods=20, gpus_per_pod=4
            )
        )
    client.submit_workloads(workloads)
    late = now - 2.5 * 3600
    node = 20 + n  # nodes gpu-21, gpu-22: away from what Schedule binds first (binpack)
    event = ledger_pb2.LedgerEvent(
        event_id=str(uuid.uuid4()),
        workload_uid=f"vision-{n}",
        kind=ledger_pb2.EVENT_KIND_STARTED,
        occurred_at=_instant(late),
    )
    for name in (f"gpu-{node:02d}", f"gpu-{node + 2:02d}"):
        event.pods.add(node=name, gpu_indices=[0, 1, 2, 3], gpu_fraction=1)
    results = client.report_events([event]).results
    assert [r.status for r in results] == [ledger_pb2.EVENT_STATUS_STORED]
    with pytest.raises(grpc.RpcError) as refused:
        client.schedule("")  # no pool: INVALID_ARGUMENT, counted as an error
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    return client.schedule("default")


@pytest.fixture
def stack(pg_server: Database, tmp_path: Path) -> Iterator[tuple[ServeProcess, Prometheus, str]]:
    prometheus_binary, _ = prometheus_tools()
    env = {k: v for k, v in os.environ.items() if k != "GPUFAIR_DATABASE_URL"}
    with scratch_database(pg_server.url) as url:
        metrics_port = free_port()
        args = ["--database-url", url, "--grace-s", "1", "--job-tick-s", "0.5"]
        args += ["--health-interval-s", "0.5", "--log-format", "json"]
        args += ["--metrics-address", f"127.0.0.1:{metrics_port}"]
        # One process: its one endpoint has every series (a group has one per worker).
        args += ["--processes", "1"]
        # The vision runs the test reports started 2.5 hours ago and send no heartbeat. With
        # the default 600 s the sweeper (once a minute, on the minute) closed them at their
        # start whenever a minute began during the test: their usage became 0 (the budget's
        # consumed read 0, and its alert never held), and their nodes free, so that round two
        # bound llm-big (20 nodes, tried before llm-g2: same submit time, uid order).
        args += ["--stale-after-s", str(24 * 3600)]
        serve = ServeProcess(args, env, tmp_path / "serve.log")
        prometheus = Prometheus(prometheus_binary, tmp_path, [metrics_port])
        try:
            serve.wait_serving()
            prometheus.wait_ready()
            yield serve, prometheus, url
        finally:
            prometheus.stop()
            if serve.proc.poll() is None:
                serve.terminate()


def test_promtool_accepts_the_rules_and_the_config() -> None:
    _, promtool = prometheus_tools()
    for command in (
        [promtool, "check", "rules", str(ALERTS)],
        [promtool, "check", "config", str(DEPLOY / "prometheus" / "prometheus.yml")],
    ):
        checked = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
        assert checked.returncode == 0, checked.stdout + checked.stderr


def test_every_dashboard_and_alert_expression_returns_data(
    stack: tuple[ServeProcess, Prometheus, str],
) -> None:
    serve, prometheus, url = stack
    config = load_config_file(EXAMPLE)
    config.pools[0].policy.recompute_interval_s = 1
    vision_budget = next(b for b in config.budgets if b.queue == "vision")
    vision_budget.period, vision_budget.cu_hours = _period_with_a_whole_hour(), 10.0
    with GpufairClient(serve.address, attempts=1, timeout_s=30) as client:
        client.apply_config(config)
        first = _drive_round(client, 1, time.time())
        assert {b.uid for b in first.binds} == {"llm-a1", "llm-g1"}
        # A whole scrape between the rounds, so that every series of the first has a sample
        # before the second grows it (a fixed sleep missed it on a busy machine: the
        # histograms' first samples held both rounds, and their rates were 0/0).
        prometheus.wait_scraped_after(time.time())
        second = _drive_round(client, 2, time.time())
        assert {b.uid for b in second.binds} == {"llm-a2", "llm-g2"}
        assert [p.uid for p in second.pending] == ["llm-big"]

    # Every rule is loaded and evaluates without error.
    rules = [r for g in prometheus.get("/api/v1/rules")["data"]["groups"] for r in g["rules"]]
    assert {r["name"] for r in rules} == set(alert_expressions())

    def returns_finite(expr: str) -> bool:
        return _finite(prometheus.query(expr))

    def scrapes() -> str:
        targets = prometheus.get("/api/v1/targets")["data"]["activeTargets"]
        return "; ".join(
            f"{t['health']} {t['lastError']} {t['lastScrapeDuration']}" for t in targets
        )

    for expr in dashboard_expressions():
        # A wide window: the increments of the two rounds stay in it while the checks run.
        concrete = expr.replace("$__rate_interval", "10m")
        try:
            wait_for(lambda q=concrete: returns_finite(q), 60, f"dashboard query {concrete!r}")
        except AssertionError as exc:
            found = prometheus.query(concrete)
            raise AssertionError(f"{exc}; found {found}; scrapes: {scrapes()}") from None

    alerts = alert_expressions()
    wait_for(lambda: returns_finite(alerts["GpufairIngestStale"]), 60, "GpufairIngestStale")
    budget = alerts["GpufairBudgetProjectedExhaustion"]
    try:
        wait_for(lambda: returns_finite(budget), 120, "GpufairBudgetProjectedExhaustion")
    except AssertionError as exc:
        # It failed once in CI (every dashboard query had data): say what the budget series
        # and the jobs' last successes were then, so such a failure tells its cause.
        seen = {
            name: prometheus.query(name)
            for name in (
                "gpufair_budget_consumed_cu_hours",
                "gpufair_budget_burn_cu_hours_per_day",
                "gpufair_budget_projected_exhaustion_timestamp_seconds",
                "gpufair_budget_period_end_timestamp_seconds",
                "gpufair_periodic_job_last_success_timestamp_seconds",
            )
        }
        raise AssertionError(f"{exc}; at {time.time():.0f}: {seen}; scrapes: {scrapes()}") from None

    # A failed run, as the job runner records one (its claim's outcome).
    engine = create_engine(normalise_url(url))
    try:
        with engine.begin() as conn:
            conn.execute(
                text(
                    "UPDATE job_claims SET outcome = 'failed: RuntimeError: disk full' "
                    "WHERE job = 'retention' AND finished_at IS NOT NULL"
                )
            )
    finally:
        engine.dispose()
    failing = alerts["GpufairPeriodicJobFailing"]
    wait_for(lambda: returns_finite(failing), 60, "GpufairPeriodicJobFailing")
    assert {r["metric"]["periodic_job"] for r in prometheus.query(failing)} == {"retention"}

    health = health_pb2.HealthCheckRequest()
    with grpc.insecure_channel(serve.address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        with database_unreachable(url):
            down = alerts["GpufairDatabaseDown"]
            wait_for(lambda: returns_finite(down), 60, "GpufairDatabaseDown")
            status = stub.Check(health, timeout=5).status
            assert status == health_pb2.HealthCheckResponse.NOT_SERVING
        wait_for(
            lambda: stub.Check(health, timeout=5).status == health_pb2.HealthCheckResponse.SERVING,
            30,
            "SERVING after the outage",
        )
    wait_for(lambda: returns_finite("gpufair_database_up == 1"), 60, "database up again")

    assert serve.terminate() == 0
    wait_for(lambda: returns_finite(alerts["GpufairDown"]), 60, "GpufairDown")

    # The JSON log: one object per line, an RPC's line with its method, pool and duration.
    lines = [json.loads(line) for line in serve.log.read_text().splitlines() if line.strip()]
    schedules = [e for e in lines if e.get("method") == "Schedule" and e.get("code") == "OK"]
    assert len(schedules) == 2
    assert all(e["pool"] == "default" and e["request_id"] for e in schedules)
    assert all(0 < e["duration_s"] < 30 for e in schedules)
    start = [e for e in lines if e["level"] == "warning" and e["time"] < schedules[0]["time"]]
    assert start == []  # a normal start warns of nothing


def _get_config_calls(text: str) -> float:
    """The GetConfig RPCs one worker's endpoint has counted."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith("gpufair_rpcs_total{") and 'GetConfig"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


def _scrape(port: int) -> str:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
            return str(reply.read().decode())
    except OSError:  # the worker's endpoint is not listening yet
        return ""


def test_a_process_group_is_scraped_per_worker_and_counts_the_cluster_once(
    pg_server: Database, tmp_path: Path
) -> None:
    """`gpufair serve --processes 2` as the compose stack runs it: Prometheus scrapes both
    workers' endpoints; the dashboard's sums over the targets count every RPC exactly once, and
    the state gauges (worker 0 alone exports them) give one series per queue."""
    prometheus_binary, _ = prometheus_tools()
    env = {k: v for k, v in os.environ.items() if k != "GPUFAIR_DATABASE_URL"}
    with scratch_database(pg_server.url) as url:
        metrics = free_port(2)
        args = ["--database-url", url, "--grace-s", "1", "--job-tick-s", "0.5"]
        args += ["--metrics-address", f"127.0.0.1:{metrics}", "--processes", "2"]
        serve = ServeProcess(args, env, tmp_path / "serve.log")
        prometheus = Prometheus(prometheus_binary, tmp_path, [metrics, metrics + 1])
        try:
            serve.wait_serving()
            prometheus.wait_ready()
            config = load_config_file(EXAMPLE)
            config.pools[0].policy.recompute_interval_s = 1
            with GpufairClient(serve.address, attempts=1, timeout_s=30) as writer:
                writer.apply_config(config)
            # Each client is one connection, which the kernel gives to one worker: calls go
            # on, 20 at a time, until both workers have answered some (at most 200).
            calls = 0
            while calls < 200:
                for _ in range(20):
                    with GpufairClient(serve.address, attempts=1, timeout_s=30) as reader:
                        assert reader.get_config().config_version == 1
                calls += 20
                if all(_get_config_calls(_scrape(p)) > 0 for p in (metrics, metrics + 1)):
                    break
            per_worker = [_get_config_calls(_scrape(p)) for p in (metrics, metrics + 1)]
            assert min(per_worker) > 0 and sum(per_worker) == calls, per_worker

            def value(expr: str) -> float | None:
                result = prometheus.query(expr)
                return float(result[0]["value"][1]) if result else None

            wait_for(lambda: value('count(up{job="gpufair"} == 1)') == 2, 60, "both targets up")
            counted = 'sum(gpufair_rpcs_total{method=~".*GetConfig"})'
            wait_for(lambda: value(counted) == calls, 60, f"{counted} == {calls}")
            by_instance = prometheus.query(
                'sum by (instance) (gpufair_rpcs_total{method=~".*GetConfig"})'
            )
            assert sorted(float(r["value"][1]) for r in by_instance) == sorted(per_worker)

            # The dashboard's fair-share panel: one series per queue, from worker 0 only.
            shares = "max by (pool, queue) (gpufair_fair_share_cu)"
            wait_for(lambda: len(prometheus.query(shares)) == 2, 60, shares)
            assert {r["metric"]["queue"] for r in prometheus.query(shares)} == {"llm", "vision"}
            exporters = prometheus.query("count by (instance) (gpufair_fair_share_cu)")
            assert [r["metric"]["instance"] for r in exporters] == [f"127.0.0.1:{metrics}"]
        finally:
            prometheus.stop()
            if serve.proc.poll() is None:
                assert serve.terminate() == 0
