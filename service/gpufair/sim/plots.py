"""PNG plots of one run, or of several overlaid (`--compare`): matplotlib's object API on the Agg
canvas, so no display, no pyplot state and nothing shared between calls.

- `allocation.png`: CU held by each leaf queue over time (exact steps), one panel per pool;
- `fair_share.png`: each leaf queue's fair share over time (at the timeline samples);
- `wait_cdf.png`: the fraction of each queue's jobs that waited at most x hours;
- `queues.png` and `usage_share.png`: one small panel per queue (`plots_queues`).

Overlaid runs keep one colour per queue and one line style per run (the first solid); when
they coincide exactly, the figures say so (`plots_queues.coincide_note`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from gpufair.sim.engine import SimResult
from gpufair.sim.plots_queues import coincide_note, plot_queue_panels

_STYLES = ("-", "--", ":", "-.")
_DAY_S = 86_400.0


def _time_unit(duration_s: float) -> tuple[float, str]:
    return (_DAY_S, "days") if duration_s > 3 * _DAY_S else (3600.0, "hours")


def _colours(result: SimResult) -> dict[tuple[str, str], str]:
    palette = [f"C{i}" for i in range(10)]
    keys = [(p.name, q.name) for p in result.pools for q in p.queues if q.is_leaf]
    return {key: palette[i % len(palette)] for i, key in enumerate(keys)}


def _figure(panels: int) -> tuple[Figure, list[Axes]]:
    figure = Figure(figsize=(10, 3.2 * panels + 0.8), layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.subplots(panels, 1, squeeze=False)
    return figure, [row[0] for row in axes]


def _save(figure: Figure, path: Path) -> None:
    figure.savefig(path, dpi=100, metadata={"Software": None})


def plot_allocation(runs: Sequence[tuple[str, SimResult]], path: Path) -> None:
    first = runs[0][1]
    unit_s, unit = _time_unit(first.scenario.duration_s)
    colours = _colours(first)
    figure, axes = _figure(len(first.pools))
    for panel, pool in zip(axes, first.pools, strict=True):
        for style, (label, result) in zip(_STYLES, runs, strict=False):
            run_pool = next(p for p in result.pools if p.name == pool.name)
            for queue in run_pool.queues:
                if not queue.is_leaf:
                    continue
                times = [t / unit_s for t, _ in queue.changes]
                values = [v for _, v in queue.changes]
                times.append(result.scenario.duration_s / unit_s)
                values.append(values[-1])
                name = queue.name if len(runs) == 1 else f"{queue.name} ({label})"
                panel.plot(
                    times,
                    values,
                    drawstyle="steps-post",
                    linestyle=style,
                    color=colours.get((pool.name, queue.name), "k"),
                    label=name,
                    linewidth=1.2,
                )
        panel.set_title(f"allocation per queue: pool {pool.name} ({pool.capacity_cu:g} CU)")
        note = coincide_note(runs)
        if note is not None:
            panel.text(0.01, 0.97, note, transform=panel.transAxes, va="top", color="firebrick")
        panel.set_xlabel(unit)
        panel.set_ylabel("allocated CU")
        panel.legend(loc="upper right", fontsize="small")
        panel.grid(alpha=0.3)
    _save(figure, path)


def plot_fair_share(runs: Sequence[tuple[str, SimResult]], path: Path) -> None:
    first = runs[0][1]
    unit_s, unit = _time_unit(first.scenario.duration_s)
    colours = _colours(first)
    figure, axes = _figure(len(first.pools))
    for panel, pool in zip(axes, first.pools, strict=True):
        leaves = [q.name for q in pool.queues if q.is_leaf]
        for style, (label, result) in zip(_STYLES, runs, strict=False):
            for queue in leaves:
                rows = [r for r in result.timeline if r.pool == pool.name and r.queue == queue]
                name = queue if len(runs) == 1 else f"{queue} ({label})"
                panel.plot(
                    [r.time_s / unit_s for r in rows],
                    [r.fair_share_cu for r in rows],
                    drawstyle="steps-post",
                    linestyle=style,
                    color=colours.get((pool.name, queue), "k"),
                    label=name,
                    linewidth=1.2,
                )
        panel.set_title(f"fair share per queue: pool {pool.name}")
        panel.set_xlabel(unit)
        panel.set_ylabel("fair share CU")
        panel.legend(loc="upper right", fontsize="small")
        panel.grid(alpha=0.3)
    _save(figure, path)


def plot_wait_cdf(runs: Sequence[tuple[str, SimResult]], path: Path) -> None:
    first = runs[0][1]
    colours = _colours(first)
    figure, axes = _figure(1)
    panel = axes[0]
    for style, (label, result) in zip(_STYLES, runs, strict=False):
        waits: dict[tuple[str, str], list[float]] = {}
        for job in result.jobs:
            key = (job.workload.pool, job.workload.queue)
            waits.setdefault(key, []).append(job.wait_s / 3600.0)
        for key in sorted(waits, key=lambda k: list(colours).index(k) if k in colours else 0):
            values = sorted(waits[key])
            fractions = [(i + 1) / len(values) for i in range(len(values))]
            name = key[1] if len(first.pools) == 1 else f"{key[0]}/{key[1]}"
            if len(runs) > 1:
                name += f" ({label})"
            panel.plot(
                values,
                fractions,
                drawstyle="steps-post",
                linestyle=style,
                color=colours.get(key, "k"),
                label=name,
                linewidth=1.2,
            )
    panel.set_xscale("symlog", linthresh=0.1)
    panel.set_xlim(left=0.0)
    panel.set_ylim(0.0, 1.02)
    panel.set_title("wait time CDF per queue (jobs still waiting count their wait so far)")
    panel.set_xlabel("wait (hours; linear below 0.1 h, logarithmic above)")
    panel.set_ylabel("fraction of jobs")
    panel.legend(loc="lower right", fontsize="small")
    panel.grid(alpha=0.3)
    _save(figure, path)


def plot_all(runs: Sequence[tuple[str, SimResult]], out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    plot_allocation(runs, out_dir / "allocation.png")
    plot_fair_share(runs, out_dir / "fair_share.png")
    plot_wait_cdf(runs, out_dir / "wait_cdf.png")
    plot_queue_panels(runs, out_dir)
