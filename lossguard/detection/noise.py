"""A run too noisy for its loss rule: the rule keeps firing on the loss's own batch-to-batch spread.

A small model's per-batch loss moves by 2x from one batch to the next, so the seed rule (2x the mean
of the previous 9) fires dozens of times on a clean run. That is a fact about the run and the rule,
worth one note rather than dozens of spikes to read: how often it fired, which incidents stand far
outside the run's noise (an LR jump's 30x, a NaN), and the preset that, judged on this very run,
keeps those and drops the rest. Pure: a run's incidents in, and a way to judge it with other rules.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

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
    presets: Sequence[str], judged_with: Callable[[str], Sequence[Incident]],
) -> Noisy | None:
    """The note for a run whose loss rule fired NOISY_FIRINGS times and NOISY_PER_1000 per 1,000 of
    its `points` loss points, else None. `judged_with(preset)`: the run's incidents under a preset,
    asked only of a noisy run."""
    by_rule: dict[str, list[Incident]] = {}
    for inc in _loss_spikes(incidents):
        by_rule.setdefault(inc.rule, []).append(inc)
    if not by_rule or not points:
        return None
    rule, fired = max(by_rule.items(), key=lambda kv: len(kv[1]))
    if len(fired) < NOISY_FIRINGS or 1000.0 * len(fired) / points < NOISY_PER_1000:
        return None
    ratios = [i.ratio for i in fired if i.ratio is not None]
    typical = statistics.median(ratios) if ratios else None
    far = [i for i in fired if i.ratio is None or (typical is not None and i.ratio >= OUTSIDE * typical)]
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
