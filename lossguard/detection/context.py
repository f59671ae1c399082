"""What the cause labeller may look at: a run's context streams by step (loss, LR, grad norm, loss
scale, the tags DeepSpeed and Megatron print) and its incidents."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

import numpy as np
import polars as pl

from ..model import Incident


@dataclass(frozen=True)
class Series:
    steps: np.ndarray
    values: np.ndarray

    @classmethod
    def of(cls, frame: pl.DataFrame | None) -> Series | None:
        if frame is None or not frame.height:
            return None
        return cls(frame.get_column("step").to_numpy(), frame.get_column("value").to_numpy())

    def between(self, lo: float, hi: float) -> tuple[np.ndarray, np.ndarray]:
        a, b = np.searchsorted(self.steps, lo, "left"), np.searchsorted(self.steps, hi, "right")
        return self.steps[a:b], self.values[a:b]

    def before(self, step: float, n: int) -> np.ndarray:
        i = np.searchsorted(self.steps, step, "left")
        return self.values[max(0, i - n) : i]


@dataclass(frozen=True)
class RunContext:
    """What the labeller may look at: the run's context streams (sorted by step) and its incidents."""

    loss: Series | None
    lr: Series | None = None
    grad_norm: Series | None = None
    loss_scale: Series | None = None
    overflow: Series | None = None
    skipped: Series | None = None
    nan_iterations: Series | None = None
    eval_loss: Series | None = None
    step_time: Series | None = None
    throughput: Series | None = None
    incidents: tuple[Incident, ...] = field(default=())
    timelines: Mapping[str, pl.DataFrame] = field(default_factory=dict)
    """The context streams with their segments (step, value, segment; a step going back is a resume),
    for `as_of`. The streams above hold, for each step, the last value written: after a resume the
    replay's, which is right for the replay and wrong for the timeline it replaced."""

    def as_of(self, back: int) -> RunContext:
        """The context as it stood `back` resumes before the end: each stream's segments up to that
        one (the later write of a step winning within them). A spike just before a crash is then
        explained by the grad norms logged at it, not by the clean ones of the replay. A stream that
        saw fewer resumes than that (logged later, or its tail is short) keeps all it has."""
        if back <= 0 or not self.timelines:
            return self
        changed = {}
        for name, points in self.timelines.items():
            upto = (int(points.get_column("segment").max()) if points.height else 0) - back
            if upto >= 0:
                kept = points.filter(pl.col("segment") <= upto)
                changed[name] = Series.of(kept.unique(subset=["step"], keep="last", maintain_order=True).sort("step").select("step", "value"))
        return replace(self, **changed)

    @property
    def interval(self) -> float:
        """Typical steps between two loss points (HF logs every 500 steps, nanoGPT every step)."""
        if self.loss is None or self.loss.steps.size < 2:
            return 1.0
        d = np.diff(self.loss.steps)
        d = d[d > 0]
        return float(np.median(d)) if d.size else 1.0
