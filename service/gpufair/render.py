"""Plain-text tables for the command line."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence


def fmt_number(value: float | None) -> str:
    """One rule for every number the command line prints: whole numbers as they are, others to
    three decimals (trailing zeros dropped), and values too small for that to three significant
    digits, so 0.0004 does not show as 0."""
    if value is None:
        return "-"
    if not math.isfinite(value):
        return str(value)
    if value == int(value) and abs(value) < 1e15:
        return str(int(value))
    if abs(value) < 0.001:
        return f"{value:.3g}"
    text = f"{value:.3f}".rstrip("0").rstrip(".")
    return "0" if text == "-0" else text


def table(headers: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    """Left-aligned text columns, numbers right-aligned, two spaces apart."""
    cells = [[str(h) for h in headers]]
    numeric = [True] * len(headers)
    for row in rows:
        rendered = []
        for i, value in enumerate(row):
            if isinstance(value, bool) or not isinstance(value, int | float):
                numeric[i] = numeric[i] and value in ("", "-")
                rendered.append(str(value))
            else:
                rendered.append(fmt_number(float(value)))
        cells.append(rendered)
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = []
    for n, row in enumerate(cells):
        parts = [
            cell.rjust(widths[i]) if numeric[i] and n > 0 else cell.ljust(widths[i])
            for i, cell in enumerate(row)
        ]
        lines.append("  ".join(parts).rstrip())
    return "\n".join(lines)
