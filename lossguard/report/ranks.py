"""A scan's reports of one run written per rank, one report: each rank's stream was read and judged
on its own (model.ranked names them); the run's report is the one of the rank that logs the loss
(with pipeline parallelism only the last stage does), with every rank's findings, put together by
detection.ranks, and the stragglers among its ranks. Of the crashes its ranks ended in, the first
failure is the run's (the others' errors followed from it: a peer gone, a collective broken), and
the launcher's own output, holding torchrun's table of the same failure, is not a run of its own."""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np

from ..detection import ranks
from ..ingest.reader import UNRECOGNISED
from ..ingest.sources.texttail import torchrun_rank
from ..model import Incident, split_rank
from .runs import Curve, RunReport



def combined(reports: Sequence[RunReport], *, judged: Callable[[RunReport], RunReport]) -> list[RunReport]:
    """The reports, those of a run's ranks made one (in the place of its first rank's); `judged`:
    a report with the crash its console logs end in (a launcher's output joining a run is read
    again with it, at the run's last step)."""
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
    return _launchers_folded([_one(item, groups[item]) if isinstance(item, str) else item for item in out], judged=judged)


def _launchers_folded(reports: list[RunReport], *, judged: Callable[[RunReport], RunReport]) -> list[RunReport]:
    """A launcher's output (`torchrun ... > launcher.log`, a SLURM `.out`) read as a run of no
    metrics whose crash is torchrun's table naming the error file of a run in this scan: that run's
    file, its crash that run's when it has none of its own (its ranks wrote no traceback), else the
    same failure said twice. Known by the folder the table names (`<run_id>_<random>`, made by
    mkdtemp: one job's attempt), not by the absolute path, which may be another machine's."""
    by_folder = {r.run.rsplit("/", 1)[-1]: k for k, r in enumerate(reports) if any(torchrun_rank(Path(p)) is not None for p in r.paths)}
    out = list(reports)
    gone: set[int] = set()
    for k, rep in enumerate(reports):
        if rep.formats or not rep.incidents or any(i.kind != "crash" for i in rep.incidents):
            continue
        named = {ranks.launched(i) for i in rep.incidents} - {None}
        target = by_folder.get(next(iter(named))) if len(named) == 1 else None  # type: ignore[arg-type]
        if target is None or target == k:
            continue
        into = out[target]
        crashed = any(i.kind == "crash" for i in into.incidents)
        joined = replace(
            into, analysis=replace(into.analysis, incidents=tuple(_hosted(i, rep.incidents) for i in into.incidents)),
            paths=(*into.paths, *rep.paths), files=into.files + rep.files, problems=(*into.problems, *rep.problems),
        )
        out[target] = joined if crashed else judged(joined)
        gone.add(k)
    return [r for k, r in enumerate(out) if k not in gone]


def _hosted(inc: Incident, told: tuple[Incident, ...]) -> Incident:
    """The run's crash with the host the launcher's table gives for its rank (a rank's own output
    does not say which machine it ran on)."""
    host = next((t.host for t in told if t.host and t.ranks and t.ranks == inc.ranks), None)
    if inc.kind != "crash" or inc.host or host is None:
        return inc
    return replace(inc, host=host, error=f"{inc.error} ({host})" if inc.error else inc.error)


def _first_failure(per_rank: list[tuple[str, RunReport]]) -> list[tuple[str, RunReport]]:
    """The ranks' reports, the crashes of all but the first to fail taken out (by the times torch
    recorded, the lowest rank of equals or of none): one failure ends a job, the others follow."""
    crashed = [(rank, rep) for rank, rep in per_rank if any(i.kind == "crash" for i in rep.incidents)]
    if len(crashed) < 2:
        return per_rank
    first = min(crashed, key=lambda p: (math.inf if p[1].failed_at is None else p[1].failed_at, int(p[0])))[0]
    return [(rank, rep if rank == first else _no_crash(rep)) for rank, rep in per_rank]


def _no_crash(rep: RunReport) -> RunReport:
    kept: tuple[Incident, ...] = tuple(i for i in rep.incidents if i.kind != "crash")
    return replace(rep, analysis=replace(rep.analysis, incidents=kept))


def _one(run: str, per_rank: list[tuple[str, RunReport]]) -> RunReport:
    # The rank that logs the loss speaks for the run (the most loss points; the lowest rank of equals).
    speaker = max(per_rank, key=lambda p: (p[1].analysis.steps, -int(p[0])))[1]
    per_rank = _first_failure(per_rank)
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
        problems=tuple(p for _, r in per_rank for p in r.problems if not _quiet_stderr(p.source, p.message, analysis.steps)),
        sparks={**sparks, **speaker.sparks},
        ignored=sum(r.ignored for _, r in per_rank), paths=paths,
    )


def _series(curve: Curve | None) -> ranks.Series:
    assert curve is not None
    return np.asarray(curve.steps, dtype=np.int64), np.asarray(curve.values, dtype=float)


def _quiet_stderr(source: str, message: str, steps: int) -> bool:
    """A rank's `stderr.log` of torchrun's layout with no metrics, in a run whose ranks logged some:
    the warnings and tracebacks it holds are read for crashes; no warning of its own (a job of 512
    ranks would say it 512 times)."""
    return message == UNRECOGNISED and steps > 0 and os.path.basename(source) == "stderr.log" and torchrun_rank(Path(source)) is not None
