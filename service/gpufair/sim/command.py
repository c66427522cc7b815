"""`gpufair simulate SCENARIO.yaml --out DIR [--compare] [--seed N] [--trace-dir DIR]`.

`add_simulate_command(subparsers)` adds the command to the `gpufair` parser (cli.py calls it).
A run writes into DIR what `outputs` and `plots` describe and prints the summary table. With
`--compare`, each policy's files go to DIR/classic and DIR/time-based, and DIR gets the overlaid
plots, one summary table of both (summary.txt) and a summary.json holding both runs.

Exit codes: 0 done, 2 a scenario that cannot be simulated (every problem printed with its line).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

from gpufair.sim.compare import VARIANTS
from gpufair.sim.engine import SimResult, simulate
from gpufair.sim.metrics import RunMetrics, compute_metrics
from gpufair.sim.outputs import run_summary, summary_table, write_json, write_run
from gpufair.sim.plots import plot_all
from gpufair.sim.progress import ProgressBar
from gpufair.sim.scenario import TRACE_DIR_ENV, Scenario, load_scenario
from gpufair.sim.source_lines import ScenarioError


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


def cmd_simulate(args: argparse.Namespace) -> int:
    try:
        scenario = load_scenario(args.scenario, seed=args.seed, trace_dir=args.trace_dir)
    except ScenarioError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    text = run_and_write(scenario, args.out, compare=args.compare, plots=not args.no_plots)
    print(text, end="")
    print(f"outputs in {args.out}")
    return 0


def run_and_write(
    scenario: Scenario,
    out_dir: Path,
    *,
    compare: bool = False,
    plots: bool = True,
    progress_stream: TextIO | None = None,
) -> str:
    """Simulate, write every output file, and return the summary table."""
    variants = VARIANTS if compare else (("", lambda s: s),)
    runs: list[tuple[str, SimResult, RunMetrics]] = []
    for label, variant in variants:
        bar = ProgressBar(f"{scenario.name} {label}".rstrip(), progress_stream)
        try:
            result = simulate(variant(scenario), bar)
        finally:
            bar.close()
        metrics = compute_metrics(result)
        runs.append((label, result, metrics))
        run_dir = out_dir / label if compare else out_dir
        write_run(result, metrics, run_dir)
        if plots and compare:
            plot_all([(label, result)], run_dir)
    text = _header(scenario) + summary_table([(label, m) for label, _, m in runs])
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "summary.txt").write_text(text)
    if compare:
        both = {label: run_summary(result, metrics) for label, result, metrics in runs}
        write_json({"compare": both}, out_dir / "summary.json")
    if plots:
        plot_all(_overlay_order(runs), out_dir)
    return text


def _overlay_order(
    runs: Sequence[tuple[str, SimResult, RunMetrics]],
) -> list[tuple[str, SimResult]]:
    """Time-based first (solid lines), classic after (dashed)."""
    return [(label, result) for label, result, _ in reversed(runs)]


def _header(scenario: Scenario) -> str:
    days = scenario.duration_s / 86_400.0
    lines = [f"scenario {scenario.name}: {days:g} days simulated, seed {scenario.seed}"]
    lines += [f"  {note}" for note in scenario.notes]
    return "\n".join(lines) + "\n\n"
