"""One `gpufair simulate` run, or a comparison, from a loaded scenario to the files on disk.

A run writes into DIR what `outputs` and `plots` describe and returns the summary table. With
`compare`, each policy's files go to DIR/classic and DIR/time-based (each with its own
summary.txt), and DIR gets the overlaid plots, one summary table of both (summary.txt) and a
summary.json holding both runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

from gpufair.sim.admission import refused_line
from gpufair.sim.compare import VARIANTS
from gpufair.sim.engine import SimResult, simulate
from gpufair.sim.fairness import fairness_table, wait_fairness
from gpufair.sim.metrics import RunMetrics, compute_metrics
from gpufair.sim.outputs import run_summary, summary_table, write_json, write_run
from gpufair.sim.progress import ProgressBar
from gpufair.sim.scenario import Scenario


def run_and_write(
    scenario: Scenario,
    out_dir: Path,
    *,
    compare: bool = False,
    plots: bool = True,
    progress_stream: TextIO | None = None,
) -> str:
    """Simulate, write every output file, and return the summary table. Plots need matplotlib
    (the `sim` extra); without plots the simulator needs nothing beyond the server's install."""
    if plots:
        from gpufair.sim.plots import plot_all
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
        if compare:  # each run's folder stands on its own
            own = _header(scenario) + summary_table([(label, metrics)])
            own += _refused([(label, result)])
            (run_dir / "summary.txt").write_text(own)
        if plots and compare:
            plot_all([(label, result)], run_dir)
    text = _header(scenario) + summary_table([(label, m) for label, _, m in runs])
    text += _refused([(label, result) for label, result, _ in runs])
    text += (
        "\n" + fairness_table([(label, wait_fairness(result)) for label, result, _ in runs]) + "\n"
    )
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


def _refused(runs: Sequence[tuple[str, SimResult]]) -> str:
    """A line per run with jobs refused at submit (`admission`), after the tables."""
    lines = [refused_line(result.refused, label) for label, result in runs]
    shown = [line for line in lines if line]
    return "".join(f"\n{line}\n" for line in shown)


def _header(scenario: Scenario) -> str:
    days = scenario.duration_s / 86_400.0
    lines = [f"scenario {scenario.name}: {days:g} days simulated, seed {scenario.seed}"]
    lines += [f"  {note}" for note in scenario.notes]
    return "\n".join(lines) + "\n\n"
