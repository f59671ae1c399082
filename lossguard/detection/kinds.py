"""Rule kinds. Each kind is one class: its parameters (checked field by field on load, see
lossguard.validate) and its judgement (polars expressions that lossguard.detection.spikes evaluates over a
whole stream at once). Defining a subclass of Rule with its own `kind` registers it: rules files
can name it and detect judges it, with nothing to add anywhere else.

The judgement lives here rather than in detect because a kind's parameters only mean something
together with the expression that reads them (`window` is the rolling window that expression
opens, `lookback` how far back it reaches); kept apart, each new kind had to be written three
times and the three kept in step by hand.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from types import MappingProxyType
from typing import TYPE_CHECKING, ClassVar

import numpy as np
import polars as pl

from ..model import split_rank
from ..ingest.table import CANONICAL_METRICS
from ..validate import spec

if TYPE_CHECKING:
    from ..model import Incident
    from .context import RunContext

SEVERITIES = ("info", "warning", "critical")
MAX_POINTS = 10**9
"""Windows, patience, recovery and history count points: more than any run logs, and far from where
polars' window sizes (and their sums here) overflow."""
MAX_STEPS = 2**63 - 1
"""Steps are Int64."""
MIN_ALPHA = 1e-6
"""The smallest EWM alpha: a memory of about a million points (its lookback, 9.2 million points, is
what the daemon keeps of each stream's tail). Smaller ones mean nothing more, and under about 1e-16
1 - alpha rounds to 1, where the lookback divided by log(1 - alpha) = 0."""
_KIND = dataclass(frozen=True, kw_only=True)

PerUnit = Callable[[pl.Expr], pl.Expr]
"""Wraps a window expression so that it restarts at each evaluation unit (a resumed segment with
the history it continues from, see streams.segments_with_history)."""

_registered: dict[str, type[Rule]] = {}
RULE_KINDS: Mapping[str, type[Rule]] = MappingProxyType(_registered)
"""Every kind by name, in the order the classes are defined (the order error messages list them)."""


@dataclass(frozen=True, kw_only=True)
class Judgement:
    """How a kind judges every point, as expressions over the column `value` of the units."""

    condition: pl.Expr
    """True where the point breaks the rule (null is taken as False: not enough history yet)."""
    baseline: pl.Expr
    """What the point was compared with, reported with the incident."""
    limit: pl.Expr
    """The value the baseline allowed; an incident recovers once its points are back under it."""
    onset: int = 0
    """Points before a flagged one at which the condition began (a patience's first point)."""


def _over(v: pl.Expr, baseline: pl.Expr, limit: pl.Expr) -> Judgement:
    return Judgement(condition=v > limit, baseline=baseline, limit=limit)


def _held(raw: pl.Expr, patience: int, level: pl.Expr, per_unit: PerUnit) -> Judgement:
    """`raw` at `patience` consecutive points. The run's length at each point is its index minus the
    index of the last point where `raw` did not hold."""
    index = per_unit(pl.int_range(0, pl.len()))
    last_clean = per_unit(pl.when(~raw).then(index).otherwise(None).forward_fill()).fill_null(-1)
    return Judgement(condition=raw & (index - last_clean >= patience), baseline=level, limit=level, onset=patience - 1)


@_KIND
class Rule:
    """What every kind shares: which stream, how loud, when it may fire and when an incident ends."""

    name: str = field(metadata=spec(str, min_length=1))
    metric: str = field(metadata=spec(str))
    severity: str = field(default="warning", metadata=spec(SEVERITIES))
    runs: str = field(default="*", metadata=spec(str))
    min_history: int | None = field(default=None, metadata=spec(int, optional=True, ge=1, le=MAX_POINTS))
    """Values the stream must hold (the judged one included) before the rule may fire."""
    judge_until: int | None = field(default=None, metadata=spec(int, optional=True, ge=1, le=MAX_POINTS))
    """The rule judges only a stream's first points, those with fewer than this many values before
    them (None: every point): a stricter rule for a run too short for the others' windows."""
    cooldown: int = field(default=0, metadata=spec(int, ge=0, le=MAX_STEPS))
    recovery: int = field(default=3, metadata=spec(int, ge=1, le=MAX_POINTS))
    """Points back under the threshold that close an incident."""
    kind: str = ""
    """Each kind sets its name as this default; rules.rule_from picks the class by it."""

    finite_only: ClassVar[bool] = False
    """Window statistics see only finite values: a NaN neither enters a window nor resets it (the
    `nonfinite` kind is what catches it)."""
    nonfinite_only: ClassVar[bool] = False
    """Only a NaN or Inf can break the rule: a stream without one need not be judged."""
    second_opinion: ClassVar[bool] = False
    """An incident of this kind that begins while another rule's incident on the same stream is open
    tells that incident's trouble again: the judge keeps only the other (engine.told_once)."""

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        name = cls.__dict__.get("kind")
        if name is None:
            return
        if not isinstance(name, str) or not name or name in _registered:
            raise TypeError(f"{cls.__name__}: kind {name!r} must be a new, non-empty name")
        _registered[name] = cls

    def _check(self) -> str | None:
        if self.metric not in CANONICAL_METRICS:
            return f"metric: unknown metric {self.metric!r}; one of: {', '.join(CANONICAL_METRICS)}"
        return None

    def applies_to(self, run: str) -> bool:
        """(A rank's stream is judged by its run's rules: a rules file names runs, not ranks.)"""
        return fnmatchcase(split_rank(run)[0], self.runs)

    @property
    def history(self) -> int:
        """Values the stream must hold (the judged one included) before the rule may fire: min_history,
        or the kind's default, but never fewer than its judgement needs to say anything."""
        wanted = self.min_history if self.min_history is not None else self.default_history()
        return max(wanted, self.fewest())

    def default_history(self) -> int:
        return 1

    def fewest(self) -> int:
        """The fewest values (the judged one included) with which the kind's judgement can hold."""
        return 1

    @property
    def lookback(self) -> int:
        """Finite points before the judged one that its decision can depend on."""
        return 0

    def judgement(self, v: pl.Expr, per_unit: PerUnit) -> Judgement:
        """The kind's decision for every point of the value column `v`."""
        raise NotImplementedError(f"kind {self.kind!r} has no judgement")

    def start(self, values: np.ndarray, flagged: int, onset: int) -> int:
        """Row of the unit's `values` at which the incident that row `flagged` opens began: by
        default where its condition began (the patience's first point)."""
        return flagged - onset

    def holds(self, inc: Incident, ctx: RunContext) -> bool:
        """Whether an incident the stream shows is one once the run's other streams are seen (a
        kind judging two streams at once: an evaluation loss against the training loss)."""
        return True

    def quick_flags(self, units: pl.DataFrame) -> np.ndarray | None:
        """Rows of a single unit the condition holds at, found without the expressions where a kind
        has a cheaper way; None: use the expressions."""
        return None

    def recovery_signal(self, values: np.ndarray, flagged: np.ndarray) -> np.ndarray:
        """What recovery watches point by point (`flagged`: the rows the rule flagged)."""
        return values

    def beyond(self, signal: np.ndarray, limit: float | None) -> np.ndarray:
        """Points of the recovery signal still in the incident: measured against the limit from before
        it began, so a baseline dragged up by the incident cannot close it early."""
        return signal > limit

    def peak(self, values: np.ndarray) -> int:
        """Position of the incident's peak among its values: the highest finite one."""
        return int(np.argmax(np.where(np.isfinite(values), values, -np.inf)))


class _AgainstTheWindowBefore(Rule):
    """A kind that compares each value with the `window` finite values before it (each declares its
    own `window`, with its own default and bounds); nothing older than the window matters.

    By default the first point it judges is the one after a full window. A `min_history` below
    that lets it judge earlier, against the values there are: a point with fewer than `window`
    values before it is compared with all of them (the `least` at which a statistic is taken).
    Only at the start of a stream: detect judges a point of a window cut from a longer stream (the
    daemon's tail) only once its whole window is inside (`lookback`), so both commands agree."""

    finite_only = True
    smallest_sample: ClassVar[int] = 1
    """Values before the judged one its statistic needs at the very least."""

    def default_history(self) -> int:
        return self.window + 1

    def fewest(self) -> int:
        return self.smallest_sample + 1

    @property
    def least(self) -> int:
        """Values before a point its statistic is taken from at the least: the full window, or as
        few as min_history allows."""
        return min(self.window, self.history - 1)

    @property
    def lookback(self) -> int:
        return self.window


@_KIND
class RatioRule(_AgainstTheWindowBefore):
    """value > factor x (mean | median | max) of the previous `window` finite values."""

    kind: str = "ratio"
    factor: float = field(default=2.0, metadata=spec(float, gt=0))
    window: int = field(default=9, metadata=spec(int, ge=1, le=MAX_POINTS))
    baseline: str = field(default="mean", metadata=spec(("mean", "median", "max")))

    def judgement(self, v: pl.Expr, per_unit: PerUnit) -> Judgement:
        window = {"mean": v.rolling_mean, "median": v.rolling_median, "max": v.rolling_max}[self.baseline]
        baseline = per_unit(window(self.window, min_samples=self.least).shift(1))
        return _over(v, baseline, baseline * self.factor)


@_KIND
class ZScoreRule(_AgainstTheWindowBefore):
    """value > mean + k x std of the previous `window` finite values."""

    kind: str = "zscore"
    k: float = field(default=6.0, metadata=spec(float, gt=0))
    window: int = field(default=128, metadata=spec(int, ge=2, le=MAX_POINTS))

    smallest_sample = 2  # a standard deviation of one value is no spread at all

    def judgement(self, v: pl.Expr, per_unit: PerUnit) -> Judgement:
        baseline = per_unit(v.rolling_mean(self.window, min_samples=self.least).shift(1))
        # The spread from rolling sums (of the values and their squares), not rolling_std: polars'
        # rolling_std carries a running state whose rounding depends on the row it started from, so
        # the daemon (a cut tail) and scan (the whole stream) differed in the last digit of a
        # threshold even for whole-number values, whose sums are exact from any start.
        # Taken about the unit's first value, where the sums lose fewer digits to cancellation (and
        # whole numbers stay whole).
        d = v - v.drop_nulls().first()
        total = d.rolling_sum(self.window, min_samples=self.least)
        squares = (d * d).rolling_sum(self.window, min_samples=self.least)
        n = v.is_not_null().cast(pl.Float64).rolling_sum(self.window, min_samples=1)
        spread = per_unit(((squares - total * total / n) / (n - 1)).clip(lower_bound=0.0).sqrt().shift(1))
        return _over(v, baseline, baseline + self.k * spread)


@_KIND
class EwmRule(Rule):
    """value > factor x the exponentially weighted mean of the previous finite values."""

    kind: str = "ewm"
    factor: float = field(default=1.5, metadata=spec(float, gt=0))
    alpha: float = field(default=0.1, metadata=spec(float, ge=MIN_ALPHA, le=1))

    finite_only = True

    def default_history(self) -> int:
        return max(2, round(2 / self.alpha))

    def fewest(self) -> int:
        return 2

    @property
    def lookback(self) -> int:
        # Weights below 1e-4 of the newest are negligible: that many points pin the mean.
        # log1p: 1 - alpha itself loses alpha's digits as alpha gets small.
        return max(1, math.ceil(math.log(1e-4) / math.log1p(-self.alpha))) if self.alpha < 1 else 1

    def judgement(self, v: pl.Expr, per_unit: PerUnit) -> Judgement:
        baseline = per_unit(v.ewm_mean(alpha=self.alpha, adjust=False).shift(1))
        return _over(v, baseline, baseline * self.factor)


@_KIND
class ThresholdRule(Rule):
    """value above `above` (or below `below`) for `patience` consecutive points.

    A NaN is outside either bound: a loss that turns NaN is not under any cap, and is not back
    within it either. Both the judgement and the recovery say so (polars orders NaN above every
    number, numpy compares it false with everything: left to them, a NaN opened an incident at
    each point and closed it at the next, and the incidents overlapped)."""

    kind: str = "threshold"
    above: float | None = field(default=None, metadata=spec(float, optional=True))
    below: float | None = field(default=None, metadata=spec(float, optional=True))
    patience: int = field(default=1, metadata=spec(int, ge=1, le=MAX_POINTS))

    def _check(self) -> str | None:
        if (self.above is None) == (self.below is None):
            return "set exactly one of `above` or `below`"
        return super()._check()

    def fewest(self) -> int:
        return self.patience

    @property
    def lookback(self) -> int:
        return self.patience - 1

    def judgement(self, v: pl.Expr, per_unit: PerUnit) -> Judgement:
        bound = self.above if self.above is not None else self.below
        raw = v.is_nan() | ((v > self.above) if self.above is not None else (v < self.below))
        return _held(raw, self.patience, pl.lit(bound, dtype=pl.Float64), per_unit)

    def beyond(self, signal: np.ndarray, limit: float | None) -> np.ndarray:
        with np.errstate(invalid="ignore"):
            return np.isnan(signal) | (signal < self.below if self.below is not None else signal > limit)


@_KIND
class NonFiniteRule(Rule):
    """NaN or +/-Inf in the metric: never let a NaN loss pass silently."""

    kind: str = "nonfinite"
    patience: int = field(default=1, metadata=spec(int, ge=1, le=MAX_POINTS))

    nonfinite_only = True

    def fewest(self) -> int:
        return self.patience

    def judgement(self, v: pl.Expr, per_unit: PerUnit) -> Judgement:
        return _held(~v.is_finite(), self.patience, pl.lit(None, dtype=pl.Float64), per_unit)

    def quick_flags(self, units: pl.DataFrame) -> np.ndarray | None:
        if self.patience != 1:
            return None
        # The common guard: just the non-finite points (numpy finds them in milliseconds).
        values = units.get_column("value").to_numpy()
        return np.flatnonzero(~np.isfinite(values) & units.get_column("judge").to_numpy())

    def beyond(self, signal: np.ndarray, limit: float | None) -> np.ndarray:
        return ~np.isfinite(signal)

    def peak(self, values: np.ndarray) -> int:
        """The first non-finite value: a NaN has no height to rank by."""
        return int(np.flatnonzero(~np.isfinite(values))[0])


@_KIND
class SustainedRule(Rule):
    """`patience` consecutive values above factor x the mean of the `window` values before them:
    divergence rather than a blip."""

    kind: str = "sustained"
    factor: float = field(default=2.0, metadata=spec(float, gt=0))
    window: int = field(default=100, metadata=spec(int, ge=1, le=MAX_POINTS))
    patience: int = field(default=4, metadata=spec(int, ge=1, le=MAX_POINTS))

    finite_only = True

    def default_history(self) -> int:
        return self.window + self.patience

    def fewest(self) -> int:
        return self.window + self.patience

    @property
    def lookback(self) -> int:
        return self.window + self.patience - 1

    def judgement(self, v: pl.Expr, per_unit: PerUnit) -> Judgement:
        baseline = per_unit(v.rolling_mean(self.window, min_samples=self.window).shift(self.patience))
        limit = baseline * self.factor
        lowest = per_unit(v.rolling_min(self.patience, min_samples=self.patience))
        return Judgement(condition=lowest > limit, baseline=baseline, limit=limit, onset=self.patience - 1)


@_KIND
class SlopeRule(Rule):
    """The least-squares slope of the last `window` finite values (the judged one included), per
    point and relative to their mean, above `rate`: a loss creeping up over many points, a divergence
    that begins too slowly for any ratio to the recent values to notice.

    Per point, not per step, like every window here: a run logging every 500 steps and one logging
    every step are both judged on their last `window` values. The defaults, window 50 and rate 0.01
    (1% of the window's mean per point: a trend climbing by about half the mean across the window),
    sit well clear of healthy training: on the clean runs of tests/fixtures/corpus the steepest
    50-point slope is 0.0028 (modded-nanogpt's un-averaged per-step loss), 0.0017 or less on the
    others; and white noise of relative spread s gives a slope of spread s x sqrt(12 / (n (n^2 - 1))),
    about s / 100 at n = 50, so even 10% noise per point stays 10 spreads under the rate.

    The baseline is the window mean; the limit is mean x (1 + rate x (window - 1) / 2), where a line
    through the window's mean rising at exactly `rate` ends at the judged point: the fitted trend ends
    above it exactly when the slope is above the rate. A window whose mean is not positive is not
    judged (a slope relative to it means nothing).

    Recovery is the slope back at or under the rate for `recovery` points, not the values back under
    the limit: a loss that stopped climbing stays above where it started, and a trend is judged
    over `window` points, so the incident closes some points after the climb does.
    """

    kind: str = "slope"
    window: int = field(default=50, metadata=spec(int, ge=3, le=MAX_POINTS))
    rate: float = field(default=0.01, metadata=spec(float, gt=0))

    finite_only = True

    def default_history(self) -> int:
        return self.window

    def fewest(self) -> int:
        return self.window

    @property
    def lookback(self) -> int:
        return self.window - 1

    def judgement(self, v: pl.Expr, per_unit: PerUnit) -> Judgement:
        n = self.window
        # x is the row's index in its unit, never the step: steps run to billions, and x * value
        # summed over a window would lose the slope's digits (a row index of 10 million costs about
        # 1e-11 of the slope, against rates of 1e-3). sum((x - mean x) * value) = sum(x * value) -
        # (mean x) * sum(value), and sum((x - mean x)^2) = n (n^2 - 1) / 12 for n consecutive x.
        x = pl.int_range(0, pl.len()).cast(pl.Float64)
        total = per_unit(v.rolling_sum(n, min_samples=n))
        moment = per_unit((x * v).rolling_sum(n, min_samples=n)) - (per_unit(x) - (n - 1) / 2) * total
        slope = moment / (n * (n * n - 1) / 12)
        mean = total / n
        limit = mean * (1 + self.rate * (n - 1) / 2)
        return Judgement(condition=(mean > 0) & (slope > self.rate * mean), baseline=mean, limit=limit)

    def recovery_signal(self, values: np.ndarray, flagged: np.ndarray) -> np.ndarray:
        # After an incident's first point every point is judged with a full window, so "flagged" is
        # exactly "its window's slope is above the rate".
        signal = np.zeros(values.size, dtype=bool)
        signal[flagged] = True
        return signal

    def beyond(self, signal: np.ndarray, limit: float | None) -> np.ndarray:
        return signal


@_KIND
class DivergenceRule(Rule):
    """The loss has stayed above `factor` x its lowest value of the `window` points before, by more
    than `noise` times its usual step-to-step change: a loss that keeps rising (a compounding
    1.08x a step, a climb of 2x over a run) where no point is ever far above the few before it, so
    no ratio to the recent mean notices.

    Three numbers per point:
    - the level: the lowest of the last `patience` values. A loss that stayed up, not one blip.
    - the floor: over the `window` points before those, the lowest mean of `patience` consecutive
      values (the run's recent minimum, as its typical level went: a per-batch loss has single
      low outliers, 0.69 among values of 1.1, 0.9 among 2.8, and the lowest single value would
      make every ordinary point a rise of 1.5x above it).
    - the noise: the mean absolute change from one value to the next over those same points (a
      steady climb's changes are its own rate, so a climb stands many of them above its floor,
      where noise alone reaches 1-2; a blip in the window only raises it a little, by its height
      over the window's length).
    Rolling means and minima only: a rolling median over the window cost 20 times the seed rule
    (2.3 s for 2 million points).
    The point breaks the rule where level > floor x factor and level - floor > noise x (its spread).
    A floor that is not positive is not judged: a rise relative to it means nothing.

    The incident begins at the first of the `patience` points, stays open while the loss stays above
    floor x factor (the limit from before it began) and closes after `recovery` points back under
    it: one incident per climb, not one a point. Per point, not per step, like every window here;
    its lookback (window + 2 x patience - 1 points: 409 with the defaults) is what the daemon keeps
    of a loss stream's tail, so a climb slower than `factor` across `window` points is left to the
    `slope` kind."""

    kind: str = "divergence"
    factor: float = field(default=1.5, metadata=spec(float, gt=1))
    window: int = field(default=400, metadata=spec(int, ge=3, le=MAX_POINTS))
    patience: int = field(default=5, metadata=spec(int, ge=1, le=MAX_POINTS))
    noise: float = field(default=4.0, metadata=spec(float, ge=0))

    finite_only = True
    second_opinion = True  # a jump that stays up is the spike rule's incident, told once

    def default_history(self) -> int:
        # A floor from at least 15 points: a run's first few values (its warm-up) are no minimum.
        return self.patience + 15

    def fewest(self) -> int:
        return self.patience + 3  # a floor and a step-to-step change from at least 3 values

    @property
    def least(self) -> int:
        """Values before the last `patience` that the floor and the noise are taken from at the least."""
        return min(self.window, self.history - self.patience)

    @property
    def lookback(self) -> int:
        return self.window + 2 * self.patience - 1

    def judgement(self, v: pl.Expr, per_unit: PerUnit) -> Judgement:
        p, w, least = self.patience, self.window, self.least
        level = per_unit(v.rolling_min(p, min_samples=p))
        floor = per_unit(v.rolling_mean(p, min_samples=p).rolling_min(w, min_samples=max(1, least - p + 1)).shift(p))
        noise = per_unit(v.diff().abs().rolling_mean(w, min_samples=least - 1).shift(p))
        limit = floor * self.factor
        condition = (floor > 0) & (level > limit) & (level - floor > noise * self.noise)
        return Judgement(condition=condition, baseline=floor, limit=limit, onset=p - 1)
