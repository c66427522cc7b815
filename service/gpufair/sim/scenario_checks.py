"""Checks of a scenario's settings against its span (`duration_s`), each giving the message of a
problem or None; `scenario._Builder` attaches the field path and line.

A run steps through every instant of its clocks, even those at which nothing happens: the cycle
every `cycle_s`, the fair-share recompute every `recompute_s` (or each pool's
`policy.recompute_interval_s`) and the timeline sample every `timeline_s`. An idle step costs
about 20 µs, a cycle that decides something milliseconds, and each sample adds a timeline row per
queue, so a step too small for the span would leave the run going for days. A run takes at most
`MAX_STEPS` cycles and as many recomputes (a year at 60 s is 525,600), and `MAX_SAMPLES`
timeline samples (a year at the default 600 s is 52,560).
"""

from __future__ import annotations

MAX_STEPS = 1_000_000  # cycles, and recomputes, of one run
MAX_SAMPLES = 100_000  # timeline samples of one run


def too_many_steps(
    field: str, step_s: float, duration_s: float, what: str, bound: int
) -> str | None:
    """Why stepping `duration_s` by `step_s` (the value of `field`) is too much, or None."""
    least_s = duration_s / bound
    if step_s >= least_s:
        return None
    return (
        f"{field} {step_s:g} s over duration_s {duration_s:g} s makes {duration_s / step_s:.3g} "
        f"{what}; a run takes at most {bound:,}: make {field} at least {least_s:g} s or "
        "duration_s shorter"
    )


def generator_idle(start_s: float, stop_s: float | None, duration_s: float) -> str | None:
    """Why a generator starting at `start_s` would make no job, or None: it stops at or before
    its start (no arrival at or after `stop_s`), or the run ends first (`duration_s`, inf when
    unknown)."""
    if stop_s is not None and start_s >= stop_s:
        return f"{start_s:g} s is not before stop_s ({stop_s:g} s): the generator makes no jobs"
    if start_s >= duration_s:
        return (
            f"{start_s:g} s is not before the end of the run (duration_s {duration_s:g} s): "
            "the generator makes no jobs"
        )
    return None
