"""Rule kinds about the run rather than one bad point: a pace that slowed and stayed slow
(`throughput`), and an evaluation loss that turned up while the training loss kept falling
(`overfitting`). Like every kind (lossguard.detection.kinds) each judges its stream with polars
expressions, registers itself by being defined, and keeps within a bounded lookback, so the
daemon's tail judges as `scan` does."""

from __future__ import annotations

from dataclasses import field

import numpy as np
import polars as pl

from ..model import Incident
from ..validate import spec
from .context import RunContext, Series
from .kinds import _KIND, MAX_POINTS, Judgement, PerUnit, Rule

SLOWER = {"step_time": "up", "throughput": "down"}
"""Which way each pace metric moves when the run slows: a step's time up, work a second down."""


@_KIND
class ThroughputRule(Rule):
    """A run's pace `factor` times slower than its own median, for `patience` consecutive points.

    The median is of the `window` values before those points: robust to the odd slow step
    (a checkpoint save, an evaluation) inside it, and bounded, so the daemon keeps it in its tail.
    The patience is what tells a slowdown from one slow step and the old pace after it. Only the
    slow direction is judged: a run's first steps are often slow (compilation, warm-up, cold
    caches) and the run getting faster is no incident. A stream that only ever increases across the
    window is a count (seconds or samples since the start), not a pace, and is not judged.
    """

    kind: str = "throughput"
    factor: float = field(default=2.0, metadata=spec(float, gt=1))
    window: int = field(default=50, metadata=spec(int, ge=3, le=MAX_POINTS))
    patience: int = field(default=5, metadata=spec(int, ge=1, le=MAX_POINTS))
    slower: str | None = field(default=None, metadata=spec(("up", "down"), optional=True))
    """`up` for a time, `down` for a rate; by default what the metric is (SLOWER)."""

    finite_only = True
    smallest_sample = 3
    """Values a median of the pace needs at the least."""

    def _check(self) -> str | None:
        if self.direction is None:
            return f"slower: set 'up' (a time) or 'down' (a rate) for metric {self.metric!r}"
        return super()._check()

    @property
    def direction(self) -> str | None:
        return self.slower if self.slower is not None else SLOWER.get(self.metric)

    def default_history(self) -> int:
        return min(self.window, 10) + self.patience

    def fewest(self) -> int:
        return self.smallest_sample + self.patience

    @property
    def lookback(self) -> int:
        return self.window + self.patience - 1

    def judgement(self, v: pl.Expr, per_unit: PerUnit) -> Judgement:
        least = min(self.window, self.history - self.patience)
        baseline = per_unit(v.rolling_median(self.window, min_samples=least).shift(self.patience))
        counting = per_unit((v.diff() > 0).cast(pl.Int8).rolling_min(self.lookback - 1, min_samples=1)) == 1
        if self.direction == "up":
            limit = baseline * self.factor
            slow = per_unit(v.rolling_min(self.patience, min_samples=self.patience)) > limit
        else:
            limit = baseline / self.factor
            slow = per_unit(v.rolling_max(self.patience, min_samples=self.patience)) < limit
        return Judgement(condition=slow & (baseline > 0) & ~counting, baseline=baseline, limit=limit, onset=self.patience - 1)

    def beyond(self, signal: np.ndarray, limit: float | None) -> np.ndarray:
        return signal > limit if self.direction == "up" else signal < limit

    def peak(self, values: np.ndarray) -> int:
        """The slowest point: the longest step, or the lowest rate."""
        finite = np.isfinite(values)
        if self.direction == "up":
            return int(np.argmax(np.where(finite, values, -np.inf)))
        return int(np.argmin(np.where(finite, values, np.inf)))


NOISE_MOVES = 3.0
"""How many typical evaluation-to-evaluation moves the recent evaluations must stand above the
best: the best mean of a flat, noisy loss sits about one below its level, and over many
evaluations now and then two."""
TRAIN_POINTS = 10
"""Training-loss points averaged (a median) at the best evaluation and at the latest flagged one,
to say whether the training loss kept falling between them."""


@_KIND
class OverfittingRule(Rule):
    """An evaluation loss that stopped improving and rose: the mean of its last `patience`
    evaluations, each above the best such mean of the `window` before them, is above that best by `rise`
    (relative) and by NOISE_MOVES typical evaluation-to-evaluation moves (the median absolute change over
    the window): a noisy loss still going down keeps making new lows, and a lucky low is not
    outrun by three times its own noise. The incident starts at the best evaluation: the
    checkpoint to keep.

    Judged with the training loss (`holds`): only while it kept falling from the best evaluation
    to the latest flagged one is it overfitting; both rising is a divergence, another rule's."""

    kind: str = "overfitting"
    metric: str = field(default="eval_loss", metadata=spec(str))
    patience: int = field(default=3, metadata=spec(int, ge=2, le=MAX_POINTS))
    rise: float = field(default=0.01, metadata=spec(float, ge=0))
    window: int = field(default=100, metadata=spec(int, ge=2, le=MAX_POINTS))

    finite_only = True

    def default_history(self) -> int:
        return self.patience + 3

    def fewest(self) -> int:
        return self.patience + 2

    @property
    def lookback(self) -> int:
        return self.window + self.patience - 1

    def judgement(self, v: pl.Expr, per_unit: PerUnit) -> Judgement:
        # Levels are means of `patience` evaluations: the best of single ones is a lucky low, which a
        # flat, noisy loss stands above at once.
        recent = per_unit(v.rolling_mean(self.patience, min_samples=self.patience))
        best = per_unit(recent.rolling_min(self.window, min_samples=1).shift(self.patience))
        lowest = per_unit(v.rolling_min(self.patience, min_samples=self.patience))
        # The rise is measured on the middle evaluation too: one bad evaluation, which the next ones
        # recover from (an evaluation batch's spike), lifts the mean of three as much as a rise that
        # holds, not their median.
        middle = per_unit(v.rolling_median(self.patience, min_samples=self.patience))
        noise = per_unit(v.diff().abs().rolling_median(self.lookback - 1, min_samples=1))
        limit = best * (1 + self.rise)
        risen = pl.min_horizontal(recent, middle)
        rose = (lowest > best) & (risen > limit) & (risen - best > NOISE_MOVES * noise)
        return Judgement(condition=rose & (best > 0), baseline=best, limit=limit, onset=self.patience - 1)

    def start(self, values: np.ndarray, flagged: int, onset: int) -> int:
        """The best evaluation before the rise: the lowest of the window before it."""
        lo = max(0, flagged - onset - self.window)
        before = values[lo : flagged - onset]
        return lo + int(np.argmin(before)) if before.size else flagged - onset

    def holds(self, inc: Incident, ctx: RunContext) -> bool:
        return train_loss_fell(ctx.loss, inc.step, inc.last_flagged_step if inc.last_flagged_step is not None else inc.peak_step) is not None


def train_loss_fell(loss: Series | None, best: int, now: int) -> tuple[float, float] | None:
    """The training loss at the best evaluation and at `now` (medians of TRAIN_POINTS points up to
    each), when it fell between them; None when it did not, or is not logged there. Where the
    points up to the best are not held (the daemon's tail is shorter), the first ones after it
    stand in: the loss fell at least from there."""
    if loss is None:
        return None
    at_best = loss.before(best + 1, TRAIN_POINTS)
    if not np.isfinite(at_best).any():
        at_best = loss.between(best, now)[1][:TRAIN_POINTS]
    at_now = loss.before(now + 1, TRAIN_POINTS)
    at_best, at_now = at_best[np.isfinite(at_best)], at_now[np.isfinite(at_now)]
    if not at_best.size or not at_now.size:
        return None
    then, later = float(np.median(at_best)), float(np.median(at_now))
    return (then, later) if later < then else None
