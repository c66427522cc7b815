"""A queue's simulated allocation over time: the step function the usage integrals are taken of.

Two views of one step function a(t) (CU held by the queue), kept as the simulation moves:

- `changes`: every (instant, new value) from (0, 0) on, consecutive values always different —
  the whole run, for metrics and plots;
- `segments`: one `usage.Segment` per closed stretch with a(t) ≠ 0 — what
  `usage.usage_inputs` integrates. The fair-share engine looks back one window only, so `prune`
  drops segments that ended before it (a window of kind `none` keeps them all).

Several changes at one instant (a job ends, another starts) leave at most one change there, so
zero-length stretches never exist, and a value that returns within the instant to what it was
leaves no trace at all.
"""

from __future__ import annotations

from collections import deque

from gpufair.domain.usage import Segment


class QueueHistory:
    __slots__ = ("changes", "segments")

    def __init__(self) -> None:
        self.changes: list[tuple[float, float]] = [(0.0, 0.0)]
        self.segments: deque[Segment] = deque()

    @property
    def value(self) -> float:
        return self.changes[-1][1]

    def set(self, now_s: float, value: float) -> None:
        """From `now_s` on (never before the last change) the queue holds `value` CU."""
        changes = self.changes
        last_s, last_value = changes[-1]
        if now_s > last_s:
            if value == last_value:
                return
            if last_value != 0.0:
                self.segments.append(Segment(last_s, now_s, last_value))
            changes.append((now_s, value))
            return
        # A second change at the same instant revises the first.
        if len(changes) > 1 and changes[-2][1] == value:
            changes.pop()
            if value != 0.0:
                self.segments.pop()  # the stretch before the undone change runs on
        else:
            changes[-1] = (now_s, value)

    def timeline(self, now_s: float) -> list[Segment]:
        """The segments up to `now_s`, the open stretch included."""
        out = list(self.segments)
        since_s, value = self.changes[-1]
        if value != 0.0 and now_s > since_s:
            out.append(Segment(since_s, now_s, value))
        return out

    def prune(self, before_s: float) -> None:
        """Drop segments that ended at or before `before_s` (outside every later window)."""
        segments = self.segments
        while segments and segments[0].end_s <= before_s:
            segments.popleft()
