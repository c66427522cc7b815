"""The GPU-hours of real Slurm jobs reach the ledger, the `report` views and `gpufair report usage`.

The views read hourly rollups, which the service writes for closed UTC hours only: usage of the
hour still open shows up once it closes. The test runs the service's rollup step as its periodic
job does when the current hour has closed (its clock set to the hour's end), after every job has
ended, so the rows are the ones the views will hold from then on.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from slurm_support import bridge_config, cluster_config, cycle_until, make_bridge, sbatch, squeue
from sqlalchemy import Engine, text

from gpufair.cli import main
from gpufair.client import GpufairClient
from gpufair.domain.rollup import floor_hour
from gpufair.store import config_repo, rollup_repo


def test_gpu_hours_of_slurm_jobs_appear_in_report_views_and_cli(
    slurm: Any, client: GpufairClient, db: Engine, capsys: pytest.CaptureFixture[str]
) -> None:
    client.apply_config(cluster_config("gpu"))
    bridge = make_bridge(client, bridge_config())
    bridge.cycle()
    a100_gang = sbatch(slurm, account="acct-a", nodes=2, gres="gpu:a100:8", seconds=7)
    rtx_job = sbatch(slurm, account="acct-b", nodes=2, gres="gpu:rtx4090:8", seconds=5)
    jobs = (a100_gang, rtx_job)

    def all_finished_in_gpufair() -> bool:
        done = client.list_workloads(states=["finished"])
        return {w.workload.uid for w in done} == {f"slurm-{j}" for j in jobs}

    cycle_until(bridge, all_finished_in_gpufair, max_cycles=20)
    slurm_jobs = squeue(slurm)
    assert all(slurm_jobs[j]["job_state"] == "COMPLETED" for j in jobs)
    seconds = {j: slurm_jobs[j]["end_time"] - slurm_jobs[j]["start_time"] for j in jobs}
    assert seconds[a100_gang] >= 7 and seconds[rtx_job] >= 5

    # The ledger's runs are Slurm's own start and end times.
    with db.connect() as conn:
        runs = conn.execute(
            text(
                "SELECT workload_uid, extract(epoch FROM started_at), extract(epoch FROM ended_at),"
                " gpus, gpu_type, end_kind FROM allocation_intervals ORDER BY workload_uid"
            )
        ).all()
    assert [(r[0], float(r[1]), float(r[2]), r[3], r[4], r[5]) for r in runs] == sorted(
        [
            (
                f"slurm-{a100_gang}",
                float(slurm_jobs[a100_gang]["start_time"]),
                float(slurm_jobs[a100_gang]["end_time"]),
                16.0,
                "a100-80gb",
                "stopped",
            ),
            (
                f"slurm-{rtx_job}",
                float(slurm_jobs[rtx_job]["start_time"]),
                float(slurm_jobs[rtx_job]["end_time"]),
                16.0,
                "rtx4090-24gb",
                "stopped",
            ),
        ]
    )

    # The rollup, as the periodic job runs it once this hour has closed.
    hour_end_s = floor_hour(time.time()) + 3600
    with db.connect() as conn:
        config = config_repo.load_config(conn)
        for pool in config.pools:
            rollup_repo.rollup_pool(conn, config, pool, hour_end_s)
        conn.commit()
        rows = conn.execute(
            text(
                "SELECT queue, gpu_type, sum(gpu_hours), sum(cu_hours) FROM report.usage_daily "
                "WHERE pool = 'gpu' GROUP BY queue, gpu_type ORDER BY queue"
            )
        ).all()
    expected = {
        ("team-a", "a100-80gb"): (16 * seconds[a100_gang] / 3600, 160 * seconds[a100_gang] / 3600),
        ("team-b", "rtx4090-24gb"): (16 * seconds[rtx_job] / 3600, 32 * seconds[rtx_job] / 3600),
    }
    assert [(r[0], r[1]) for r in rows] == list(expected)
    for row in rows:
        assert (float(row[2]), float(row[3])) == pytest.approx(expected[row[0], row[1]])

    # The same numbers through `gpufair report usage` (two decimals).
    address = client.address
    assert main(["report", "usage", "--by", "queue,gpu-type", "--address", address]) == 0
    out = capsys.readouterr().out
    for (queue, gpu_type), (gpu_hours, cu_hours) in expected.items():
        line = next(row for row in out.splitlines() if queue in row and gpu_type in row)
        assert line.split()[-3:-1] == [f"{round(gpu_hours, 2)}", f"{round(cu_hours, 2)}"], out
