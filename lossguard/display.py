"""How numbers and curves look to people, in every output (terminal, Markdown, HTML, Slack)."""

from __future__ import annotations

import math
import unicodedata

BARS = "▁▂▃▄▅▆▇█"


def fmt(x: float | None) -> str:
    """Four significant digits, whole digits up to a million (12345, not 1.234e+04), scientific for the
    very large and small, words for non-finite."""
    if x is None:
        return "-"
    if not math.isfinite(x):
        return "NaN" if math.isnan(x) else ("Inf" if x > 0 else "-Inf")
    if x != 0 and (abs(x) >= 1e6 or abs(x) < 1e-3):
        return f"{x:.3e}"
    return whole_digits(f"{x:.4g}", x)


def whole_digits(text: str, x: float) -> str:
    """`text` (`x` cut to significant digits) as the whole number `x` rounds to where the cut went
    to an exponent for a number people read in full (below a million): 1002, not 1e+03."""
    return f"{x:.0f}" if "e" in text and abs(x) < 1e6 else text


def sparkline(values: tuple[float, ...] | list[float]) -> str:
    """One character per value, scaled to the finite ones; × marks NaN and Inf."""
    finite = [v for v in values if math.isfinite(v)]
    if not finite:
        return "×" * len(values)
    lo, hi = min(finite), max(finite)
    span = hi - lo or 1.0
    return "".join(BARS[min(7, int((v - lo) / span * 7.999))] if math.isfinite(v) else "×" for v in values)


def cells(text: str) -> int:
    """Terminal cells a (printable) text takes: East Asian wide and fullwidth characters take two,
    combining marks none, so a column of run names in Chinese or Japanese lines up."""
    if text.isascii():
        return len(text)
    return sum(0 if unicodedata.combining(ch) else 2 if unicodedata.east_asian_width(ch) in "WF" else 1 for ch in text)


def pad(text: str, width: int, *, right: bool = False) -> str:
    """`text` padded with spaces to `width` cells (on the left for `right`-aligned numbers)."""
    fill = " " * max(0, width - cells(text))
    return fill + text if right else text + fill


def table_lines(rows: list[list[str]], header: list[str], right: frozenset[int] | set[int] = frozenset(), *, ruled: bool = False) -> list[str]:
    """A text table: each column as wide as its widest cell in terminal cells, two spaces between
    (`ruled`: dashes under the header)."""
    widths = [max([cells(h), *(cells(r[i]) for r in rows)]) for i, h in enumerate(header)]
    lines = [header, *([["-" * w for w in widths]] if ruled else []), *rows]
    return ["  ".join(pad(c, w, right=i in right) for i, (c, w) in enumerate(zip(line, widths))).rstrip() for line in lines]
