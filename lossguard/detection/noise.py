"""A run too noisy for its loss rule: the rule keeps firing on the loss's own batch-to-batch spread.

A small model's per-batch loss moves by 2x from one batch to the next, so the seed rule (2x the mean
of the previous 9) fires dozens of times on a clean run. That is a fact about the run and the rule,
worth one note rather than dozens of spikes to read: how often it fired, which incidents stand far
outside the run's noise (an LR jump's 30x, a NaN), and the preset that, judged on this very run,
keeps those and drops the rest. Pure: a run's incidents in, and a way to judge it with other rules.

One judge for `scan` and `watch`: a firing is within the run's noise (`within_noise`) when its ratio
is at most SPREADS of the loss's batch-to-batch spread (`spread_before`: the median step-to-step
change of log(loss) over the SPREAD_POINTS before it) and under OUTSIDE x the rule's usual firing
(the median ratio of its firings). A run is noisy for its rule (`is_noisy`) when NOISY_FIRINGS of
its firings are within its noise, at NOISY_PER_1000 per 1,000 loss points. Where they differ: `scan`
sees the whole run (the usual firing is the median of all its firings; the presets are backtested
on the whole run), the daemon only the past (`fold`: the usual firing is the median of the earlier
ones; with no preset backtest over a tail, its note names the ratio a rule must exceed).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from ..model import Incident

NOISY_FIRINGS = 5
"""Firings of one loss rule, at the least, before a run is called noisy for it."""
NOISY_PER_1000 = 5.0
"""Firings per 1,000 loss points from which a run is noisy for the rule: the clean real runs of the
corpus raise none, a small MLP's per-batch loss 40-60 (tests/fixtures/real_trainers)."""
OUTSIDE = 4.0
"""An incident at least this many times the median firing's ratio (or a NaN) stands outside the
run's noise: what a better-fitted rule must still flag."""
NEAR = 3
"""Steps (in logged intervals) around an incident within which another rule's incident is the same."""
SPREADS = 5.0
"""A firing whose log-ratio is at most this many of the loss's batch-to-batch spreads is the loss's
own movement. On the real trainers' small MLP (tests/fixtures/real_trainers) every firing of the
clean runs is at most 3.8 spreads and the LR jumps 6.6 and 8.7; the synthetic runs' spikes on a
flat loss are 60-80."""
SPREAD_POINTS = 64
"""Loss points before a firing over which its run's spread is measured (the daemon's tail keeps them)."""
MIN_SPREAD_POINTS = 9
"""Fewer finite positive points than this before a firing: no spread is measured, nothing is noise."""


def spread_before(steps: np.ndarray, values: np.ndarray, step: int) -> float | None:
    """The loss's batch-to-batch spread before `step`: the median |log(v[t] / v[t-1])| over the last
    SPREAD_POINTS points before it (finite and positive ones: a log-ratio needs both). None: too few."""
    before = values[steps < step][-SPREAD_POINTS:]
    before = before[np.isfinite(before) & (before > 0)]
    if before.size < MIN_SPREAD_POINTS:
        return None
    return float(np.median(np.abs(np.diff(np.log(before)))))


def usual_ratio(firings: Sequence[Incident]) -> float | None:
    """The rule's usual firing: the median ratio of its firings (None: none with a ratio)."""
    ratios = [i.ratio for i in firings if i.ratio is not None]
    return statistics.median(ratios) if ratios else None


def within_noise(inc: Incident, *, spread: float | None, usual: float | None) -> bool:
    """The firing is the loss's own movement: a finite ratio at most SPREADS spreads, and under
    OUTSIDE x the rule's `usual` firing (None: no firing yet to compare with)."""
    ratio = inc.ratio
    if ratio is None or ratio <= 0 or spread is None or spread <= 0:
        return False
    return math.log(ratio) <= SPREADS * spread and (usual is None or ratio < OUTSIDE * usual)


def noise_ceiling(spread: float) -> float:
    """The largest ratio within a spread's noise: what a ratio rule must exceed to stay quiet on it."""
    return math.exp(SPREADS * spread)


def is_noisy(within: int, points: int) -> bool:
    """NOISY_FIRINGS firings within the noise, at NOISY_PER_1000 per 1,000 of `points` loss points."""
    return within >= NOISY_FIRINGS and points > 0 and 1000.0 * within / points >= NOISY_PER_1000


def foldable(inc: Incident) -> bool:
    """A loss rule's spike with a ratio: what noise can explain (a NaN, a threshold crossed, a grad
    norm, a replica apart from the others cannot be folded)."""
    return inc.metric == "loss" and inc.kind not in ("nonfinite", "straggler") and inc.ratio is not None


def fold(inc: Incident, *, earlier: Sequence[Incident], spread: float | None) -> bool:
    """The daemon's judgement, from the past alone: fold the firing into its run's noisy note
    rather than alert on it. `earlier`: the rule's firings on the run before it (their median is
    the usual firing); `spread`: spread_before its first step."""
    return foldable(inc) and within_noise(inc, spread=spread, usual=usual_ratio(earlier))


@dataclass(frozen=True)
class Noisy:
    """The run's note: its loss rule `rule` fired `firings` times in `points` loss points; the
    incidents outside the noise (step, ratio); the preset that keeps them and raises the fewest
    incidents on this run, with how many it raises in all (None: no preset keeps them all)."""

    run: str
    rule: str
    firings: int
    points: int
    outside: tuple[tuple[int, float | None], ...]
    preset: str | None
    preset_raises: int

    @property
    def per_1000(self) -> float:
        return 1000.0 * self.firings / self.points if self.points else 0.0

    @property
    def message(self) -> str:
        said = (f"noisy for its rule: {self.rule} fired {self.firings} times in {self.points} loss points "
                f"({self.per_1000:.1f} per 1,000), on the loss's own batch-to-batch spread")
        far = ", ".join(f"{'NaN' if r is None else f'{r:.1f}x'} at step {s}" for s, r in self.outside[:3])
        if not self.outside:
            said += "; nothing stands outside that noise"
            if self.preset is not None:
                return f"{said}; the {self.preset} preset, judged on this run, raises {self.preset_raises}: --rules {self.preset}"
            return f"{said}; no preset raises fewer alarms: raise the rule's factor or window (--compare-rules)"
        kept = f"the {len(self.outside)} incident{'s' if len(self.outside) != 1 else ''} outside that noise ({far})"
        if self.preset is not None:
            return f"{said}; the {self.preset} preset, judged on this run, keeps {kept} and raises {self.preset_raises} in all: --rules {self.preset}"
        return f"{said}; no preset keeps {kept} with fewer alarms: raise the rule's factor or window (--compare-rules)"

    def to_report(self, source: str) -> dict[str, object]:
        """A run's entry under `warnings` in `scan --format json`."""
        return {
            "kind": "noisy", "source": source, "line": None, "offset": None, "message": self.message,
            "rule": self.rule, "firings": self.firings, "points": self.points, "per_1000": round(self.per_1000, 2),
            "outside": [{"step": s, "ratio": r} for s, r in self.outside], "preset": self.preset, "preset_raises": self.preset_raises,
        }


def _loss_spikes(incidents: Sequence[Incident]) -> list[Incident]:
    return [i for i in incidents if i.metric == "loss" and i.kind != "nonfinite"]


def _near(a: Incident, b: Incident, gap: float) -> bool:
    a_end = a.end_step if a.end_step is not None else max(a.step, a.peak_step)
    b_end = b.end_step if b.end_step is not None else max(b.step, b.peak_step)
    return a.step - gap <= b_end and b.step - gap <= a_end


def noisy(
    run: str, incidents: Sequence[Incident], *, points: int, interval: float,
    presets: Sequence[str], judged_with: Callable[[str], Sequence[Incident]], loss: tuple[np.ndarray, np.ndarray],
) -> Noisy | None:
    """The note for a run whose loss rule fired NOISY_FIRINGS times within its noise, at
    NOISY_PER_1000 per 1,000 of its `points` loss points, else None. `judged_with(preset)`: the
    run's incidents under a preset, asked only of a noisy run; `loss`: its (steps, values)."""
    by_rule: dict[str, list[Incident]] = {}
    for inc in _loss_spikes(incidents):
        by_rule.setdefault(inc.rule, []).append(inc)
    if not by_rule or not points:
        return None
    rule, fired = max(by_rule.items(), key=lambda kv: len(kv[1]))
    if len(fired) < NOISY_FIRINGS:
        return None
    typical = usual_ratio(fired)
    far = [i for i in fired if not within_noise(i, spread=spread_before(*loss, i.step), usual=typical)]
    if not is_noisy(len(fired) - len(far), points):
        return None
    gap = NEAR * interval
    best: tuple[int, str] | None = None
    for name in presets:
        theirs = _loss_spikes(judged_with(name))
        if len(theirs) >= len(fired) or not all(any(_near(f, t, gap) for t in theirs) for f in far):
            continue
        if best is None or len(theirs) < best[0]:
            best = (len(theirs), name)
    return Noisy(
        run=run, rule=rule, firings=len(fired), points=points,
        outside=tuple((i.step, i.ratio) for i in far), preset=best[1] if best else None, preset_raises=best[0] if best else 0,
    )
