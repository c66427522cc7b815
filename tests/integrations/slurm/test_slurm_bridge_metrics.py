"""The bridge's Prometheus metrics, scraped over HTTP while its loop runs (no Slurm needed):
cycles against a real gpufair with Slurm's answers set by the test, cycles against a gpufair that
does not answer, and `gpufair slurm-bridge --metrics-address` as a process whose Slurm commands
are missing.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import replace
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families
from slurm_support import cluster_config
from test_slurm_commands import CannedSlurm, held_job, slurm_node
from test_slurm_mapping import CONFIG

from gpufair.cli.slurm_bridge import run_bridge
from gpufair.client import GpufairClient
from gpufair.integrations.slurm.bridge import Bridge, CycleReport
from gpufair.integrations.slurm.bridge_metrics import BridgeMetrics

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(port: int) -> Samples:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples[(f"gpufair_slurm_bridge_{name}", tuple(sorted(labels.items())))]


class Counted(Bridge):
    """Sets `stop` once it has run `cycles` cycles, so the loop ends after exactly that many."""

    def __init__(self, *args: object, cycles: int, stop: threading.Event, **kw: object) -> None:
        super().__init__(*args, **kw)  # type: ignore[arg-type]
        self.left, self.stop = cycles, stop

    def cycle(self) -> CycleReport:
        try:
            return super().cycle()
        finally:
            self.left -= 1
            if self.left == 0:
                self.stop.set()


class ReleasingSlurm(CannedSlurm):
    """Slurm's answers change as the bridge's commands would change them: a released job
    waits to start (no longer held)."""

    def _run(self, program: str, *args: str) -> str:
        out = super()._run(program, *args)
        if args[:1] == ("release",):
            released = set(args[1].split(","))
            self.job_list = [
                replace(j, priority=4294901742) if str(j.job_id) in released else j
                for j in self.job_list
            ]
        return out


def run_cycles(bridge_of: type[Counted], client: GpufairClient, slurm: CannedSlurm,
               metrics: BridgeMetrics, cycles: int, accounts: dict[str, str]) -> int:  # fmt: skip
    stop = threading.Event()
    config = replace(CONFIG, accounts=accounts, cycle_s=0.05)
    bridge = bridge_of(config, client, slurm, cycles=cycles, stop=stop)
    return run_bridge(bridge, once=False, stop=stop, metrics=metrics)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def test_cycles_against_gpufair_then_a_gpufair_that_does_not_answer(
    client: GpufairClient,
) -> None:
    client.apply_config(cluster_config("main"))
    metrics = BridgeMetrics()
    http = metrics.serve("127.0.0.1:0")
    try:
        before = scrape(http.server_port)
        assert value(before, "cycles_total", outcome="ok") == 0
        assert value(before, "last_success_timestamp_seconds") == 0

        # Job 42 (2 x 4 GPUs) is submitted and placed in the first cycle; job 43's account
        # maps to a queue gpufair lacks: unmappable, in each of the 3 cycles.
        slurm = ReleasingSlurm([slurm_node("a100-0"), slurm_node("a100-1")])
        slurm.job_list = [held_job(42), held_job(43, account="finance")]
        started_s = time.time()
        accounts = {"vision": "team-a", "finance": "team-c"}
        assert run_cycles(Counted, client, slurm, metrics, 3, accounts) == 0
        ok = scrape(http.server_port)
        assert [value(ok, "cycles_total", outcome=o) for o in ("ok", "partial", "failed")] == [
            3,
            0,
            0,
        ]
        assert value(ok, "cycle_duration_seconds_count") == 3
        jobs = {a: value(ok, "jobs_total", action=a) for a in ("submitted", "placed")}
        assert jobs == {"submitted": 1, "placed": 1}
        assert value(ok, "jobs_total", action="unmappable") == 3
        assert value(ok, "jobs_total", action="cancelled") == 0
        assert value(ok, "errors_total") == 0
        last_success = value(ok, "last_success_timestamp_seconds")
        assert started_s <= last_success <= time.time()

        # gpufair stops answering: 2 failed cycles, the last success stays where it was.
        with GpufairClient(f"127.0.0.1:{free_port()}", timeout_s=2, attempts=1) as dead:
            assert run_cycles(Counted, dead, slurm, metrics, 2, accounts) == 0
        failed = scrape(http.server_port)
        assert value(failed, "cycles_total", outcome="failed") == 2
        assert value(failed, "cycles_total", outcome="ok") == 3
        assert value(failed, "cycle_duration_seconds_count") == 5
        assert value(failed, "errors_total") == 2
        assert value(failed, "last_success_timestamp_seconds") == last_success
    finally:
        http.shutdown()
        http.server_close()


def test_an_event_gpufair_refuses_makes_the_cycle_partial(client: GpufairClient) -> None:
    client.apply_config(cluster_config("main"))
    # A job Slurm started itself on an H100 node, whose GPU type is not mapped: its start
    # event is refused in every cycle after the one that submitted it.
    slurm = CannedSlurm([slurm_node("a100-0"), slurm_node("h100-0", gres="gpu:h100:8")])
    job = held_job(45, node_count=1, max_nodes=1, tres_per_node="gres:gpu:1", priority=1)
    slurm.job_list = [
        replace(
            job,
            state="RUNNING",
            nodes=("h100-0",),
            gpu_indices=((3,),),
            start_time=int(time.time()) - 30,
        )
    ]
    metrics = BridgeMetrics()
    http = metrics.serve("127.0.0.1:0")
    try:
        assert run_cycles(Counted, client, slurm, metrics, 3, {"vision": "team-a"}) == 0
        seen = scrape(http.server_port)
    finally:
        http.shutdown()
        http.server_close()
    assert [value(seen, "cycles_total", outcome=o) for o in ("ok", "partial", "failed")] == [
        1,
        2,
        0,
    ]
    assert value(seen, "events_total", status="rejected") == 2
    assert value(seen, "errors_total") == 2
    assert value(seen, "jobs_total", action="submitted") == 1
    # A partial cycle ran to its end: it is the latest success.
    assert value(seen, "last_success_timestamp_seconds") > 0


def test_slurm_bridge_command_serves_metrics_of_its_failing_cycles(tmp_path: Path) -> None:
    """The process, as a platform team runs it; its Slurm commands are missing (an empty
    `slurm_bin`), so every cycle fails, and no cycle succeeded."""
    config = tmp_path / "bridge.yaml"
    config.write_text(
        f"partitions: {{gpu: main}}\naccounts: {{vision: team-a}}\n"
        f"gpu_types: {{a100: a100-80gb}}\ncycle_s: 0.2\nslurm_bin: {tmp_path / 'none'}\n"
    )
    port = free_port()
    argv = [sys.executable, "-m", "gpufair.cli", "slurm-bridge", "--config", str(config)]
    argv += ["--address", f"127.0.0.1:{free_port()}", "--metrics-address", f"127.0.0.1:{port}"]
    bridge = subprocess.Popen(
        argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            seen: Samples = {}
            with contextlib.suppress(OSError):  # the endpoint not listening yet
                seen = scrape(port)
            if seen and value(seen, "cycles_total", outcome="failed") >= 2:
                break
            assert time.monotonic() < deadline, "no 2 failed cycles scraped in 30 s"
            time.sleep(0.2)
    finally:
        os.killpg(bridge.pid, signal.SIGTERM)
        _, stderr = bridge.communicate(timeout=30)
    assert bridge.returncode == 0, stderr.decode()
    assert value(seen, "cycles_total", outcome="ok") == 0
    assert value(seen, "last_success_timestamp_seconds") == 0
    assert value(seen, "errors_total") >= 2  # one per failed cycle
    assert "process_cpu_seconds_total" in {name for name, _ in seen}
