"""A scan's reports of one run written per rank, one report: each rank's stream was read and judged
on its own (model.ranked names them); the run's report is the one of the rank that logs the loss
(with pipeline parallelism only the last stage does), with every rank's findings, put together by
detection.ranks, and the stragglers among its ranks."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from ..detection import ranks
from ..model import Incident, split_rank
from .runs import Curve, RunReport



def combined(reports: Sequence[RunReport]) -> list[RunReport]:
    """The reports, those of a run's ranks made one (in the place of its first rank's)."""
    groups: dict[str, list[tuple[str, RunReport]]] = {}
    out: list[RunReport | str] = []
    for rep in reports:
        run, rank = split_rank(rep.run)
        if rank is None:
            out.append(rep)
            continue
        if run not in groups:
            out.append(run)
        groups.setdefault(run, []).append((rank, rep))
    return [_one(item, groups[item]) if isinstance(item, str) else item for item in out]


def _one(run: str, per_rank: list[tuple[str, RunReport]]) -> RunReport:
    # The rank that logs the loss speaks for the run (the most loss points; the lowest rank of equals).
    speaker = max(per_rank, key=lambda p: (p[1].analysis.steps, -int(p[0])))[1]
    apart: dict[str, list[Incident]] = {}
    for metric in ranks.COMPARED:
        series = {rank: _series(rep.curves.get(metric)) for rank, rep in per_rank if metric in rep.curves}
        for inc in ranks.stragglers(series, run=run, metric=metric):
            apart.setdefault(inc.ranks[0], []).append(inc)
    # (Ranks apart over the same steps, one slow node, are one finding, as the same spike on several is.)
    found = ranks.one_slowness(ranks.merged([(rank, (*rep.incidents, *apart.get(rank, ()))) for rank, rep in per_rank], run=run))
    firsts = [r.analysis.first_step for _, r in per_rank if r.analysis.first_step is not None]
    lasts = [r.analysis.last_step for _, r in per_rank if r.analysis.last_step is not None]
    analysis = replace(
        speaker.analysis, run=run, incidents=found,
        first_step=min(firsts) if firsts else None, last_step=max(lasts) if lasts else None,
    )
    paths = tuple(p for _, r in per_rank for p in r.paths)
    sparks = {k: v for _, r in per_rank for k, v in r.sparks.items()}
    return replace(
        speaker, analysis=analysis, source=os.path.commonpath(paths) if len(paths) > 1 else speaker.source,
        formats=tuple(dict.fromkeys(f for _, r in per_rank for f in r.formats)), files=sum(r.files for _, r in per_rank),
        problems=tuple(p for _, r in per_rank for p in r.problems), sparks={**sparks, **speaker.sparks},
        ignored=sum(r.ignored for _, r in per_rank), paths=paths,
    )


def _series(curve: Curve | None) -> ranks.Series:
    assert curve is not None
    return np.asarray(curve.steps, dtype=np.int64), np.asarray(curve.values, dtype=float)
