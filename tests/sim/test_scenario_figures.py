"""The example scenarios' figures in README.md and examples/scenarios/README.md are the ones the
scenarios give today (`gpufair.sim.figures`): the READMEs' blocks are what the stored figures
render to, and a short run of each scenario (its first two days, both policies) still gives the
stored short-run figures. When behaviour changes, `scripts/scenario_figures.py` regenerates them.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from sim_support import EXAMPLES, REPOSITORY, example_data

from gpufair.sim.figures import block, render, scenario_figures
from gpufair.sim.scenario import load_scenario
from gpufair.sim.trace import NODES_FILE, PODS_FILE, TRACE_DIR_ENV

FIGURES = json.loads((EXAMPLES / "figures.json").read_text())
NAMES = sorted(path.stem for path in EXAMPLES.glob("*.yaml"))


def test_every_example_scenario_has_figures() -> None:
    assert sorted(FIGURES) == NAMES


@pytest.mark.parametrize("readme", ["README.md", "examples/scenarios/README.md"])
def test_the_readme_shows_the_stored_figures(readme: str) -> None:
    assert block((REPOSITORY / readme).read_text()) == render(FIGURES), (
        "run scripts/scenario_figures.py --check"
    )


def absent_trace_files(name: str) -> list[Path]:
    """The trace files a scenario replays that are not here, found as the scenario finds them:
    in $GPUFAIR_TRACE_DIR if set, else in its `trace.dir` (relative to the current directory).
    The traces are not part of the repository; a scenario without a trace needs none."""
    trace = example_data(name).get("trace")
    if trace is None:
        return []
    folder = os.environ.get(TRACE_DIR_ENV) or trace.get("dir")
    assert folder, f"{name}: its trace has no folder"
    files = [trace.get("nodes_file", NODES_FILE), trace.get("pods_file", PODS_FILE)]
    return [Path(folder) / file for file in files if not (Path(folder) / file).is_file()]


@pytest.mark.parametrize("name", NAMES)
def test_a_short_run_gives_the_stored_figures(name: str) -> None:
    absent = absent_trace_files(name)
    if absent:
        pytest.skip(f"the trace it replays is not here: {', '.join(map(str, absent))}")
    scenario = load_scenario(EXAMPLES / f"{name}.yaml")  # any other problem fails
    fresh = scenario_figures(scenario, short_only=True)
    for label, found in fresh.items():
        assert found["short"] == FIGURES[name][label]["short"], (
            f"{name} {label}: behaviour changed; run scripts/scenario_figures.py"
        )
