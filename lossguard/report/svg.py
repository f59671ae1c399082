"""Line panels for the HTML report, as inline SVG (the report is one file that needs no network).

What a person reading a plot relies on: round tick values (1-2-5 steps) whose labels differ from each
other, axis titles, a constant series drawn as a flat line in the middle of a sensible axis, no line
drawn across steps that were never logged, and a y-range that shows the spike rather than the
warm-up's first losses (points outside it are clipped at the edge, not dropped).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import count

from ..escaping import html_text

W, H, PAD_L, PAD_R, PAD_T, PAD_B = 660, 160, 70, 16, 14, 34
GAP = 5.0
"""Steps further apart than this many times the usual logging interval are a gap: the line breaks."""
WARMUP = 0.1
"""The share of a curve's first points left out of its y-range (the warm-up's losses dwarf a 1.1x
spike later on), unless an incident is there."""
_ids = count()


@dataclass(frozen=True)
class Mark:
    """A span to shade: an incident, from its first step to its recovery (or its peak)."""

    start: float
    end: float


def nice_ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    """About `n` round ticks covering [lo, hi]: multiples of 1, 2 or 5 times a power of ten."""
    if not (math.isfinite(lo) and math.isfinite(hi)) or hi <= lo:
        return [lo]
    raw = (hi - lo) / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw * 0.999)
    first = math.ceil(lo / step - 1e-9)
    ticks = []
    k = first
    while k * step <= hi + step * 1e-9:
        ticks.append(round(k * step, 12))
        k += 1
    return ticks


def labels(ticks: Sequence[float]) -> list[str]:
    """Tick labels as short as they can be while still all differing: plain for everyday numbers,
    scientific for very large or small ones (an LR of 3e-4)."""
    big = max((abs(t) for t in ticks), default=0.0)
    scientific = big >= 1e5 or 0 < big < 1e-2
    for digits in range(1, 10):
        out = [_label(t, digits, scientific) for t in ticks]
        if len(set(out)) == len(out):
            return out
    return [repr(t) for t in ticks]


def _label(t: float, digits: int, scientific: bool) -> str:
    if t == 0:
        return "0"
    if scientific:
        mantissa, exp = f"{t:.{digits - 1}e}".split("e")
        mantissa = mantissa.rstrip("0").rstrip(".") if "." in mantissa else mantissa
        return f"{mantissa}e{int(exp)}"
    return f"{t:.{digits}g}" if abs(t) < 10 ** digits else f"{t:.0f}"


def y_range(values: Sequence[float], *, keep: Sequence[float] = ()) -> tuple[float, float]:
    """The range a panel shows: the values after the warm-up's first points, and `keep` (incident
    peaks) always; a constant series gets an axis around it, not -1..1."""
    finite = [v for v in values if math.isfinite(v)]
    if not finite:
        return 0.0, 1.0
    skip = int(len(finite) * WARMUP) if len(finite) >= 20 else 0
    seen = finite[skip:] + [v for v in keep if math.isfinite(v)]
    lo, hi = min(seen), max(seen)
    if hi == lo:
        half = abs(lo) * 0.5 or 1.0
        return lo - half, hi + half
    pad = (hi - lo) * 0.05
    return lo - pad, hi + pad


def panel(steps: Sequence[float], values: Sequence[float], *, title: str, x_range: tuple[float, float], marks: Sequence[Mark] = (),
          colour: str = "#2f6fdf", log: bool = False, keep: Sequence[float] = (), width: int = W, height: int = H) -> str:
    """One metric against steps. Non-finite values are dashed red lines at their steps; `log`: a
    log10 y axis (values <= 0 left out)."""
    pts = [(s, v) for s, v in zip(steps, values) if math.isfinite(v) and (v > 0 or not log)]
    bad = [s for s, v in zip(steps, values) if not math.isfinite(v)]
    if not pts and not bad:
        return ""
    tf = (lambda v: math.log10(v)) if log else (lambda v: v)  # noqa: E731
    lo, hi = y_range([tf(v) for _, v in pts], keep=[tf(v) for v in keep if v > 0 or not log])
    x0, x1 = x_range
    span_x = (x1 - x0) or 1.0
    plot_w, plot_h = width - PAD_L - PAD_R, height - PAD_T - PAD_B

    def X(s: float) -> float:
        return PAD_L + (s - x0) / span_x * plot_w

    def Y(y: float) -> float:
        return PAD_T + (hi - y) / (hi - lo) * plot_h

    clip = f"c{next(_ids)}"
    out = [f'<svg width="{width}" height="{height}" viewBox="0 0 {width} {height}" role="img" aria-label="{html_text(title)}">',
           f'<defs><clipPath id="{clip}"><rect x="{PAD_L}" y="{PAD_T}" width="{plot_w}" height="{plot_h}"/></clipPath></defs>',
           f'<rect x="{PAD_L}" y="{PAD_T}" width="{plot_w}" height="{plot_h}" fill="#fafbfc" stroke="#e1e5ec"/>']
    for m in marks:
        a, b = X(m.start), X(m.end)
        out.append(f'<rect class="mark" clip-path="url(#{clip})" x="{a - 1:.1f}" y="{PAD_T}" width="{max(2.0, b - a + 2):.1f}" height="{plot_h}" fill="#d9534f" opacity="0.22"/>')
    for s in bad:
        out.append(f'<line class="nonfinite" x1="{X(s):.1f}" x2="{X(s):.1f}" y1="{PAD_T}" y2="{PAD_T + plot_h}" stroke="#8b0000" stroke-dasharray="2,2"/>')
    if pts:
        out.append(f'<path class="line" clip-path="url(#{clip})" d="{_path(pts, X, Y, tf)}" fill="none" stroke="{colour}" stroke-width="1.3"/>')
    yt = nice_ticks(lo, hi, 4) if not log else _log_ticks(lo, hi)
    for t, label in zip(yt, labels([10 ** t for t in yt] if log else yt)):
        if lo <= t <= hi:
            out.append(f'<text class="ytick" x="{PAD_L - 4}" y="{Y(t) + 4:.1f}" text-anchor="end">{label}</text>')
    xt = nice_ticks(x0, x1, 6)
    for t, label in zip(xt, labels(xt)):
        out.append(f'<text class="xtick" x="{X(t):.1f}" y="{PAD_T + plot_h + 14}" text-anchor="middle">{label}</text>')
    out.append(f'<text class="axis" x="{PAD_L + plot_w / 2:.0f}" y="{height - 3}" text-anchor="middle">step</text>')
    out.append(f'<text class="axis" transform="translate(12,{PAD_T + plot_h / 2:.0f}) rotate(-90)" text-anchor="middle">{html_text(title)}{" (log)" if log else ""}</text>')
    out.append("</svg>")
    return "".join(out)


def _log_ticks(lo: float, hi: float) -> list[float]:
    """log10 positions: whole decades when the range spans them, else round values within."""
    if math.floor(hi) - math.ceil(lo) >= 1:
        step = max(1, math.ceil((math.floor(hi) - math.ceil(lo)) / 5))
        return [float(k) for k in range(math.ceil(lo), math.floor(hi) + 1, step)]
    return [math.log10(t) for t in nice_ticks(10 ** lo, 10 ** hi, 4) if t > 0]


def _path(pts: Sequence[tuple[float, float]], X, Y, tf) -> str:  # noqa: ANN001
    """The line, broken ("M") where the steps jump by more than GAP usual intervals."""
    gaps = sorted(b[0] - a[0] for a, b in zip(pts, pts[1:]) if b[0] > a[0])
    usual = gaps[len(gaps) // 2] if gaps else 1.0
    parts = []
    for k, (s, v) in enumerate(pts):
        move = k == 0 or s - pts[k - 1][0] > GAP * usual
        parts.append(f"{'M' if move else 'L'}{X(s):.1f},{Y(tf(v)):.1f}")
    return " ".join(parts)
