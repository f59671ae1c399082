"""The tails kept per stream between passes, and how they are cut.

Each stream keeps a tail in the state store: enough points for every rule's window, plus the span of
any incident still open, so that judging tail + new points finds exactly the incidents a full pass
would, under the same keys (run, rule, first step). The tags the labeller reads (DeepSpeed's
OVERFLOW lines, Megatron's counters) keep a tail of their own, its context in the next pass."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import polars as pl

from ..detection.causes import RunContext
from ..detection.engine import CONTEXT_TAGS, JUDGED, context_from
from ..detection.kinds import Rule
from ..detection.noise import SPREAD_POINTS
from ..detection.streams import NO_POINTS, Points, collapse_points
from ..ingest import table
from ..state import Tail

TAIL_CAP = 20_000
"""Points a stream's tail keeps at most, however long an incident stays open."""
CONTEXT_TAIL = 400
"""Points kept of the streams the labeller reads as context (every stream but the loss, and each
context tag)."""
TAIL_KEYS = (*JUDGED, *(f"tag:{tag}" for tag in CONTEXT_TAGS))
"""The tails a run keeps: one per judged stream, one per context tag."""

Tails = Mapping[tuple[str, str], Tail]
"""(run, key) -> the tail committed by the last pass (State.tails_of)."""

_NO_ROWS = table.empty()


def _holding_finite(values: np.ndarray, n: int) -> int:
    """How many last points hold `n` finite ones: statistical rules' windows count finite values
    only, so a tail cut by points alone would come up short after a run of NaNs."""
    finite = np.flatnonzero(np.isfinite(values))
    return len(values) if finite.size <= n else len(values) - int(finite[-n])


def _frame(tail: Tail) -> pl.DataFrame:
    return pl.DataFrame({"step": pl.Series(tail.steps, dtype=pl.Int64()), "value": pl.Series(tail.values, dtype=pl.Float64())})


def _as_rows(tail: Tail, *, run: str, metric: str, tag: str) -> pl.DataFrame:
    """A tail in the canonical table's shape, for the context the labeller reads."""
    return _frame(tail).select(
        pl.lit(run).alias("run"), pl.lit("").alias("source"), "step", pl.lit(metric).alias("metric"),
        pl.lit(tag).alias("tag"), "value", pl.lit(None, dtype=pl.Float64).alias("wall_time"),
    )


def windows_of(run: str, tails: Tails, new: Mapping[tuple[str, str], Points]) -> dict[str, Points]:
    """Each judged stream's window: its tail, then the points just read (`new`, by run and metric)."""
    empty = Tail.empty()
    mine = {}
    for m in JUDGED:
        tail, fresh = tails.get((run, m), empty), new.get((run, m))
        if not tail.steps.size:
            mine[m] = fresh if fresh is not None else NO_POINTS
        elif fresh is None:
            mine[m] = collapse_points(tail.steps, tail.values)
        else:
            mine[m] = collapse_points(np.concatenate([tail.steps, fresh[0]]), np.concatenate([tail.values, fresh[1]]))
    return mine


def restarted(run: str, tails: Tails, new: Mapping[tuple[str, str], Points]) -> list[str]:
    """The judged streams of `run` whose new points, read from a file's start, are another run's
    rather than the history the tail holds written again: their steps go back below the tail's
    last, and they do not repeat its points at the steps both hold (a logger that writes its whole
    file again, Lightning's metrics.csv, repeats them). Such a stream starts a timeline of its own,
    judged as `scan` judges the new file, without the earlier run's points for history: a dvclive
    folder a new `Live()` wrote again, a log a new job overwrote."""
    out = []
    for m in JUDGED:
        tail, fresh = tails.get((run, m)), new.get((run, m))
        if tail is None or not tail.steps.size or fresh is None or not fresh[0].size or fresh[0][0] >= tail.steps[-1]:
            continue
        first = fresh[2] == fresh[2][0]
        common, at_tail, at_fresh = np.intersect1d(tail.steps, fresh[0][first], return_indices=True)
        if not (common.size and np.array_equal(tail.values[at_tail], fresh[1][first][at_fresh], equal_nan=True)):
            out.append(m)
    return out


def timelines_before(run: str, tails: Tails) -> dict[str, int]:
    """What each judged stream's window segments are short of its timelines (model.Incident.
    timeline): the timeline its tail ends on, less the resumes inside the tail (the window's
    segments count from the tail's first point)."""
    out = {}
    for m in JUDGED:
        tail = tails.get((run, m))
        if tail is not None and tail.steps.size:
            out[m] = tail.timeline - int(np.count_nonzero(tail.steps[1:] < tail.steps[:-1]))
    return out


def points_before(run: str, tails: Tails) -> dict[str, int]:
    """Points each judged stream held before its tail, where its window starts (for min_history)."""
    empty = Tail.empty()
    return {m: max(0, tails.get((run, m), empty).seen - tails.get((run, m), empty).steps.size) for m in JUDGED}


def context_of(run: str, tagged: pl.DataFrame | None, windows: dict[str, Points], tails: Tails) -> RunContext:
    """Labels with the context the daemon has: each stream's window (its tail, then what just
    arrived, in the order written: a resume shows as a segment, as in `scan`), and the tags the
    labeller reads as they are (their tails, then the new rows `tagged`: the later write wins)."""
    parts = []
    for tag in CONTEXT_TAGS:
        tail = tails.get((run, f"tag:{tag}"))
        if tail is not None and tail.steps.size:
            parts.append(_as_rows(tail, run=run, metric="loss_scale" if tag.startswith("OVERFLOW") else tag, tag=tag))
    if tagged is not None:
        parts.append(tagged.select(table.COLUMNS))
    return context_from(pl.concat(parts) if parts else _NO_ROWS, windows)


def kept_tails(run: str, windows: dict[str, Points], fresh: dict[str, int], tails: Tails, active: Sequence[Rule], open_steps: list[int],
               timelines: Mapping[str, int]) -> list[tuple[str, str, Tail]]:
    """Each stream's tail to keep: windows for every rule, and the span of incidents still open
    (`open_steps`: their first steps); `fresh`: the points each stream got in this pass;
    `timelines`: timelines_before, to say which timeline each tail ends on."""
    need = max([r.lookback for r in active] + [16]) + 8
    judged = {r.metric for r in active}
    out = []
    for m, (steps, values, segments) in windows.items():
        if not steps.size:
            continue
        keep = need
        if open_steps and m in judged:
            keep = max(keep, int(np.count_nonzero(steps >= min(open_steps))) + need)
        # (The loss keeps what its spread is measured over: whether a firing is the run's noise.)
        keep = max(keep, CONTEXT_TAIL) if m != "loss" else max(keep, SPREAD_POINTS)
        keep = max(keep, _holding_finite(values, need))
        n = min(keep, TAIL_CAP)
        before = tails.get((run, m))
        timeline = timelines.get(m, 0) + int(segments[-1])
        out.append((run, m, Tail(steps[-n:], values[-n:], (before.seen if before is not None else 0) + fresh.get(m, 0), timeline)))
    return out


def kept_tag_tails(tagged: pl.DataFrame, tails: Tails) -> list[tuple[str, str, Tail]]:
    """The context tags' tails (DeepSpeed's OVERFLOW lines, Megatron's counters), for the runs
    whose new rows (`tagged`: the pass's rows of those tags) hold any."""
    out = []
    for (run, tag), rows in tagged.partition_by("run", "tag", as_dict=True, maintain_order=True).items() if tagged.height else ():
        old = tails.get((run, f"tag:{tag}"), Tail.empty())
        both = pl.concat([_frame(old), rows.select("step", "value")]).tail(CONTEXT_TAIL)
        out.append((run, f"tag:{tag}", Tail(both.get_column("step").to_numpy(), both.get_column("value").to_numpy(), old.seen + rows.height)))
    return out
