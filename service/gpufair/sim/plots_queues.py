"""Per-queue plots, one small panel per leaf queue (a grid when there are many), so each team's
story reads on its own:

- `queues.png`: the queue's allocation (exact steps) beside its pending work and its fair share,
  the pool's capacity as a ceiling, and its evictions marked at the bottom (reclaim ▼, preempt ✕,
  gang entitlement ◆, from `events.csv`); a run's own binds beyond the share show as the
  allocation rising above the fair-share line.
- `usage_share.png`: U' (the queue's decayed usage over the capacity it competed for) against W'
  (its normalised weight), both as fractions: time-based fair share pushes U' towards W'.

Overlaid runs (`--compare`) keep one line style per run, as `plots` does; when the runs' decisions
coincide exactly (same allocation history), the figure says so, since one line hides the other.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from gpufair.sim.engine import SimResult

_STYLES = ("-", "--", ":", "-.")
_DAY_S = 86_400.0
_MARKERS = {"reclaim": "v", "preempt": "x", "entitlement": "D"}


def runs_coincide(runs: Sequence[tuple[str, SimResult]]) -> bool:
    """Whether every run allocated exactly the same over time (so overlaid lines hide each
    other)."""
    if len(runs) < 2:
        return False
    first = runs[0][1]
    return all(
        [[q.changes for q in p.queues] for p in result.pools]
        == [[q.changes for q in p.queues] for p in first.pools]
        for _, result in runs[1:]
    )


def coincide_note(runs: Sequence[tuple[str, SimResult]]) -> str | None:
    if not runs_coincide(runs):
        return None
    labels = " and ".join(label for label, _ in runs)
    return f"{labels} coincide: identical allocations, one line hides the other"


def _unit(duration_s: float) -> tuple[float, str]:
    return (_DAY_S, "days") if duration_s > 3 * _DAY_S else (3600.0, "hours")


def _leaves(result: SimResult) -> list[tuple[str, str]]:
    return [(p.name, q.name) for p in result.pools for q in p.queues if q.is_leaf]


def _grid(count: int) -> tuple[Figure, list[Axes]]:
    columns = 1 if count <= 3 else 2 if count <= 8 else 3
    rows = math.ceil(count / columns)
    figure = Figure(figsize=(5.5 * columns, 2.6 * rows + 0.9), layout="constrained")
    FigureCanvasAgg(figure)
    grid = figure.subplots(rows, columns, squeeze=False)
    axes = [axis for row in grid for axis in row]
    for spare in axes[count:]:
        spare.set_visible(False)
    return figure, axes[:count]


def _save(figure: Figure, path: Path, runs: Sequence[tuple[str, SimResult]]) -> None:
    note = coincide_note(runs)
    if note is not None:
        figure.suptitle(note, fontsize="medium", color="firebrick")
    figure.savefig(path, dpi=100, metadata={"Software": None})


def plot_queues(runs: Sequence[tuple[str, SimResult]], path: Path) -> None:
    first = runs[0][1]
    unit_s, unit = _unit(first.scenario.duration_s)
    end = first.scenario.duration_s / unit_s
    leaves = _leaves(first)
    figure, axes = _grid(len(leaves))
    capacity = {p.name: p.capacity_cu for p in first.pools}
    for panel, (pool, queue) in zip(axes, leaves, strict=True):
        for style, (label, result) in zip(_STYLES, runs, strict=False):
            suffix = "" if len(runs) == 1 else f" ({label})"
            run_pool = next(p for p in result.pools if p.name == pool)
            changes = next(q.changes for q in run_pool.queues if q.name == queue)
            times = [t / unit_s for t, _ in changes] + [end]
            values = [v for _, v in changes] + [changes[-1][1] if changes else 0.0]
            panel.plot(
                times, values, drawstyle="steps-post", linestyle=style, color="C0",
                label=f"allocated{suffix}", linewidth=1.2,
            )  # fmt: skip
            rows = [r for r in result.timeline if r.pool == pool and r.queue == queue]
            samples = [r.time_s / unit_s for r in rows]
            panel.plot(
                samples, [r.fair_share_cu for r in rows], drawstyle="steps-post",
                linestyle=style, color="C2", label=f"fair share{suffix}", linewidth=1.0,
            )  # fmt: skip
            panel.plot(
                samples, [r.pending_cu for r in rows], drawstyle="steps-post", linestyle=style,
                color="C1", alpha=0.7, label=f"pending{suffix}", linewidth=1.0,
            )  # fmt: skip
            for reason, marker in _MARKERS.items():
                at = [
                    d.time_s / unit_s
                    for d in result.decisions
                    if d.event == "evict" and d.pool == pool and d.queue == queue
                    and d.reason == reason
                ]  # fmt: skip
                if at:
                    panel.plot(
                        at, [0.0] * len(at), linestyle="none", marker=marker, color="C3",
                        markersize=5, alpha=0.6, label=f"evicted: {reason}{suffix}",
                    )  # fmt: skip
        panel.axhline(capacity[pool], color="grey", linewidth=0.8, linestyle=":")
        where = queue if len(first.pools) == 1 else f"{pool}/{queue}"
        panel.set_title(f"{where} (pool capacity {capacity[pool]:g} CU, dotted)", fontsize="medium")
        panel.set_xlabel(unit)
        panel.set_ylabel("CU")
        panel.legend(loc="upper right", fontsize="x-small")
        panel.grid(alpha=0.3)
    _save(figure, path, runs)


def plot_usage_share(runs: Sequence[tuple[str, SimResult]], path: Path) -> None:
    first = runs[0][1]
    unit_s, unit = _unit(first.scenario.duration_s)
    leaves = _leaves(first)
    figure, axes = _grid(len(leaves))
    for panel, (pool, queue) in zip(axes, leaves, strict=True):
        for style, (label, result) in zip(_STYLES, runs, strict=False):
            suffix = "" if len(runs) == 1 else f" ({label})"
            rows = [r for r in result.timeline if r.pool == pool and r.queue == queue]
            samples = [r.time_s / unit_s for r in rows]
            panel.plot(
                samples, [r.usage_share for r in rows], linestyle=style, color="C0",
                label=f"U' (usage share){suffix}", linewidth=1.2,
            )  # fmt: skip
            panel.plot(
                samples, [r.weight_share for r in rows], drawstyle="steps-post",
                linestyle=style, color="C2", label=f"W' (weight share){suffix}", linewidth=1.0,
            )  # fmt: skip
        where = queue if len(first.pools) == 1 else f"{pool}/{queue}"
        panel.set_title(f"{where}: U' against W'", fontsize="medium")
        panel.set_xlabel(unit)
        panel.set_ylabel("fraction")
        panel.set_ylim(0.0, 1.02)
        panel.legend(loc="upper right", fontsize="x-small")
        panel.grid(alpha=0.3)
    _save(figure, path, runs)


def plot_queue_panels(runs: Sequence[tuple[str, SimResult]], out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    plot_queues(runs, out_dir / "queues.png")
    plot_usage_share(runs, out_dir / "usage_share.png")
