"""What a scan keeps of one run: its analysis and what its reports draw (a module of its own so
that the audit and what it calls on its reports, report.ranks, share it)."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..detection.engine import RunAnalysis
from ..ingest.problems import Problem
from ..model import Incident


@dataclass(frozen=True)
class Curve:
    steps: tuple[int, ...]
    values: tuple[float, ...]


@dataclass(frozen=True)
class RunReport:
    analysis: RunAnalysis
    source: str
    formats: tuple[str, ...]
    files: int
    problems: tuple[Problem, ...] = ()
    curves: dict[str, Curve] = field(default_factory=dict)
    sparks: dict[tuple[str, int], tuple[float, ...]] = field(default_factory=dict)
    """Loss values around each incident, keyed by (rule, step)."""
    ignored: int = 0
    """Its files passed over in silence (databases no tracker wrote): no file of the scan's total."""
    paths: tuple[str, ...] = ()
    """Its files (`source` is their folder when they are several)."""
    failed_at: float | None = None
    """When torch recorded its crash's failure (texttail.error_time), to tell a run's ranks' first failure."""

    @property
    def run(self) -> str:
        return self.analysis.run

    @property
    def incidents(self) -> tuple[Incident, ...]:
        return self.analysis.incidents
