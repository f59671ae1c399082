"""The picture of an incident: the curves around it as the daemon had them when it raised the alert
(`Picture`, pure, stored with the incident), and the PNG drawn from it (`render`).

This module owns matplotlib, and imports it only inside `render`: `scan` never pays for it (half a
second and ~40 MB). The daemon draws in a child process (`draw`: `python -m lossguard.alerts.picture`): a
drawing holds the GIL for ~0.2 s of Python (0.7 s with the import), which would hold up the passes
and the sender beside it; the daemon's memory stays as it was; and whatever matplotlib does (a
crash, a hang: killed after TIMEOUT) costs the picture, never the daemon. It draws with the Agg
canvas on a Figure of its own, never pyplot: no global figure state, no display. A run name is
data: its control characters are made visible and matplotlib is told not to read it as mathtext or
TeX (a `$` in a run name stays a `$`), whatever a matplotlibrc says.
"""

from __future__ import annotations

import json
import logging
import math
import os
import subprocess
import sys
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import LossguardError
from ..escaping import printable
from ..model import Incident, from_json_number, json_number

PANELS = ("loss", "lr", "grad_norm", "loss_scale")
"""The curves shown under the incident's own (where logged), in this order."""
TITLES = {"loss": "loss", "eval_loss": "eval loss", "lr": "learning rate", "grad_norm": "grad norm", "loss_scale": "loss scale"}
BEFORE = 200
AFTER = 200
"""Points of the incident's curve kept before its first step and after its last flagged one (at
most: the daemon's tails may hold fewer)."""
WIDTH = 1000
PANEL_HEIGHT = 200
MARGIN_HEIGHT = 100
DPI = 100
LOG_RANGE = 100.0
"""A panel whose positive values span more than this factor is drawn on a log axis: a 1000x spike
would otherwise flatten the curve before it into a line at the bottom."""
TITLE_CHARS = 120
TIMEOUT = 60.0
"""Seconds a drawing may take in its child process (a few tenths normally)."""


class PlotError(LossguardError):
    """The picture could not be drawn or written (the alert goes without it)."""


@dataclass(frozen=True)
class Curve:
    metric: str
    steps: tuple[int, ...]
    values: tuple[float, ...]


@dataclass(frozen=True)
class Picture:
    """What an incident's plot shows, fixed when the alert is raised: the incident, and its curve
    with the other logged ones over the same steps."""

    incident: Incident
    curves: tuple[Curve, ...]

    def to_json(self) -> dict[str, object]:
        return {
            "incident": self.incident.to_json(),
            "curves": [{"metric": c.metric, "steps": list(c.steps), "values": [json_number(v) for v in c.values]} for c in self.curves],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, object]) -> Picture:
        curves = tuple(
            Curve(str(c["metric"]), tuple(int(s) for s in c["steps"]), tuple(from_json_number(v) for v in c["values"]))
            for c in data["curves"]  # type: ignore[union-attr]
        )
        return cls(Incident.from_json(data["incident"]), curves)  # type: ignore[arg-type]

    def around(self, before: int = 30, after: int = 10) -> tuple[float, ...]:
        """The incident's own curve from `before` points before its first step to `after` after its
        peak: what a Slack message shows as a sparkline (a webhook cannot upload the picture)."""
        own = self.curves[0]
        inc = self.incident
        first = next((i for i, s in enumerate(own.steps) if s >= inc.step), len(own.steps) - 1)
        peak = next((i for i, s in enumerate(own.steps) if i >= first and s >= inc.peak_step), first)
        return own.values[max(0, first - before):peak + after + 1]

    def pixels(self) -> tuple[int, int]:
        """(width, height) of the PNG: one band per curve."""
        return WIDTH, MARGIN_HEIGHT + PANEL_HEIGHT * len(self.curves)


def _last_segment(steps: np.ndarray, upto: int) -> int:
    """Where the segment holding position `upto` starts (after the last rewind before it): a run
    resumed from a checkpoint logs earlier steps again, and a line through both would zigzag."""
    rewinds = np.flatnonzero(steps[1:upto + 1] < steps[:upto]) + 1
    return int(rewinds[-1]) if rewinds.size else 0


def shown_trouble(inc: Incident) -> str:
    """The incident's word in a picture's title: a non-finite value is drawn as such (it has no
    height), every other as what reports call it (a spike, a slowdown, overfitting...)."""
    return "non-finite" if inc.kind == "nonfinite" else inc.trouble


def picture(incident: Incident, streams: Mapping[str, tuple[np.ndarray, np.ndarray]]) -> Picture | None:
    """The incident's picture from the streams the daemon holds ((steps, values) per metric, in
    the order written): up to BEFORE points before it and AFTER after it, the other PANELS over
    the same steps. None when its own curve is not among them."""
    own = streams.get(incident.metric)
    if own is None or not len(own[0]):
        return None
    steps, values = np.asarray(own[0], np.int64), np.asarray(own[1], np.float64)
    # Its first point: in its segment (the streams' segments are the ones the rule judged: a
    # resume logs the same steps again), else the last time the step was logged.
    segment = np.concatenate([[0], np.cumsum(steps[1:] < steps[:-1])])
    at = np.flatnonzero(steps == incident.step)
    mine = at[segment[at] == incident.segment]
    first = int(mine[0]) if mine.size else int(at[-1]) if at.size else min(int(np.searchsorted(steps, incident.step)), len(steps) - 1)
    start = max(first - BEFORE, _last_segment(steps, first))
    last_step = max(s for s in (incident.step, incident.peak_step, incident.last_flagged_step) if s is not None)
    reached = np.flatnonzero(steps[first:] >= last_step)
    after = first + int(reached[0]) if reached.size else len(steps) - 1
    stop = min(after + AFTER + 1, len(steps))
    rewind = np.flatnonzero(steps[first + 1:stop] < steps[first:stop - 1])
    if rewind.size:  # a resume after the incident: its replay is another timeline
        stop = first + 1 + int(rewind[0])
    lo, hi = int(steps[start]), int(steps[stop - 1])
    curves = [Curve(incident.metric, tuple(int(s) for s in steps[start:stop]), tuple(float(v) for v in values[start:stop]))]
    for metric in PANELS:
        if metric == incident.metric or metric not in streams:
            continue
        s, v = np.asarray(streams[metric][0], np.int64), np.asarray(streams[metric][1], np.float64)
        if not s.size:
            continue
        begin = _last_segment(s, len(s) - 1)
        s, v = s[begin:], v[begin:]
        keep = (s >= lo) & (s <= hi)
        if keep.any():
            curves.append(Curve(metric, tuple(int(x) for x in s[keep]), tuple(float(x) for x in v[keep])))
    return Picture(incident, tuple(curves))


def _number(value: float) -> str:
    return f"{value:.4g}"


def draw(pic: Picture, path: Path, *, cache_dir: Path | None = None, timeout: float = TIMEOUT) -> Path:
    """`render` in a child process (see the module's doc). `cache_dir`: matplotlib's config and
    font cache when MPLCONFIGDIR is not set (a service's home is often read-only: matplotlib would
    build its font cache in a temporary folder, again at every drawing)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOSSGUARD_") and k != "CREDENTIALS_DIRECTORY"}  # (no secrets)
    if cache_dir is not None and "MPLCONFIGDIR" not in env:
        try:
            cache_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
            env["MPLCONFIGDIR"] = str(cache_dir)
        except OSError:
            pass  # (matplotlib finds a temporary one)
    try:
        done = subprocess.run([sys.executable, "-m", "lossguard.alerts.picture", str(path)], input=json.dumps(pic.to_json()), env=env,
                              capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        for left in path.parent.glob(f".{path.name}.*.tmp"):  # (the killed child's half-written file)
            left.unlink(missing_ok=True)
        raise PlotError(f"drawing took longer than {timeout:g} s") from None
    except OSError as exc:
        raise PlotError(f"cannot start {sys.executable}: {exc.strerror or exc}") from None
    if done.returncode != 0:
        lines = done.stderr.strip().splitlines()
        raise PlotError(printable(lines[-1] if lines else f"the drawing process ended with code {done.returncode}"))
    return path


def main(argv: list[str]) -> int:
    """`python -m lossguard.alerts.picture OUT.png < picture.json`: the daemon's child process."""
    try:
        render(Picture.from_json(json.load(sys.stdin)), Path(argv[0]))
    except PlotError as exc:
        print(exc, file=sys.stderr)
        return 2
    except (ValueError, KeyError, TypeError, IndexError) as exc:
        print(f"not a picture: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    return 0


def render(pic: Picture, path: Path) -> Path:
    """Draw `pic` into a PNG at `path` (private, 0600; written whole or not at all), here."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        figure = _draw(pic)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with open(fd, "wb") as fh:
            figure.savefig(fh, format="png", dpi=DPI)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except PlotError:
        raise
    except OSError as exc:
        raise PlotError(f"cannot write {path}: {exc.strerror or exc}") from None
    except Exception as exc:  # noqa: BLE001 - matplotlib raises many kinds; none may cost the alert
        raise PlotError(f"matplotlib could not draw the plot: {type(exc).__name__}: {exc}") from None
    finally:
        tmp.unlink(missing_ok=True)
    return path


def _draw(pic: Picture):  # noqa: ANN202 - a matplotlib Figure
    import matplotlib
    from matplotlib import style
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    logging.getLogger("matplotlib").setLevel(logging.ERROR)  # "building the font cache", missing glyphs
    inc = pic.incident
    width, height = pic.pixels()
    # The default style, not the user's matplotlibrc: no TeX, the same picture on every machine.
    with warnings.catch_warnings(), style.context("default"), matplotlib.rc_context({"text.usetex": False}):
        warnings.simplefilter("ignore")
        figure = Figure(figsize=(width / DPI, height / DPI), dpi=DPI, layout="constrained")
        FigureCanvasAgg(figure)
        axes = figure.subplots(len(pic.curves), 1, sharex=True, squeeze=False)[:, 0]
        run = printable(inc.run)
        if len(run) > TITLE_CHARS:
            run = run[:TITLE_CHARS - 1] + "…"
        kind = shown_trouble(inc)
        figure.suptitle(f"{run}", usetex=False, parse_math=False, fontsize=12)
        axes[0].set_title(
            f"{TITLES.get(inc.metric, inc.metric)} {kind} at step {inc.step} ({printable(inc.rule)}, {inc.severity}; {inc.ending})",
            usetex=False, parse_math=False, fontsize=10,
        )
        end = inc.end_step if inc.end_step is not None else None
        for ax, curve in zip(axes, pic.curves):
            _panel(ax, curve, inc, end)
        axes[-1].set_xlabel("step", usetex=False, parse_math=False)
    return figure


def _panel(ax, curve: Curve, inc: Incident, end: int | None) -> None:  # noqa: ANN001 - a matplotlib Axes
    steps = np.asarray(curve.steps, np.float64)
    values = np.asarray(curve.values, np.float64)
    finite = np.isfinite(values)
    own = curve.metric == inc.metric
    # Non-finite points break the line (they are marked at the top instead of drawn at a value).
    ax.plot(steps, np.where(finite, values, np.nan), color="tab:blue" if own else "tab:gray", linewidth=1.2)
    if (~finite).any():
        ax.plot(steps[~finite], np.full((~finite).sum(), 0.95), linestyle="", marker="x", color="tab:red",
                transform=ax.get_xaxis_transform(), label="NaN / Inf")
    # The incident: from its first step to its recovery (or the last step shown, while open).
    right = end if end is not None else (steps.max() if steps.size else inc.step)
    ax.axvspan(inc.step, max(right, inc.step), color="tab:red", alpha=0.12, linewidth=0)
    ax.axvline(inc.step, color="tab:red", linewidth=0.8)
    if own:
        if inc.baseline is not None and math.isfinite(inc.baseline):
            ax.axhline(inc.baseline, color="tab:green", linestyle="--", linewidth=1, label=f"baseline {_number(inc.baseline)}")
        if inc.threshold is not None and math.isfinite(inc.threshold):
            ax.axhline(inc.threshold, color="tab:orange", linestyle="--", linewidth=1, label=f"threshold {_number(inc.threshold)}")
        if math.isfinite(inc.value):
            ax.plot([inc.peak_step], [inc.value], marker="o", color="tab:red", linestyle="", label=f"peak {_number(inc.value)} at step {inc.peak_step}")
        ax.legend(loc="upper left", fontsize=8)
    shown = values[finite]
    if own and inc.threshold is not None and math.isfinite(inc.threshold):
        shown = np.append(shown, inc.threshold)
    if shown.size and shown.min() > 0 and shown.max() / shown.min() > LOG_RANGE:
        ax.set_yscale("log")
    else:  # 0.0001 as 1e-4 over the axis rather than 0.000100, and never an offset (+2.001e0)
        ax.ticklabel_format(axis="y", style="sci", scilimits=(-3, 4), useOffset=False)
    ax.set_ylabel(TITLES.get(curve.metric, curve.metric), usetex=False, parse_math=False)
    ax.grid(True, alpha=0.3)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
