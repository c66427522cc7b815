"""`gpufair simulate SCENARIO.yaml --out DIR [--compare] [--seed N] [--trace-dir DIR]`.

`add_simulate_command(subparsers)` adds the command to the `gpufair` parser (cli/main.py calls it).
A run writes into DIR what `outputs` and `plots` describe and prints the summary table. With
`--compare`, each policy's files go to DIR/classic and DIR/time-based, and DIR gets the overlaid
plots, one summary table of both (summary.txt) and a summary.json holding both runs.

Exit codes: 0 done, 2 a scenario that cannot be simulated (every problem printed with its line).
Importing this module is cheap; the simulator loads when the command runs.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from gpufair.sim.trace import TRACE_DIR_ENV


def add_simulate_command(subparsers: Any) -> argparse.ArgumentParser:
    """Add `simulate` to an `argparse` sub-command group (`parser.add_subparsers()`)."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "simulate",
        help="try a fair-share policy on a scenario: CSV, plots and a summary",
        description="Run a scenario through the scheduler's own domain code on a virtual clock.",
    )
    parser.add_argument("scenario", type=Path, help="scenario YAML (see examples/scenarios)")
    parser.add_argument("--out", type=Path, required=True, help="folder for the outputs")
    parser.add_argument(
        "--compare",
        action="store_true",
        help="run classic (k = 0) and time-based fair share side by side",
    )
    parser.add_argument("--seed", type=int, default=None, help="override the scenario's seed")
    parser.add_argument(
        "--trace-dir",
        type=Path,
        default=None,
        help=f"folder of the Alibaba 2023 trace CSVs (default ${TRACE_DIR_ENV}, then the "
        "scenario's trace.dir)",
    )
    parser.add_argument("--no-plots", action="store_true", help="write CSV and JSON only")
    parser.set_defaults(func=cmd_simulate)
    return parser


SIM_EXTRA_HINT = (
    "gpufair simulate draws its plots with matplotlib, which the server's install leaves out: "
    "pip install 'gpufair[sim]' (in a checkout: pip install -e '.[sim]'), or pass --no-plots"
)


def plotting_available() -> bool:
    """Whether matplotlib imports (the plots import it anyway, so trying costs nothing)."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def cmd_simulate(args: argparse.Namespace) -> int:
    if not args.no_plots and not plotting_available():
        print(f"error: {SIM_EXTRA_HINT}", file=sys.stderr)
        return 2
    # Imported here: pydantic, numpy and matplotlib would slow every other `gpufair` command.
    from gpufair.sim.run import run_and_write
    from gpufair.sim.scenario import load_scenario
    from gpufair.sim.source_lines import ScenarioError

    try:
        scenario = load_scenario(args.scenario, seed=args.seed, trace_dir=args.trace_dir)
    except ScenarioError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    text = run_and_write(scenario, args.out, compare=args.compare, plots=not args.no_plots)
    print(text, end="")
    print(f"outputs in {args.out}")
    return 0
