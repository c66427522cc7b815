"""Jobs that arrive at or after the end of the run (duration_s) are not part of it: jobs.csv has
no row for them, and the run's summary notes how many there are, so a trace or job list longer
than the span does not shrink without a word."""

from __future__ import annotations

import csv
from pathlib import Path

from sim_support import scenario_from, unit_cluster

from gpufair.sim.run import run_and_write


def test_jobs_arriving_at_or_after_the_end_are_noted_and_left_out(tmp_path: Path) -> None:
    data = {
        "name": "late",
        "duration_s": "1d",
        "cluster": unit_cluster([("n1", 8)], [{"name": "team"}]),
        "workloads": [
            {"queue": "team", "uid": "early", "duration_s": "1h"},
            {"queue": "team", "uid": "at-end", "submit_s": "1d", "duration_s": "1h"},
            {"queue": "team", "uid": "after", "submit_s": "2d", "duration_s": "1h"},
        ],
    }
    scenario = scenario_from(data)
    (note,) = [n for n in scenario.notes if "at or after the end" in n]
    assert note.startswith("2 of the scenario's 3 jobs arrive at or after the end")
    text = run_and_write(scenario, tmp_path, plots=False)
    assert note in text
    with (tmp_path / "jobs.csv").open() as handle:
        assert [row["uid"] for row in csv.DictReader(handle)] == ["early"]


def test_no_note_when_every_job_arrives_in_the_run() -> None:
    data = {
        "name": "in-time",
        "duration_s": "1d",
        "cluster": unit_cluster([("n1", 8)], [{"name": "team"}]),
        "workloads": [{"queue": "team", "submit_s": "23h", "duration_s": "2h"}],
    }
    assert scenario_from(data).notes == ()
