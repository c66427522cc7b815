"""The alert rules of deploy/prometheus/alerts.yml on made-up series, with `promtool test rules`:
what fires, and as important, what must not (an alert that fires on a healthy cluster is soon
ignored). `tests/test_prometheus.py` runs the same rules against a real gpufair.

The series start at Unix time 0 (promtool's clock) and are sampled every minute.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import yaml

from tests.test_prometheus import prometheus_tools

ALERTS = Path(__file__).resolve().parents[1] / "deploy" / "prometheus" / "alerts.yml"
JOB_ALERT = "GpufairPeriodicJobFailing"
MINUTES = 4 * 24 * 60  # how long the made-up series last


def _job(
    job: str, last_success_s: int, failed: int = 0, period_s: float | None = None
) -> list[dict[str, str]]:
    """A job's gauges as one replica exports them, unchanged for four days; its period only
    when `period_s` is given (a replica that runs no jobs does not know it)."""
    labels = f'periodic_job="{job}", instance="gpufair:9464", job="gpufair"'
    series = [
        {
            "series": f"gpufair_periodic_job_last_success_timestamp_seconds{{{labels}}}",
            "values": f"{last_success_s}+0x{MINUTES}",
        },
        {
            "series": f"gpufair_periodic_job_last_failed{{{labels}}}",
            "values": f"{failed}+0x{MINUTES}",
        },
    ]
    if period_s is not None:
        series.append(
            {
                "series": f"gpufair_periodic_job_period_seconds{{{labels}}}",
                "values": f"{period_s}+0x{MINUTES}",
            }
        )
    return series


def _run(tmp_path: Path, series: list[dict[str, str]], checks: list[dict[str, Any]]) -> None:
    tests = {
        "rule_files": [str(ALERTS)],
        "evaluation_interval": "1m",
        "tests": [{"interval": "1m", "input_series": series, "alert_rule_test": checks}],
    }
    path = tmp_path / "alerts_test.yml"
    path.write_text(yaml.safe_dump(tests))
    done = subprocess.run(
        [prometheus_tools()[1], "test", "rules", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def _firing(job: str) -> dict[str, Any]:
    """The job's alert, with the rule's own annotations for that job."""
    groups = yaml.safe_load(ALERTS.read_text())["groups"]
    (rule,) = [r for g in groups for r in g["rules"] if r.get("alert") == JOB_ALERT]
    annotations = {
        key: value.replace("{{ $labels.periodic_job }}", job)
        for key, value in rule["annotations"].items()
    }
    return {
        "exp_labels": {"periodic_job": job, "severity": rule["labels"]["severity"]},
        "exp_annotations": annotations,
    }


def _not_firing(at: str) -> dict[str, Any]:
    return {"eval_time": at, "alertname": JOB_ALERT, "exp_alerts": []}


def _fires(at: str, *jobs: str) -> dict[str, Any]:
    return {"eval_time": at, "alertname": JOB_ALERT, "exp_alerts": [_firing(j) for j in jobs]}


# A job is overdue when no replica has finished it for two periods and 15 minutes: one lost run
# (a replica that died in it) is repaired by the next and is no ticket; two are. The alert then
# waits its 10 minutes `for`.


def test_a_job_of_60_s_is_overdue_within_half_an_hour(tmp_path: Path) -> None:
    # The sweep last succeeded at 00:00:10: overdue from 00:17:10, firing from 00:27:10.
    series = _job("sweep", 10, period_s=60)
    checks = [_not_firing("15m"), _not_firing("27m"), _fires("28m", "sweep"), _fires("3h", "sweep")]
    _run(tmp_path, series, checks)


def test_a_daily_job_is_overdue_once_it_missed_two_runs(tmp_path: Path) -> None:
    # Retention runs once a UTC day; it succeeded at 00:00:10. A day on it has not run again
    # yet, two days on it has missed one midnight (repaired by the next), not two.
    series = _job("retention", 10, period_s=86400)
    checks = [_not_firing("23h"), _not_firing("27h"), _not_firing("48h20m")]
    _run(tmp_path, series, [*checks, _fires("48h30m", "retention")])


def test_a_pool_recomputed_every_6_hours_is_not_overdue_between_runs(tmp_path: Path) -> None:
    # Pool `batch` recomputes every 6 h, last at 00:00:10; the hourly rollup last ran then too.
    series = _job("recompute:batch", 10, period_s=21600) + _job("rollup", 10, period_s=3600)
    checks = [
        _fires("6h", "rollup"),  # the rollup missed five runs, the recompute none
        _fires("12h20m", "rollup"),  # the recompute missed one run
        _fires("12h30m", "recompute:batch", "rollup"),
    ]
    _run(tmp_path, series, checks)


def test_a_job_whose_period_no_replica_exports_is_overdue_after_26_hours(tmp_path: Path) -> None:
    series = _job("rollup", 10)  # no replica exporting metrics runs the jobs
    _run(tmp_path, series, [_not_firing("26h"), _fires("26h20m", "rollup")])


def test_a_failed_run_fires_whatever_the_job(tmp_path: Path) -> None:
    series = _job("retention", 10, failed=1, period_s=86400) + _job("sweep", 7190, period_s=60)
    _run(
        tmp_path,
        series,
        [
            # 2 hours on: retention's latest run failed (10 minutes `for`); the sweep succeeded
            # at 01:59:50, ten seconds before, so it is fine.
            {"eval_time": "2h", "alertname": JOB_ALERT, "exp_alerts": [_firing("retention")]},
        ],
    )


def test_a_job_that_runs_and_never_succeeded_is_overdue(tmp_path: Path) -> None:
    # The replica running the jobs exports the rollup's period, and no success of it exists:
    # its claims hold only failures and runs that never finished (a replica killed in each),
    # which set no failure gauge. The sweep beside it is fine.
    labels = 'periodic_job="rollup", instance="gpufair:9464", job="gpufair"'
    series = [
        {
            "series": f"gpufair_periodic_job_period_seconds{{{labels}}}",
            "values": f"3600+0x{MINUTES}",
        },
        *_job("sweep", 0, period_s=60),
    ]
    # The sweep succeeded at 00:00:00 and keeps being seen so: only the rollup is at issue
    # before the sweep itself is overdue (00:17).
    _run(tmp_path, series, [_not_firing("9m"), _fires("11m", "rollup")])


# The Slurm bridge: stalled when no cycle has run to its end for 3 minutes, or its metrics have
# not answered, for the rule's 2 minutes more.
BRIDGE_ALERT = "GpufairSlurmBridgeStalled"
BRIDGE = 'instance="slurm-bridge:9470", job="gpufair-slurm-bridge"'


def _bridge(last_success: str, up: str) -> list[dict[str, str]]:
    return [
        {
            "series": f"gpufair_slurm_bridge_last_success_timestamp_seconds{{{BRIDGE}}}",
            "values": last_success,
        },
        {"series": f"up{{{BRIDGE}}}", "values": up},
    ]


def _bridge_alerts(at: str, firing: bool) -> dict[str, Any]:
    groups = yaml.safe_load(ALERTS.read_text())["groups"]
    (rule,) = [r for g in groups for r in g["rules"] if r.get("alert") == BRIDGE_ALERT]
    instance = "slurm-bridge:9470"
    alert = {
        "exp_labels": {"instance": instance, "severity": rule["labels"]["severity"]},
        "exp_annotations": {
            k: v.replace("{{ $labels.instance }}", instance) for k, v in rule["annotations"].items()
        },
    }
    return {"eval_time": at, "alertname": BRIDGE_ALERT, "exp_alerts": [alert] if firing else []}


def test_a_bridge_whose_cycles_succeed_does_not_fire(tmp_path: Path) -> None:
    # A success every minute (every 5 s in truth; sampled each minute) for four hours.
    series = _bridge("0+60x240", "1+0x240")
    checks = [_bridge_alerts(at, firing=False) for at in ("5m", "1h", "4h")]
    _run(tmp_path, series, checks)


def test_a_bridge_whose_cycles_fail_fires_5_minutes_after_its_last_success(
    tmp_path: Path,
) -> None:
    # Cycles succeed until 00:10, then every one fails (gpufair down): the process still
    # answers scrapes, its last success stays at 600 s. Over 180 s from 00:13 on (strictly
    # from the next sample, 00:14), firing 2 minutes later.
    series = _bridge("0+60x10 600+0x50", "1+0x60")
    checks = [_bridge_alerts(at, firing=False) for at in ("10m", "13m", "15m")]
    _run(tmp_path, series, [*checks, _bridge_alerts("16m", firing=True)])


def test_a_bridge_that_is_not_scraped_fires(tmp_path: Path) -> None:
    # The process dies at 00:10: its series end, `up` is 0 from 00:11, firing from 00:13.
    series = _bridge("0+60x10 _x50", "1+0x10 0+0x50")
    checks = [_bridge_alerts("12m", firing=False), _bridge_alerts("13m", firing=True)]
    _run(tmp_path, series, [*checks, _bridge_alerts("1h", firing=True)])
