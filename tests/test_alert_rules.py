"""The alert rules of deploy/prometheus/alerts.yml on made-up series, with `promtool test rules`:
what fires, and as important, what must not (an alert that fires on a healthy cluster is soon
ignored). `tests/test_prometheus.py` runs the same rules against a real gpufair.

The series start at Unix time 0 (promtool's clock) and are sampled every minute.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

ALERTS = Path(__file__).resolve().parents[1] / "deploy" / "prometheus" / "alerts.yml"
JOB_ALERT = "GpufairPeriodicJobFailing"


def _promtool() -> str:
    promtool = shutil.which("promtool")
    if promtool:
        return promtool
    if os.environ.get("GPUFAIR_REQUIRE_PROMETHEUS") == "1":
        pytest.fail("promtool is required (GPUFAIR_REQUIRE_PROMETHEUS=1) but not installed")
    pytest.skip("promtool not installed (Debian package `prometheus`)")


def _job(job: str, last_success_s: int, failed: int = 0) -> list[dict[str, str]]:
    """A job's gauges as one replica exports them, unchanged for two days."""
    labels = f'periodic_job="{job}", instance="gpufair:9464", job="gpufair"'
    return [
        {
            "series": f"gpufair_periodic_job_last_success_timestamp_seconds{{{labels}}}",
            "values": f"{last_success_s}+0x2880",
        },
        {"series": f"gpufair_periodic_job_last_failed{{{labels}}}", "values": f"{failed}+0x2880"},
    ]


def _run(tmp_path: Path, series: list[dict[str, str]], checks: list[dict[str, Any]]) -> None:
    tests = {
        "rule_files": [str(ALERTS)],
        "evaluation_interval": "1m",
        "tests": [{"interval": "1m", "input_series": series, "alert_rule_test": checks}],
    }
    path = tmp_path / "alerts_test.yml"
    path.write_text(yaml.safe_dump(tests))
    done = subprocess.run(
        [_promtool(), "test", "rules", str(path)],
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


def test_a_daily_job_that_ran_today_is_not_failing(tmp_path: Path) -> None:
    # Retention runs once a UTC day (jobs/runner.py): it succeeded at 00:00:10 and is next due
    # at midnight. The rollup (hourly) last succeeded at 00:00:20 and has not run since.
    series = _job("retention", 10) + _job("rollup", 20)
    _run(
        tmp_path,
        series,
        [
            # 6 hours on: the rollup has missed five periods, retention none.
            {"eval_time": "6h", "alertname": JOB_ALERT, "exp_alerts": [_firing("rollup")]},
            # 23 hours on, retention is still not due.
            {"eval_time": "23h", "alertname": JOB_ALERT, "exp_alerts": [_firing("rollup")]},
            # 27 hours on, it missed the midnight run.
            {
                "eval_time": "27h",
                "alertname": JOB_ALERT,
                "exp_alerts": [_firing("retention"), _firing("rollup")],
            },
        ],
    )


def test_a_failed_run_fires_whatever_the_job(tmp_path: Path) -> None:
    series = _job("retention", 10, failed=1) + _job("sweep", 7190)
    _run(
        tmp_path,
        series,
        [
            # 2 hours on: retention's latest run failed (10 minutes `for`); the sweep succeeded
            # at 01:59:50, ten seconds before, so it is fine.
            {"eval_time": "2h", "alertname": JOB_ALERT, "exp_alerts": [_firing("retention")]},
        ],
    )
