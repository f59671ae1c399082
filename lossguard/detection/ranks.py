"""A run written per rank, judged as one: each rank's stream is judged on its own (data parallel
replicas each log a loss; interleaving them by step would make every step a jump), then what the
ranks saw is put together here. The same spike on several replicas at the same steps is one
incident naming them; a rank slower than the others, or a replica whose loss left the others', is
a `straggler` finding of its own. Pure: series and findings in, findings out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

import numpy as np

from ..model import Incident

SLOWER = 1.5
"""A straggler's step time, against the median of the other ranks' at the same steps."""
APART = 0.5
"""A diverging replica's loss departs from the others' median by more than this share of it."""
PATIENCE = 5
"""Consecutive points a rank must stay apart: one slow step (a checkpoint save on rank 0) is no straggler."""
STRAGGLER = "straggler"

Series = tuple[np.ndarray, np.ndarray]
"""(steps, values) of one rank's stream."""


def _span(inc: Incident) -> tuple[int, int]:
    return inc.step, max(inc.step, inc.peak_step, inc.last_flagged_step or inc.step)


def merged(per_rank: Sequence[tuple[str, Sequence[Incident]]], *, run: str) -> tuple[Incident, ...]:
    """The run's incidents from its ranks' (rank, incidents): each names its rank, and those of one
    rule on one timeline whose steps overlap are one incident, the earliest rank's, naming all."""
    out: list[Incident] = []
    for rank, incidents in sorted(per_rank, key=lambda p: int(p[0])):
        for inc in incidents:
            inc = replace(inc, run=run, ranks=inc.ranks or (rank,))
            first, last = _span(inc)
            for k, seen in enumerate(out):
                lo, hi = _span(seen)
                if seen.rule == inc.rule and seen.later_timeline == inc.later_timeline and first <= hi and lo <= last:
                    out[k] = replace(seen, ranks=tuple(dict.fromkeys((*seen.ranks, *inc.ranks))), host=seen.host or inc.host)
                    break
            else:
                out.append(inc)
    return tuple(sorted(out, key=lambda i: (i.step, i.rule)))


def stragglers(series: Mapping[str, Series], *, run: str, metric: str) -> tuple[Incident, ...]:
    """The ranks whose `metric` stays apart from the other ranks' median at the same steps for
    PATIENCE points: slower (`step_time`, SLOWER times), or a loss APART from the replicas'. A loss
    needs three ranks logging it (of two replicas apart, neither is the odd one); a step time two
    (the slower one is)."""
    ranks = {r: _finite(s) for r, s in series.items()}
    ranks = {r: s for r, s in ranks.items() if s[0].size >= PATIENCE}
    if len(ranks) < (2 if metric == "step_time" else 3):
        return ()
    found = []
    for rank, (steps, values) in sorted(ranks.items(), key=lambda p: int(p[0])):
        others = [np.interp(steps, s, v, left=np.nan, right=np.nan) for r, (s, v) in ranks.items() if r != rank]
        median = _median_where_any(others)
        if metric == "step_time":
            apart = values > SLOWER * median
        else:
            apart = np.abs(values - median) > APART * np.abs(median)
        inc = _first_streak(apart, steps, values, median, run=run, rank=rank, metric=metric)
        if inc is not None:
            found.append(inc)
    return tuple(found)


def _finite(s: Series) -> Series:
    steps, values = np.asarray(s[0], dtype=np.int64), np.asarray(s[1], dtype=float)
    keep = np.isfinite(values)
    return steps[keep], values[keep]


def _median_where_any(others: list[np.ndarray]) -> np.ndarray:
    """The median of the others' values at each step, NaN where none of them covers the step."""
    stack = np.vstack(others)
    out = np.full(stack.shape[1], np.nan)
    covered = ~np.isnan(stack).all(axis=0)
    out[covered] = np.nanmedian(stack[:, covered], axis=0)
    return out


def _first_streak(apart: np.ndarray, steps: np.ndarray, values: np.ndarray, median: np.ndarray, *, run: str, rank: str, metric: str) -> Incident | None:
    """The first PATIENCE points in a row apart (where the others were there to compare), as a finding."""
    apart = apart & ~np.isnan(median)
    count = 0
    for i, flag in enumerate(apart):
        count = count + 1 if flag else 0
        if count < PATIENCE:
            continue
        start = i - PATIENCE + 1
        stop = start
        while stop < apart.size and apart[stop]:
            stop += 1
        span = slice(start, stop)
        peak = start + int(np.argmax(np.abs(values[span] - median[span])))
        return Incident(
            run=run, metric=metric, rule=STRAGGLER if metric == "step_time" else "diverging-replica", kind=STRAGGLER,
            severity="warning", step=int(steps[start]), peak_step=int(steps[peak]), value=float(values[peak]),
            baseline=float(median[peak]), threshold=float(median[peak] * (SLOWER if metric == "step_time" else 1 + APART)),
            end_step=int(steps[stop]) if stop < steps.size else None, last_flagged_step=int(steps[stop - 1]),
            points=stop - start, ranks=(rank,),
        )
    return None
