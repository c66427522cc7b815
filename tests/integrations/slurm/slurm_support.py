"""Helpers of the Slurm end-to-end tests: the local cluster of examples/slurm, job submission,
the gpufair config the scenarios share, and a bridge driven cycle by cycle."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, text

from gpufair.client import GpufairClient
from gpufair.integrations.slurm.bridge import Bridge, CycleReport
from gpufair.integrations.slurm.config import BridgeConfig, parse_config
from gpufair.integrations.slurm.slurmctl import SlurmCtl
from gpufair.v1 import cluster_pb2

ROOT = Path(__file__).resolve().parents[3]


def _load_local_cluster() -> Any:
    spec = importlib.util.spec_from_file_location(
        "local_cluster", ROOT / "examples" / "slurm" / "local_cluster.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["local_cluster"] = module
    spec.loader.exec_module(module)
    return module


_local = _load_local_cluster()
LocalSlurm = _local.LocalSlurm
missing_commands = _local.missing_commands


def unavailable() -> str | None:
    """Why a local Slurm cluster cannot start here, or None."""
    missing = missing_commands()
    if missing:
        return f"Slurm is not installed (missing {', '.join(missing)})"
    if os.geteuid() != 0:
        return "the local Slurm cluster needs root (mknod, slurmd)"
    return None


@contextlib.contextmanager
def own_cluster(root: Path, **options: Any) -> Iterator[Any]:
    """A local cluster of a test's own (`LocalSlurm` options, such as `slurmd_timeout_s`),
    beside the shared one of conftest.py: started in `root`, `SLURM_CONF` naming it (for the
    bridge's commands) until it is stopped. Skips where Slurm cannot start; fails instead with
    GPUFAIR_REQUIRE_SLURM=1, as the shared cluster does."""
    reason = unavailable()
    if reason is not None:
        if os.environ.get("GPUFAIR_REQUIRE_SLURM") == "1":
            pytest.fail(f"GPUFAIR_REQUIRE_SLURM=1 but {reason}")
        pytest.skip(reason)
    cluster = LocalSlurm(root, **options)
    previous = os.environ.get("SLURM_CONF")
    try:
        cluster.start()
        os.environ["SLURM_CONF"] = str(cluster.conf)
        yield cluster
    finally:
        cluster.stop()
        if previous is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = previous


BRIDGE_YAML: dict[str, Any] = {
    "partitions": {"gpu": "gpu"},
    "accounts": {"acct-a": "team-a", "acct-b": "team-b"},
    "gpu_types": {"a100": "a100-80gb", "rtx4090": "rtx4090-24gb"},
    "features": {"gpumem40": {"min_gpu_memory_gib": 40}},
    "non_preemptible_qos": ["inference"],
    "cycle_s": 1,
    "heartbeat_s": 30,
}


def bridge_config(**overrides: Any) -> BridgeConfig:
    return parse_config({**BRIDGE_YAML, **overrides})


def cluster_config(
    pool: str, *, k: float = 1.0, window_s: float = 3600.0, dead_band: float = 0.01
) -> cluster_pb2.ClusterConfig:
    """GPU types, one pool and two equal queues with no deserved quota; the nodes come from the
    bridge."""
    policy = cluster_pb2.FairSharePolicy(
        window_kind=cluster_pb2.WINDOW_KIND_SLIDING,
        window_s=window_s,
        k=k,
        recompute_interval_s=1,
        rounding=cluster_pb2.ROUNDING_WHOLE_GPUS,
        dead_band=dead_band,
    )
    return cluster_pb2.ClusterConfig(
        gpu_types=[
            cluster_pb2.GpuType(name="a100-80gb", memory_gib=80, compute_weight=10),
            cluster_pb2.GpuType(name="rtx4090-24gb", memory_gib=24, compute_weight=2),
        ],
        pools=[cluster_pb2.NodePool(name=pool, policy=policy)],
        queues=[
            cluster_pb2.Queue(name=q, quotas=[cluster_pb2.QueueQuota(pool=pool, deserved_cu=0)])
            for q in ("team-a", "team-b")
        ],
    )


def sbatch(
    cluster: Any,
    *,
    account: str,
    partition: str = "gpu",
    nodes: int = 1,
    gres: str = "gpu:1",
    seconds: float = 5,
    constraint: str = "",
    hold: bool = True,
    wrap: str = "",
) -> int:
    """Submit a `sleep` job (or one running the shell command `wrap`), held unless told; its id."""
    args = ["sbatch", "--parsable", *(["--hold"] if hold else [])]
    args += ["-p", partition, "-A", account, f"-N{nodes}"]
    args += [f"--gres={gres}", "-o", "/dev/null", "--wrap", wrap or f"sleep {seconds}"]
    if constraint:
        args.append(f"--constraint={constraint}")
    out = cluster.run(*args).stdout
    return int(out.strip().split(";")[0])


def squeue(cluster: Any) -> dict[int, dict[str, Any]]:
    """Every job Slurm knows, raw from `squeue --json`, by job id."""
    data = json.loads(cluster.run("squeue", "--json", "--all").stdout)
    return {int(j["job_id"]): j for j in data["jobs"]}


def make_bridge(client: GpufairClient, config: BridgeConfig) -> Bridge:
    return Bridge(config, client, SlurmCtl(config.slurm_bin))


def cycle_until(
    bridge: Bridge,
    done: Callable[[], bool],
    *,
    max_cycles: int,
    period_s: float = 1.0,
    reports: list[CycleReport] | None = None,
) -> int:
    """Run bridge cycles, one per period, until `done()`; the cycles it took. Fails with the
    last cycle's report when `max_cycles` were not enough."""
    report = CycleReport()
    for count in range(1, max_cycles + 1):
        started = time.monotonic()
        report = bridge.cycle()
        assert not report.errors, report.errors
        if reports is not None:
            reports.append(report)
        if done():
            return count
        time.sleep(max(0.0, period_s - (time.monotonic() - started)))
    raise AssertionError(f"not done after {max_cycles} cycles; last cycle: {report}")


def runs_of(db: Engine, uid: str) -> list[tuple[float, float | None, float, str, str | None]]:
    """The workload's runs in the ledger: (start, end or None, GPUs, GPU type, end kind)."""
    with db.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT extract(epoch FROM started_at)::float8, extract(epoch FROM ended_at)::float8,"
                " gpus, gpu_type, end_kind FROM allocation_intervals WHERE workload_uid = :uid"
                " ORDER BY started_at"
            ),
            {"uid": uid},
        ).all()
    return [(r[0], r[1], r[2], r[3], r[4]) for r in rows]
