"""Two server processes scheduling one pool at the same time never hand out a GPU twice."""

from __future__ import annotations

import os
import random
import threading
from collections import defaultdict
from pathlib import Path

from serve_support import ServeProcess
from sqlalchemy import create_engine, text

from gpufair.client import GpufairClient
from gpufair.config_file import load_config_file
from gpufair.store.database import Database, normalise_url
from gpufair.store.scratch import scratch_database
from gpufair.v1 import scheduler_pb2

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "clusters" / "heterogeneous.yaml"
LEAVES = ("online-inference", "fine-tuning", "preprocessing")


def random_workloads(n: int) -> list[scheduler_pb2.Workload]:
    rng = random.Random(5)
    out = []
    for i in range(n):
        gpus = rng.choice([0.25, 0.5, 1, 1, 2, 4, 8])
        out.append(
            scheduler_pb2.Workload(
                uid=f"w{i}",
                queue=rng.choice(LEAVES),
                pool="main",
                pods=rng.choice([1, 1, 2, 4]) if gpus >= 1 else 1,
                gpus_per_pod=gpus,
                cpu_millicores_per_pod=rng.choice([1000, 4000, 8000]),
                memory_mib_per_pod=rng.choice([4096, 16384, 65536]),
            )
        )
    return out


def test_concurrent_schedules_from_two_replicas_never_double_book(
    pg_server: Database, tmp_path: Path
) -> None:
    env = {k: v for k, v in os.environ.items() if k != "GPUFAIR_DATABASE_URL"}
    with scratch_database(pg_server.url) as url:
        args = ["--database-url", url, "--grace-s", "1", "--no-jobs"]
        replicas = [ServeProcess(args, env, tmp_path / f"r{i}.log") for i in range(2)]
        try:
            for r in replicas:
                r.wait_serving()
            with GpufairClient(replicas[0].address, attempts=1, timeout_s=60) as c:
                c.apply_config(load_config_file(EXAMPLE))
                reply = c.scheduler.SubmitWorkloads(
                    scheduler_pb2.SubmitWorkloadsRequest(workloads=random_workloads(400)),
                    timeout=60,
                )
                assert sum(r.accepted for r in reply.results) == 400
            # uid -> the cycles that reported it bound. A call that waited for the pool's lock
            # while the other replica ran a cycle gets that cycle's reply (api/cycle_gate.py,
            # SchedulerServicer._run_slot), so one cycle may be reported to both replicas.
            bound_by: dict[str, set[int]] = defaultdict(set)

            def hammer(index: int) -> None:
                with GpufairClient(replicas[index].address, attempts=1, timeout_s=60) as c:
                    for _ in range(6):
                        got = c.scheduler.Schedule(
                            scheduler_pb2.ScheduleRequest(pool="main"), timeout=60
                        )
                        for b in got.binds:
                            bound_by[b.uid].add(got.cycle_id)

            threads = [threading.Thread(target=hammer, args=(i,)) for i in range(2)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(timeout=300)
        finally:
            assert [r.terminate() for r in replicas] == [0, 0]

        engine = create_engine(normalise_url(url))
        try:
            with engine.connect() as conn:
                bound = conn.execute(
                    text("SELECT uid, spec, binding FROM workloads WHERE state = 'bound'")
                ).all()
                nodes = {
                    r.name: r
                    for r in conn.execute(
                        text("SELECT name, gpu_count, cpu_millicores, memory_mib FROM nodes")
                    )
                }
        finally:
            engine.dispose()

    # Every bind reported was stored, and each by one cycle.
    assert set(bound_by) == {row.uid for row in bound} and len(bound) > 30
    assert all(len(cycles) == 1 for cycles in bound_by.values())
    gpu_use: dict[tuple[str, int], float] = defaultdict(float)
    cpu_use: dict[str, int] = defaultdict(int)
    mem_use: dict[str, int] = defaultdict(int)
    for row in bound:
        for pod in row.binding["pods"]:
            for index in pod["gpu_indices"]:
                gpu_use[(pod["node"], index)] += pod["gpu_fraction"]
            cpu_use[pod["node"]] += row.spec["cpu_millicores_per_pod"]
            mem_use[pod["node"]] += row.spec["memory_mib_per_pod"]
    assert max(gpu_use.values()) <= 1.0 + 1e-9
    assert all(0 <= index < nodes[node].gpu_count for node, index in gpu_use)
    assert all(cpu_use[n] <= nodes[n].cpu_millicores for n in cpu_use)
    assert all(mem_use[n] <= nodes[n].memory_mib for n in mem_use)
