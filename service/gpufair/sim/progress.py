"""A progress bar for long simulations: plain text on stderr when it is a terminal, else silent."""

from __future__ import annotations

import sys
from typing import TextIO

WIDTH = 30


class ProgressBar:
    """Call with the fraction of simulated time done; `close` ends the line."""

    def __init__(self, label: str, stream: TextIO | None = None) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = self.stream.isatty()
        self.label = label
        self.shown = -1

    def __call__(self, fraction: float) -> None:
        if not self.enabled:
            return
        percent = max(0, min(100, int(fraction * 100)))
        if percent == self.shown:
            return
        self.shown = percent
        done = percent * WIDTH // 100
        bar = "#" * done + "-" * (WIDTH - done)
        self.stream.write(f"\r{self.label} [{bar}] {percent:3d}%")
        self.stream.flush()

    def close(self) -> None:
        if self.enabled and self.shown >= 0:
            self.stream.write("\n")
            self.stream.flush()
