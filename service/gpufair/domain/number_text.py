"""Numbers in messages for people, one precision throughout."""

from __future__ import annotations


def number_text(value: float) -> str:
    """A number in a message as the command line prints numbers (`render.fmt_number`): whole
    ones bare (60, not 60.0), others to at most three decimals, so `gpufair explain` shows one
    precision throughout."""
    if value == int(value) and abs(value) < 1e15:
        return str(int(value))
    if abs(value) < 0.001:
        return f"{value:.3g}"
    return f"{value:.3f}".rstrip("0").rstrip(".")
