"""How numbers and curves look to people, in every output (terminal, Markdown, HTML, Slack)."""

from __future__ import annotations

import math

BARS = "▁▂▃▄▅▆▇█"


def fmt(x: float | None) -> str:
    """Four significant digits, scientific for the very large and small, words for non-finite."""
    if x is None:
        return "-"
    if not math.isfinite(x):
        return "NaN" if math.isnan(x) else ("Inf" if x > 0 else "-Inf")
    if x != 0 and (abs(x) >= 1e5 or abs(x) < 1e-3):
        return f"{x:.3e}"
    return f"{x:.4g}"


def sparkline(values: tuple[float, ...] | list[float]) -> str:
    """One character per value, scaled to the finite ones; × marks NaN and Inf."""
    finite = [v for v in values if math.isfinite(v)]
    if not finite:
        return "×" * len(values)
    lo, hi = min(finite), max(finite)
    span = hi - lo or 1.0
    return "".join(BARS[min(7, int((v - lo) / span * 7.999))] if math.isfinite(v) else "×" for v in values)
