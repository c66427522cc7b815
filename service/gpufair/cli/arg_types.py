"""Option types that check a value where argparse reads it, so a bad value is the same one-line
usage error as a bad flag (exit 2), naming the option, and never reaches a command."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable

from gpufair.config_file import duration_seconds


def seconds_in(low: float, high: float, *, low_open: bool) -> Callable[[str], float]:
    """A type for an option in seconds within `low` (excluded when `low_open`) and `high`: a
    number (`90`, `0.5`) or a duration as cluster files take them (`90s`, `5m`, `1h30m`)."""

    def parse(value: str) -> float:
        seconds = duration_seconds(value)
        if seconds is None or not math.isfinite(seconds):
            raise argparse.ArgumentTypeError(f"{value!r} is not seconds (e.g. 300, 90s, 5m, 1h)")
        if not (low < seconds if low_open else low <= seconds) or seconds > high:
            interval = f"{'(' if low_open else '['}{low:g}, {high:g}]"
            raise argparse.ArgumentTypeError(f"{value!r}: give seconds in {interval}")
        return seconds

    return parse


def int_in(low: int, high: int) -> Callable[[str], int]:
    """A type for a whole number within [`low`, `high`]."""

    def parse(value: str) -> int:
        try:
            number = int(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{value!r} is not a whole number") from None
        if not low <= number <= high:
            raise argparse.ArgumentTypeError(f"{value!r}: give a whole number in [{low}, {high}]")
        return number

    return parse


def days(value: str) -> float:
    """A number of days above 0 (fractions allowed), finite."""
    try:
        number = float(value)
    except ValueError:
        number = math.nan
    if not 0 < number < math.inf:
        raise argparse.ArgumentTypeError("must be a number of days above 0")
    return number


def positive_int(value: str) -> int:
    number = int(value)
    if number < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return number
