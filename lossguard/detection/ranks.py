"""A run written per rank, judged as one: each rank's stream is judged on its own (data parallel
replicas each log a loss; interleaving them by step would make every step a jump), then what the
ranks saw is put together here. The same spike on several replicas at the same steps is one
incident naming them; a rank slower than the others, or a replica whose loss left the others', is
a `straggler` finding of its own. Pure: series and findings in, findings out.
"""

from __future__ import annotations

import math
import re
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import replace

import numpy as np

from ..model import Incident, split_rank

SLOWER = 1.5
"""A straggler's step time, against the median of the other ranks' at the same steps."""
APART = 0.5
"""A diverging replica's loss departs from the others' median by more than this share of it."""
PATIENCE = 5
"""Consecutive points a rank must stay apart: one slow step (a checkpoint save on rank 0) is no straggler."""
STRAGGLER = "straggler"
COMPARED = ("step_time", "loss")
"""The metrics whose ranks are compared: a straggler's pace, a diverging replica's loss."""

Series = tuple[np.ndarray, np.ndarray]
"""(steps, values) of one rank's stream."""


def span(inc: Incident) -> tuple[int, int]:
    """The steps an incident covers: its first to its last flagged (or its peak)."""
    return inc.step, max(inc.step, inc.peak_step, inc.last_flagged_step or inc.step)


def same_event(a: Incident, b: Incident) -> bool:
    """Two ranks' incidents are one event of their run: crashes while both are open (a rank that
    fails takes the others down, each logging its own error, at the steps each had reached), else
    one rule on one timeline over steps that overlap."""
    if a.later_timeline != b.later_timeline:
        return False
    if a.is_crash or b.is_crash:
        return a.is_crash and b.is_crash and (not (a.over or b.over) or _overlap(a, b))
    return a.rule == b.rule and _overlap(a, b)


def same_slowness(a: Incident, b: Incident) -> bool:
    """A rank's slowdown against its own past (kind `throughput`) and its straggling behind the
    other ranks, over overlapping steps: one slow rank, told once."""
    kinds = {a.kind, b.kind}
    return (a.run == b.run and kinds == {"throughput", STRAGGLER} and STRAGGLER in (a.rule, b.rule)
            and a.later_timeline == b.later_timeline and _overlap(a, b))


def one_slowness(found: Sequence[Incident]) -> tuple[Incident, ...]:
    """A run's findings less the slowdowns (kind `throughput`) of ranks that a straggler finding
    over the same steps already names: a rank behind the others is said as that, once."""
    behind = [i for i in found if i.rule == STRAGGLER]
    return tuple(i for i in found if not (
        i.kind == "throughput" and any(set(i.rank_list) <= set(s.rank_list) and _overlap(i, s) for s in behind)))


def _overlap(a: Incident, b: Incident) -> bool:
    (lo, hi), (first, last) = span(a), span(b)
    return first <= hi and lo <= last


def with_ranks(inc: Incident, *ranks: str, host: str | None = None) -> Incident:
    """`inc` naming `ranks` too (in rank order), and `host` where it had none."""
    named = tuple(sorted(dict.fromkeys((*inc.rank_list, *ranks)), key=int))
    return replace(inc, ranks=named, host=inc.host or host)


def merged(per_rank: Sequence[tuple[str, Sequence[Incident]]], *, run: str) -> tuple[Incident, ...]:
    """The run's incidents from its ranks' (rank, incidents): each names its rank, and one event
    seen on several ranks (same_event) is one incident, the earliest rank's, naming all."""
    out: list[Incident] = []
    for rank, incidents in sorted(per_rank, key=lambda p: int(p[0])):
        for inc in incidents:
            inc = replace(inc, run=run, ranks=inc.ranks or (rank,))
            for k, seen in enumerate(out):
                if same_event(seen, inc):
                    out[k] = with_ranks(seen, *inc.ranks, host=inc.host)
                    break
            else:
                out.append(inc)
    return tuple(sorted(out, key=lambda i: (i.step, i.rule)))


ERROR_FILE = re.compile(r"error_file\s*:\s*(?P<path>\S+/attempt_\d+/\d+/error\.json)")
"""A ChildFailedError table's `error_file:` line (torch/distributed/elastic/multiprocessing/errors/
__init__.py), which names the run folder torchrun made under `--log-dir` (`<run_id>_<random>`)."""


def launched(inc: Incident) -> str | None:
    """The torchrun run folder (`<run_id>_<random>`, made by mkdtemp: one job's attempt) whose
    failure a launcher's crash is: the folder its table's error files are in, where they name one."""
    named = {m["path"].split("/")[-4] for line in inc.lines for m in [ERROR_FILE.search(line)] if m} if inc.is_crash else set()
    return next(iter(named)) if len(named) == 1 else None


AFTERMATH = ("crash-nccl-timeout", "crash-killed", "crash-worker-failed")
"""What the other ranks die of when one fails: a collective that waits on it times out, the launcher
kills them, the launcher says a worker failed. The rank's own error is the one to name."""


def causes_first(crashes: Sequence[Incident], failed_at: Sequence[float | None]) -> list[int]:
    """The order to raise ranks' crashes in (indexes into `crashes`; `failed_at`: when torch
    recorded each failure, texttail.error_time): the ranks' own errors before the aftermath of
    another rank's, the first to fail first, so the alert of the run's crash names what went wrong."""
    return sorted(range(len(crashes)), key=lambda k: (crashes[k].rule in AFTERMATH, math.inf if failed_at[k] is None else failed_at[k]))


def together(found: Sequence[Incident]) -> list[Incident]:
    """The incidents one pass of the daemon found, each naming the ranks of its run that saw the
    same event in that pass (its rank streams are runs of their own there: `job [rank 1]`), so the
    alert of the first one raised names them all and the others join it. Within a run's rule and
    timeline, the incidents over overlapping steps (or crashes still open) are one event, found in
    one sweep in step order (a job of 512 ranks spiking at once, a first start's history)."""
    out = list(found)
    groups: dict[tuple[str, int, str, bool], list[int]] = {}
    for k, inc in enumerate(found):
        run, rank = split_rank(inc.run)
        if rank is not None:
            # (Over, or still open, apart: an alert that resolves names no rank still in trouble.)
            groups.setdefault((run, inc.later_timeline, "" if inc.is_crash else inc.rule, inc.over), []).append(k)
    for members in groups.values():
        if len({found[k].run for k in members}) < 2:
            continue
        for event in _events(found, sorted(members, key=lambda k: span(found[k]))):
            if len({found[k].run for k in event}) > 1:
                named = tuple(sorted({r for k in event for r in found[k].rank_list}, key=int))
                host = next((found[k].host for k in event if found[k].host), None)
                for k in event:
                    out[k] = replace(found[k], ranks=named, host=found[k].host or host)
    return out


def _events(found: Sequence[Incident], members: list[int]) -> list[list[int]]:
    """`members` (in step order, of one rule or all crashes) as events: runs of incidents each
    overlapping the steps covered so far; crashes still open are one event whatever their steps."""
    events: list[list[int]] = []
    reach = None
    for k in members:
        inc = found[k]
        first, last = span(inc)
        if events and ((reach is not None and first <= reach) or (inc.is_crash and not inc.over and any(not found[j].over for j in events[-1]))):
            events[-1].append(k)
            reach = max(reach or last, last)
        else:
            events.append([k])
            reach = last
    return events


def rule_for(metric: str) -> str:
    """The finding's rule name for a rank apart in `metric`."""
    return STRAGGLER if metric == "step_time" else "diverging-replica"


def stragglers(series: Mapping[str, Series], *, run: str, metric: str, judged: Collection[str] | None = None) -> tuple[Incident, ...]:
    """The ranks whose `metric` stays apart from the other ranks' median at the same steps for
    PATIENCE points: slower (`step_time`, SLOWER times), or a loss APART from the replicas'. A loss
    needs three ranks logging it (of two replicas apart, neither is the odd one); a step time two
    (the slower one is). `judged`: the ranks to judge (the daemon's pass: those it read), each
    against all the others; None: every rank."""
    found = []
    for rank, steps, values, median, apart in _compared(series, metric=metric, judged=judged):
        inc = _first_streak(apart, steps, values, median, run=run, rank=rank, metric=metric)
        if inc is not None:
            found.append(inc)
    return tuple(found)


def back_among(series: Mapping[str, Series], rank: str, *, metric: str, after: int) -> int | None:
    """The step from which `rank`, apart until step `after`, is among the others again: the first of
    its last points after `after`, PATIENCE or more, compared with the others' and none apart
    (None: too few such points yet, or the last is still apart). What ends a straggler the daemon
    raised when the window no longer holds its whole streak."""
    for _, steps, _, median, apart in _compared(series, metric=metric, judged={rank}):
        keep = (steps > after) & ~np.isnan(median)
        steps, apart = steps[keep], apart[keep]
        last = int(np.flatnonzero(apart)[-1]) + 1 if apart.any() else 0
        return int(steps[last]) if steps.size - last >= PATIENCE else None
    return None


def _compared(series: Mapping[str, Series], *, metric: str, judged: Collection[str] | None) -> Iterator[tuple[str, np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
    """(rank, steps, values, the others' median at those steps, apart) of each judged rank with
    PATIENCE finite points, when enough ranks log `metric` to compare (two step times, three losses)."""
    ranks = {r: _finite(s) for r, s in series.items()}
    ranks = {r: s for r, s in ranks.items() if s[0].size >= PATIENCE}
    if len(ranks) < (2 if metric == "step_time" else 3):
        return
    order = sorted(ranks, key=int)
    # Every rank on the steps any rank logged, once (a job of 512 ranks: 512 interpolations, not 512²).
    grid = np.unique(np.concatenate([ranks[r][0] for r in order]))
    on_grid = np.vstack([np.interp(grid, *ranks[r], left=np.nan, right=np.nan) for r in order])
    for i, rank in enumerate(order):
        if judged is not None and rank not in judged:
            continue
        steps, values = ranks[rank]
        median = _median_where_any(np.delete(on_grid, i, axis=0)[:, np.searchsorted(grid, steps)])
        apart = values > SLOWER * median if metric == "step_time" else np.abs(values - median) > APART * np.abs(median)
        yield rank, steps, values, median, apart


def _finite(s: Series) -> Series:
    steps, values = np.asarray(s[0], dtype=np.int64), np.asarray(s[1], dtype=float)
    keep = np.isfinite(values)
    return steps[keep], values[keep]


def _median_where_any(stack: np.ndarray) -> np.ndarray:
    """The median of the others' values at each step (a row each), NaN where none of them covers it."""
    if not np.isnan(stack).any():
        return np.median(stack, axis=0)  # (every rank at every step, as usual: nanmedian costs 10x)
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
            run=run, metric=metric, rule=rule_for(metric), kind=STRAGGLER,
            severity="warning", step=int(steps[start]), peak_step=int(steps[peak]), value=float(values[peak]),
            baseline=float(median[peak]), threshold=float(median[peak] * (SLOWER if metric == "step_time" else 1 + APART)),
            end_step=int(steps[stop]) if stop < steps.size else None, last_flagged_step=int(steps[stop - 1]),
            points=stop - start, ranks=(rank,),
        )
    return None
