"""How far back retention keeps one pool's rollups, runs and capacity history (pure).

Each pool has a horizon of its own: its rows go at the configured age unless something still
reads them, and only what reads that pool's rows holds them. Readers are the pool's usage window
(the recompute's decayed usage: the buckets inside the window, the runs at its edges) and the
current period of every budget on the pool, or on all pools (`report.budget_status_at`: usage
since its UTC day, ISO week or month began). A pool whose window is all history reads back as far
as its half-life leaves a weight a double can tell from zero (`NEGLIGIBLE_HALF_LIVES`); without a
half-life all history counts alike, and none of that pool's rows go. A pool no longer configured
has no window: only the configured age and the budgets that name it, or all pools, hold its rows.

The horizon is on the hour: the buckets kept are whole ones, and every run they are made of ends
after it.

What the readers read is taken at any instant in the hour before retention's `now`
(`READER_LAG_S`), not at `now` alone: a recompute acting a little earlier (a replica whose clock
is behind, a recompute whose tick began before retention's, a report's transaction opened before)
reads from the window's start and the budgets' period starts of its own instant. Across a
boundary of a tumbling window or of a budget's period that is the whole period that just ended;
held only from the new boundary, retention at a period longer than it deleted most of what that
reader still counts, and it counted only the rest. Retention runs just after UTC midnight, where
budget periods begin. The starts only move forward with time, so the instant an hour back reads
the earliest; a sliding window keeps an hour more, a period that just ended stays until the next
run.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from gpufair.domain.model import FairSharePolicy, WindowKind
from gpufair.domain.rollup import floor_hour
from gpufair.domain.usage import window_bounds

# An all-history window with a half-life h weighs usage older than this many h by less than
# 2^-53 of the newest, below what a double adds to a sum: deleting it changes no fair share.
NEGLIGIBLE_HALF_LIVES = 53
DAY_S = 86400.0
# How much earlier than retention a reader of a pool's rows may act and still read all it reads.
READER_LAG_S = 3600.0


@dataclass(frozen=True, slots=True)
class Horizon:
    kept_from_s: float  # the pool's rows before it go; -inf: none go
    held_by: tuple[str, ...]  # what holds it before the configured age ("its usage window")


def window_reads_from(policy: FairSharePolicy, now_s: float) -> tuple[float, str]:
    """The earliest instant a pool's usage window reads at `now_s`, and what to call that."""
    lo_s = window_bounds(now_s, policy)[0]
    what = "its usage window"
    if policy.window_kind == WindowKind.NONE and policy.half_life_s:
        lo_s = now_s - NEGLIGIBLE_HALF_LIVES * policy.half_life_s
        what += (
            f", all history, halved each {duration_text(policy.half_life_s)} "
            f"({NEGLIGIBLE_HALF_LIVES} half-lives)"
        )
    elif policy.window_kind == WindowKind.NONE:
        what += ", all history without decay"
    return lo_s, what


def horizon(configured_s: float, needs: Iterable[tuple[float, str]]) -> Horizon:
    """The configured cut-off `configured_s` on the hour, held back to the earliest need before
    that hour; on the hour. `needs` are (earliest instant read, what reads it). A need within
    the cut-off's hour moves nothing and holds nothing (no warning)."""
    cut_s = floor_hour(configured_s) if math.isfinite(configured_s) else configured_s
    held = sorted((lo_s, what) for lo_s, what in needs if lo_s < cut_s)
    kept_from_s = min([cut_s] + [lo_s for lo_s, _ in held])
    if math.isfinite(kept_from_s):
        kept_from_s = floor_hour(kept_from_s)
    return Horizon(kept_from_s, tuple(what for _, what in held))


def duration_text(seconds: float) -> str:
    return f"{seconds / DAY_S:g} d" if seconds >= DAY_S else f"{seconds / 3600:g} h"
