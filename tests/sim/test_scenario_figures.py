"""The example scenarios' figures in README.md and examples/scenarios/README.md are the ones the
scenarios give today (`gpufair.sim.figures`): the READMEs' blocks are what the stored figures
render to, and a short run of each scenario (its first two days, both policies) still gives the
stored short-run figures. When behaviour changes, `scripts/scenario_figures.py` regenerates them.
"""

from __future__ import annotations

import json

import pytest
from sim_support import EXAMPLES, REPOSITORY

from gpufair.sim.figures import block, render, scenario_figures
from gpufair.sim.scenario import load_scenario
from gpufair.sim.source_lines import ScenarioError

FIGURES = json.loads((EXAMPLES / "figures.json").read_text())
NAMES = sorted(path.stem for path in EXAMPLES.glob("*.yaml"))


def test_every_example_scenario_has_figures() -> None:
    assert sorted(FIGURES) == NAMES


@pytest.mark.parametrize("readme", ["README.md", "examples/scenarios/README.md"])
def test_the_readme_shows_the_stored_figures(readme: str) -> None:
    assert block((REPOSITORY / readme).read_text()) == render(FIGURES), (
        "run scripts/scenario_figures.py --check"
    )


@pytest.mark.parametrize("name", NAMES)
def test_a_short_run_gives_the_stored_figures(name: str) -> None:
    try:
        scenario = load_scenario(EXAMPLES / f"{name}.yaml")
    except ScenarioError as exc:
        pytest.skip(f"cannot load here (the trace folder?): {exc}")
    fresh = scenario_figures(scenario, short_only=True)
    for label, found in fresh.items():
        assert found["short"] == FIGURES[name][label]["short"], (
            f"{name} {label}: behaviour changed; run scripts/scenario_figures.py"
        )
