"""The service's submit rules on every job a simulation makes (`domain.workload_rules`).

Trace rows the server would refuse (a negative CPU request, 100 GPUs a pod, a pod no node can
hold) are refused at their arrival, counted and reported; they never wait. Workloads and
generators written in the scenario are checked when it loads: a job they would make that the
server refuses is a problem with its field path and line."""

from __future__ import annotations

import csv
import dataclasses
import json
from pathlib import Path

import pytest
from sim_support import scenario_from, unit_cluster
from test_scenario import problems, scenario_text
from test_trace import NODES, POD_HEADER, trace_scenario_data

from gpufair.domain.model import Workload
from gpufair.sim.engine import simulate
from gpufair.sim.jobspec import JobSpec
from gpufair.sim.run import run_and_write
from gpufair.sim.scenario import parse_scenario
from gpufair.sim.trace import NODES_FILE, PODS_FILE

PODS = [
    POD_HEADER,
    "pod-ok,8000,16384,1,1000,,LS,Running,1000,4600,1000",  # runs
    "pod-neg-cpu,-5,16384,1,1000,,LS,Running,1100,4600,1100",  # a negative CPU request
    "pod-100-gpus,8000,16384,100,1000,,BE,Running,1200,4600,1200",  # above 64 GPUs a pod
    "pod-too-big,200000,16384,8,1000,G2,BE,Running,1300,4600,1300",  # no node has 200 cores
]


@pytest.fixture
def trace_dir(tmp_path: Path) -> Path:
    (tmp_path / NODES_FILE).write_text("\n".join(NODES) + "\n")
    (tmp_path / PODS_FILE).write_text("\n".join(PODS) + "\n")
    return tmp_path


def test_trace_rows_the_service_refuses_are_refused_and_reported(
    trace_dir: Path, tmp_path: Path
) -> None:
    scenario = scenario_from(trace_scenario_data(), trace_dir=trace_dir)
    out = tmp_path / "out"
    text = run_and_write(scenario, out, plots=False)
    with (out / "jobs.csv").open() as handle:
        rows = {row["uid"]: row for row in csv.DictReader(handle)}
    assert rows["pod-ok"]["state"] == "done" and rows["pod-ok"]["refusal"] == ""
    refused = {uid: row for uid, row in rows.items() if row["state"] == "refused"}
    assert sorted(refused) == ["pod-100-gpus", "pod-neg-cpu", "pod-too-big"]
    assert refused["pod-neg-cpu"]["refusal"].startswith("cpu_millicores_per_pod: ")
    assert refused["pod-100-gpus"]["refusal"].startswith("gpus_per_pod: ")
    assert refused["pod-too-big"]["refusal"].startswith("never fits pool 'default'")
    assert all(row["wait_s"] == "" and row["first_start_s"] == "" for row in refused.values())
    summary = json.loads((out / "summary.json").read_text())
    assert summary["refused"]["jobs"] == 3
    assert sum(summary["refused"]["reasons"].values()) == 3
    queues = {q["queue"]: q for q in summary["queues"]}
    assert (queues["online"]["jobs_refused"], queues["batch"]["jobs_refused"]) == (1, 2)
    # Refused jobs never wait: not submitted, not waiting at the end, no wait counted.
    assert queues["online"]["jobs_submitted"] == 1 and queues["online"]["jobs_waiting_at_end"] == 0
    assert queues["batch"]["jobs_submitted"] == 0 and queues["batch"]["wait_max_s"] is None
    assert "3 jobs refused at submit" in text


def test_every_job_is_checked_at_its_arrival() -> None:
    """A job that reaches the run without the loader's checks (a scenario built in code) is
    refused at its arrival as well, with the server's reason."""
    data = {
        "name": "built",
        "duration_s": "1h",
        "cluster": unit_cluster([("n1", 8)], [{"name": "team"}]),
        "workloads": [{"queue": "team", "duration_s": "10m"}],
    }
    scenario = scenario_from(data)
    huge = Workload("huge", "team", "default", pods=2, gpus_per_pod=8.0, submit_time_s=60.0)
    scenario = dataclasses.replace(scenario, jobs=(*scenario.jobs, JobSpec(huge, 600.0)))
    result = simulate(scenario)
    assert [j.workload.uid for j in result.jobs] == ["team-0"]
    ((spec, reason),) = [(r.spec, r.reason) for r in result.refused]
    assert spec.workload.uid == "huge" and reason.startswith("never fits pool 'default'")


def test_a_workload_that_never_fits_is_a_problem_with_its_line() -> None:
    text = scenario_text(
        """\
        workloads:
          - {queue: team, duration_s: 1h, pods: 1, gpus_per_pod: 8}
          - {queue: team, duration_s: 1h, pods: 2, gpus_per_pod: 8}
        """
    )
    ((line, path, message),) = problems(text)
    assert (line, path) == (18, "workloads[1]")
    assert message.startswith("never fits pool 'default'")


def test_a_generator_that_may_draw_a_job_the_service_refuses_is_a_problem() -> None:
    text = scenario_text(
        """\
        generators:
          - {queue: team, rate_per_h: 1, duration_s: 1h, pods: {choice: [1, 3]}, gpus_per_pod: 4}
          - {queue: team, backlog: 1, duration_s: 1h, cpu_millicores_per_pod: 2000000000}
          - {queue: team, backlog: 1, duration_s: 1h, name: "two words"}
        """
    )
    found = problems(text)
    assert [(line, path) for line, path, _ in found] == [
        (17, "generators[0]"),
        (18, "generators[1].cpu_millicores_per_pod"),
        (19, "generators[2].name"),
    ]
    assert found[0][2].startswith("a job of 3 pods of 4 GPUs: never fits pool 'default'")


def test_a_generator_whose_every_draw_fits_loads() -> None:
    text = scenario_text(
        """\
        generators:
          - {queue: team, rate_per_h: 1, duration_s: 1h, pods: {choice: [1, 2]}, gpus_per_pod: 4}
        """
    )
    assert len(parse_scenario(text).generators) == 1
