"""How the cause labels write numbers and distances in steps."""

from __future__ import annotations

import math

from ..display import whole_digits


def fmt_number(x: float) -> str:
    """Three significant digits for a sentence; a number from 1,000 to a million keeps its whole
    digits (a loss scale of 65536, a grad norm of 1002), since `1e+03` reads as a different number."""
    if not math.isfinite(x):
        return "NaN" if math.isnan(x) else ("Inf" if x > 0 else "-Inf")
    if x == 0:
        return "0"
    if abs(x) >= 1e6 or abs(x) < 1e-2:
        return f"{x:.1e}"
    return whole_digits(f"{x:.3g}", x)


def steps_phrase(n: float) -> str:
    n = int(round(n))
    if n == 0:
        return "at the same step as the loss spike"
    if n > 0:
        return f"{n} step{'s' if n != 1 else ''} before the loss spike"
    return f"{-n} step{'s' if n != -1 else ''} after the loss spike began"
