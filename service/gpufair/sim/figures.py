"""The documentation's figures of the example scenarios, as data and as the Markdown the READMEs
show, so that the numbers in the docs are the numbers the scenarios give today.

`scripts/scenario_figures.py` runs every example scenario with classic (k = 0) and time-based fair
share (`compare.VARIANTS`), stores the figures in `examples/scenarios/figures.json` and rewrites
the blocks between `<!-- figures:begin -->` and `<!-- figures:end -->` in README.md and
examples/scenarios/README.md from them. Each scenario's entry also holds the figures of a short
run (the first `SHORT_S` of it, same settings): `tests/sim/test_scenario_figures.py` reruns those
quickly and checks the READMEs' blocks against the stored figures, so a change of behaviour makes
the test fail until the script is run again.

Per run: each leaf queue's over-quota share (%) and jobs still waiting at the end, and the pool's
worst per-queue P99 wait (hours), evictions per 1,000 GPU-hours and Jain's index of the top level
(one pool per example scenario; a scenario with more shows its first).
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from gpufair.sim.compare import VARIANTS
from gpufair.sim.engine import simulate
from gpufair.sim.metrics import compute_metrics
from gpufair.sim.scenario import Scenario

SHORT_S = 2 * 86_400.0
BEGIN = "<!-- figures:begin -->"
END = "<!-- figures:end -->"


def run_figures(scenario: Scenario) -> dict[str, Any]:
    """The figures of one run of `scenario` as written."""
    metrics = compute_metrics(simulate(scenario))
    pool = metrics.pools[0]
    leaves = [q for q in metrics.queues if q.pool == pool.pool and q.is_leaf and q.competed]
    p99s = [q.wait_p99_s for q in leaves if q.wait_p99_s is not None]
    jain = pool.jain_index.get("")
    return {
        "over_quota_share_pct": {
            q.queue: round(100.0 * q.over_quota_share, 1)
            for q in leaves
            if q.over_quota_share is not None
        },
        "waiting_at_end": {q.queue: q.jobs_waiting_at_end for q in leaves},
        "worst_p99_wait_h": round(max(p99s) / 3600.0, 1) if p99s else None,
        "evictions_per_1000_gpu_h": round(10.0 * pool.evictions_per_100_gpu_hours, 2),
        "jain": None if jain is None else round(jain, 3),
    }


def shortened(scenario: Scenario) -> Scenario:
    return dataclasses.replace(scenario, duration_s=min(scenario.duration_s, SHORT_S))


def scenario_figures(scenario: Scenario, *, short_only: bool = False) -> dict[str, Any]:
    """Per policy (`classic`, `time-based`): the full run's figures and the short run's."""
    entry: dict[str, Any] = {}
    for label, variant in VARIANTS:
        changed = variant(scenario)
        found = {"short": run_figures(shortened(changed))}
        if not short_only:
            found["full"] = run_figures(changed)
        entry[label] = found
    return entry


def _queues(values: dict[str, Any]) -> str:
    return ", ".join(f"{name} {value}" for name, value in values.items()) or "-"


def render(figures: dict[str, Any]) -> str:
    """The Markdown table of every scenario's full-run figures, in name order."""
    lines = [
        "| scenario | policy | over-quota share % | jobs still waiting at the end "
        "| worst P99 wait h | evictions / 1,000 GPU-h | Jain |",
        "|---|---|---|---|---|---|---|",
    ]
    for name in sorted(figures):
        for label, _ in VARIANTS:
            full = figures[name][label]["full"]
            jain = full["jain"]
            p99 = full["worst_p99_wait_h"]
            lines.append(
                f"| `{name}` | {label} | {_queues(full['over_quota_share_pct'])} "
                f"| {_queues(full['waiting_at_end'])} | {'-' if p99 is None else p99} "
                f"| {full['evictions_per_1000_gpu_h']} | {'-' if jain is None else jain} |"
            )
    return "\n".join(lines) + "\n"


_BLOCK = re.compile(re.escape(BEGIN) + r"\n.*?" + re.escape(END), re.DOTALL)


def block(text: str) -> str | None:
    """The generated table between the markers of `text`, or None without markers."""
    found = _BLOCK.search(text)
    if found is None:
        return None
    return found.group(0)[len(BEGIN) + 1 : -len(END)]


def with_block(text: str, table: str) -> str:
    """`text` with the marked block replaced by `table`."""
    if _BLOCK.search(text) is None:
        raise ValueError(f"no {BEGIN} ... {END} block")
    return _BLOCK.sub(lambda _: f"{BEGIN}\n{table}{END}", text, count=1)
