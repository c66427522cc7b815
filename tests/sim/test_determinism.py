"""The same scenario and seed give byte-identical CSV files; another seed other jobs."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from sim_support import example_data, scenario_from

from gpufair.sim.run import run_and_write
from gpufair.sim.scenario import Scenario


def small_scenario(seed: int | None = None) -> Scenario:
    """The heterogeneous three-team example, for 12 hours: generators, types, evictions."""
    scenario = scenario_from(example_data("three-teams-heterogeneous"), seed=seed)
    return dataclasses.replace(scenario, duration_s=12 * 3600.0, timeline_s=1800.0)


def outputs(scenario: Scenario, out_dir: Path) -> dict[str, bytes]:
    run_and_write(scenario, out_dir, plots=False)
    return {name: (out_dir / name).read_bytes() for name in ("timeline.csv", "jobs.csv")}


def test_same_scenario_and_seed_give_byte_identical_csv_outputs(tmp_path: Path) -> None:
    first = outputs(small_scenario(), tmp_path / "first")
    second = outputs(small_scenario(), tmp_path / "second")
    assert first == second
    assert first["jobs.csv"].count(b"\n") > 100
    summary = (tmp_path / "first" / "summary.json").read_bytes()
    assert summary == (tmp_path / "second" / "summary.json").read_bytes()


def test_another_seed_draws_other_jobs(tmp_path: Path) -> None:
    first = outputs(small_scenario(), tmp_path / "first")
    other = outputs(small_scenario(seed=99), tmp_path / "other")
    assert first["jobs.csv"] != other["jobs.csv"]
