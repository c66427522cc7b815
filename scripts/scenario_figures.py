"""Regenerate the example scenarios' figures in the docs (`gpufair.sim.figures`).

    .venv/bin/python scripts/scenario_figures.py [--only NAME ...] [--trace-dir DIR]
    .venv/bin/python scripts/scenario_figures.py --check

Runs every example scenario (or the named ones) with classic and time-based fair share, full and
short, writes examples/scenarios/figures.json and the figures blocks of README.md and
examples/scenarios/README.md. The trace replay needs the trace folder (--trace-dir, else
$GPUFAIR_TRACE_DIR, else the scenario's own `dir`); without it the scenario keeps its stored
figures. `--check` only compares the READMEs' blocks with figures.json (exit 1 if they differ).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from gpufair.sim.figures import block, render, scenario_figures, with_block
from gpufair.sim.scenario import load_scenario
from gpufair.sim.source_lines import ScenarioError

REPOSITORY = Path(__file__).resolve().parents[1]
SCENARIOS = REPOSITORY / "examples" / "scenarios"
FIGURES = SCENARIOS / "figures.json"
READMES = (REPOSITORY / "README.md", SCENARIOS / "README.md")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="*", default=None)
    parser.add_argument("--trace-dir", type=Path, default=None)
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args()
    figures = json.loads(FIGURES.read_text()) if FIGURES.exists() else {}
    if not args.check:
        for path in sorted(SCENARIOS.glob("*.yaml")):
            if args.only and path.stem not in args.only:
                continue
            try:
                scenario = load_scenario(path, trace_dir=args.trace_dir)
            except ScenarioError as exc:
                print(f"{path.stem}: kept as stored ({exc})", file=sys.stderr)
                continue
            print(f"{path.stem} ...", file=sys.stderr, flush=True)
            figures[path.stem] = scenario_figures(scenario)
        FIGURES.write_text(json.dumps(figures, indent=1, sort_keys=True) + "\n")
    table = render(figures)
    stale = []
    for readme in READMES:
        text = readme.read_text()
        if args.check:
            if block(text) != table:
                stale.append(readme.name)
        else:
            readme.write_text(with_block(text, table))
    if stale:
        print(f"figures out of date in {', '.join(stale)}: run {Path(__file__).name}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
