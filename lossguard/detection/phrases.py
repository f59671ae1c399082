"""How the cause labels write numbers and distances in steps."""

from __future__ import annotations

import math


def fmt_number(x: float) -> str:
    if not math.isfinite(x):
        return "NaN" if math.isnan(x) else ("Inf" if x > 0 else "-Inf")
    if x == 0:
        return "0"
    if abs(x) >= 1e4 or abs(x) < 1e-2:
        return f"{x:.1e}"
    return f"{x:.3g}"


def steps_phrase(n: float) -> str:
    n = int(round(n))
    if n == 0:
        return "at the same step as the loss spike"
    if n > 0:
        return f"{n} step{'s' if n != 1 else ''} before the loss spike"
    return f"{-n} step{'s' if n != -1 else ''} after the loss spike began"
