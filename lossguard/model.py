"""The domain objects that leave the engine: immutable, hashable, with a stable JSON form shared by
`scan --format json` and the daemon."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace


def json_number(value: float | None) -> float | str | None:
    """JSON has no NaN/Infinity: they are written as the strings every JSON parser can carry."""
    if value is None:
        return None
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    return value


@dataclass(frozen=True)
class Cause:
    cause: str
    confidence: float
    evidence: str
    suggestion: str

    def to_json(self) -> dict[str, object]:
        return {"cause": self.cause, "confidence": round(self.confidence, 3), "evidence": self.evidence, "suggestion": self.suggestion}


@dataclass(frozen=True)
class Incident:
    run: str
    metric: str
    rule: str
    kind: str
    severity: str
    step: int
    """First step of the incident (for patience rules, the first of the consecutive points)."""
    peak_step: int
    value: float
    """The peak value (for non-finite incidents, the first non-finite value)."""
    baseline: float | None
    """What the rule compared against just before the incident (window mean, EWM, bound...)."""
    threshold: float | None
    end_step: int | None = None
    """First step of the recovery (back under the threshold for `recovery` points); None while open."""
    last_flagged_step: int | None = None
    points: int = 1
    """Points of the incident that the rule flagged."""
    segment: int = 0
    causes: tuple[Cause, ...] = field(default=())

    @property
    def ratio(self) -> float | None:
        if self.baseline is None or self.baseline == 0 or not math.isfinite(self.value):
            return None
        return self.value / self.baseline

    @property
    def key(self) -> tuple[str, str, int]:
        return (self.run, self.rule, self.step)

    def with_causes(self, causes: tuple[Cause, ...]) -> Incident:
        return replace(self, causes=causes)

    def to_json(self) -> dict[str, object]:
        ratio = self.ratio
        return {
            "run": self.run,
            "metric": self.metric,
            "rule": self.rule,
            "kind": self.kind,
            "severity": self.severity,
            "step": self.step,
            "peak_step": self.peak_step,
            "end_step": self.end_step,
            "value": json_number(self.value),
            "baseline": json_number(self.baseline),
            "threshold": json_number(self.threshold),
            "ratio": None if ratio is None else round(ratio, 4),
            "points": self.points,
            "causes": [c.to_json() for c in self.causes],
        }
