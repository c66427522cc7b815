"""A queue's simulated allocation over time: the step function a(t) (CU held by the queue), kept
as the simulation moves as `changes`: every (instant, new value) from (0, 0) on, consecutive
values always different — the whole run, for metrics and plots. (The decayed usage the
fair-share engine reads is kept apart, as it happens: `running_usage.PoolUsage`.)

Several changes at one instant (a job ends, another starts) leave at most one change there, so
zero-length stretches never exist, and a value that returns within the instant to what it was
leaves no trace at all.
"""

from __future__ import annotations


class QueueHistory:
    __slots__ = ("changes",)

    def __init__(self) -> None:
        self.changes: list[tuple[float, float]] = [(0.0, 0.0)]

    @property
    def value(self) -> float:
        return self.changes[-1][1]

    def set(self, now_s: float, value: float) -> None:
        """From `now_s` on (never before the last change) the queue holds `value` CU."""
        changes = self.changes
        last_s, last_value = changes[-1]
        if now_s > last_s:
            if value != last_value:
                changes.append((now_s, value))
            return
        # A second change at the same instant revises the first.
        if len(changes) > 1 and changes[-2][1] == value:
            changes.pop()
        else:
            changes[-1] = (now_s, value)
