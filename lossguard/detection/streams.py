"""From the long table to the streams rules judge: one metric of one run as (step, value), in the
order the run wrote it, with ranks' duplicate rows collapsed and resumes split into segments.

A step going backwards is a resume from a checkpoint. What the run did from that step on is replaced
by the replay, so each segment is judged with the history the replay really continues from: the
points of the earlier timeline before the segment's first step.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import polars as pl

from ..ingest.vocabulary import rank_of


def stream(run_frame: pl.DataFrame, metric: str) -> pl.DataFrame:
    """(step, value, segment) of one metric; the last row wins where one step repeats in a segment."""
    return by_metric(run_frame, (metric,))[metric]


def single_valued(column: pl.Series) -> bool:
    """At most one distinct value (no nulls expected): min == max, two plain scans, where n_unique
    hashes every row (0.05 s per call on 10M points, three calls per rule)."""
    return column.len() == 0 or column.min() == column.max()


def increasing(steps: np.ndarray) -> bool:
    """Steps strictly increasing (one segment, no step written twice): the common case, which needs
    no polars call to collapse or put in order."""
    return steps.size < 2 or bool((steps[1:] > steps[:-1]).all())


def _constant(name: str, value: object, n: int, dtype: pl.DataType) -> pl.Series:
    return pl.Series(name, np.full(n, value), dtype=dtype)


def collapse(points: pl.DataFrame) -> pl.DataFrame:
    steps = points.get_column("step").to_numpy()
    if increasing(steps):
        # The common case, strictly increasing steps: one segment, nothing to collapse. (A column
        # added by hstack, not a query: the daemon runs this for every stream of every pass.)
        return points.hstack([_constant("segment", 0, points.height, pl.Int64())])
    segment, kept = replays_folded(steps, points.get_column("value").to_numpy())
    points = points.hstack([pl.Series("segment", segment, dtype=pl.Int64())])
    if not kept.all():
        points = points.filter(pl.Series(kept))
    return points.unique(subset=["segment", "step"], keep="last", maintain_order=True)


def replays_folded(steps: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each point's segment (a step going back starts one), and which points to keep: a segment
    that writes again, value for value, the points the run already holds at its steps (a run
    resumed by id that logs its history again, a rank's copy of the same curve) is no resume but
    the same history replayed: its points up to the highest step before it are left out, and
    what it logs after that continues the segment before it. Where any of its values differs from
    the one held at its step, it is a resume as before (a replay from a checkpoint that diverged).
    Compared at the steps an earlier segment holds (the daemon's window: its tail), so `scan` of a
    whole run and the daemon's tail + new points find one history where the replay is identical."""
    n = steps.size
    back = np.r_[False, steps[1:] < steps[:-1]]
    segment = np.cumsum(back)
    # The latest earlier write of each point's step, if any (a stable sort by step keeps file order).
    order = np.argsort(steps, kind="stable")
    prev = np.full(n, -1, dtype=np.int64)
    same = steps[order[1:]] == steps[order[:-1]]
    prev[order[1:][same]] = order[:-1][same]
    compared = prev >= 0
    compared[compared] = segment[prev[compared]] < segment[compared]  # (a rank's repeat within a segment is no replay)
    at = np.flatnonzero(compared)
    theirs, mine = values[prev[at]], values[at]
    equal = (theirs == mine) | (np.isnan(theirs) & np.isnan(mine))
    count = segment[-1] + 1
    held = np.bincount(segment[at], minlength=count)
    replay = (held > 0) & (held == np.bincount(segment[at], weights=equal, minlength=count))
    if not replay.any():
        return segment, np.ones(n, dtype=bool)
    top = np.maximum.accumulate(steps)
    starts = np.flatnonzero(back)
    before = np.r_[steps[0], top[starts - 1]]  # the highest step before each segment
    kept = ~(replay[segment] & (steps <= before[segment]))
    return np.cumsum(back & ~replay[segment]), kept


def by_metric(run_frame: pl.DataFrame, metrics: tuple[str, ...], *, best: dict[str, int] | None = None) -> dict[str, pl.DataFrame]:
    """Each metric's stream, from one pass over the run's table (the daemon calls this for every
    batch of new lines, so it costs a few polars calls, not a few per metric). Where several tags
    carry a metric (`loss` and `train/loss_epoch`), one does (`preferred`). `best`: the best rank a
    tag of this run has shown for each metric (the daemon's memory across passes, updated here): a
    batch whose only tag for a metric is outranked by it (an epoch mean arriving alone) gives that
    metric no points, as `scan`, which sees the whole run, reads the stream from the best tag."""
    # Only the columns a stream needs: the run's full table can be gigabytes.
    wanted = run_frame[["metric", "tag", "step", "value"]].filter(pl.col("metric").is_in(list(metrics)))
    parts = wanted.partition_by("metric", as_dict=True, maintain_order=True)
    out = {}
    for m in metrics:
        part = parts.get((m,))
        if part is None:
            out[m] = _no_points()
            continue
        tags = part.get_column("tag")
        one = single_valued(tags)
        chosen = tags[0] if one else preferred(m, part.group_by("tag", maintain_order=True).len().rows())
        if best is not None:
            rank = rank_of(chosen, m)
            if rank > best.get(m, rank):
                out[m] = _no_points()
                continue
            best[m] = rank
        if not one:
            part = part.filter(pl.col("tag") == chosen)
        out[m] = collapse(part[["step", "value"]])
    return out


Points = tuple[np.ndarray, np.ndarray, np.ndarray]
"""A stream as numpy arrays: steps (int64), values (float64), segments (int64)."""
NO_POINTS: Points = (np.empty(0, np.int64), np.empty(0, np.float64), np.empty(0, np.int64))


def points_of(stream: pl.DataFrame) -> Points:
    return tuple(stream.get_column(c).to_numpy() for c in ("step", "value", "segment"))  # type: ignore[return-value]


def points_frame(points: Points) -> pl.DataFrame:
    steps, values, segments = points
    return pl.DataFrame([pl.Series("step", steps, dtype=pl.Int64()), pl.Series("value", values, dtype=pl.Float64()), pl.Series("segment", segments, dtype=pl.Int64())])


def collapse_points(steps: np.ndarray, values: np.ndarray) -> Points:
    """`collapse`, on arrays: strictly increasing steps (nearly every pass of a daemon over busy
    runs) cost no polars call."""
    if increasing(steps):
        return steps, values, np.zeros(steps.size, np.int64)
    return points_of(collapse(pl.DataFrame([pl.Series("step", steps, dtype=pl.Int64()), pl.Series("value", values, dtype=pl.Float64())])))


def by_run_and_metric(
    frame: pl.DataFrame, metrics: tuple[str, ...], *, best: dict[str, dict[str, int]]
) -> tuple[dict[tuple[str, str], Points], dict[tuple[str, str], str]]:
    """`by_metric` of every run in `frame` (a daemon pass's new rows; each run's rows together, in
    the order written) in a few polars calls for all of them: (run, metric) -> its stream, for the
    streams with points, and (run, metric) -> the tag it was read from (what `tags_used` says of a
    run's table). `best`: by_metric's memory, per run."""
    wanted = frame.select("run", "metric", "tag", "step", "value").filter(pl.col("metric").is_in(list(metrics)))
    if not wanted.height:
        return {}, {}
    counts = wanted.group_by("run", "metric", "tag", maintain_order=True).len()
    tags: dict[tuple[str, str], list[tuple[str, int]]] = {}
    for run, metric, tag, n in counts.iter_rows():
        tags.setdefault((run, metric), []).append((tag, n))
    chosen = []
    for (run, metric), seen in tags.items():
        tag = seen[0][0] if len(seen) == 1 else preferred(metric, seen)
        mine = best.setdefault(run, {})
        rank = rank_of(tag, metric)
        if rank > mine.get(metric, rank):
            continue  # outranked by a tag this run showed before (see by_metric)
        mine[metric] = rank
        chosen.append((run, metric, tag))
    if not chosen:
        return {}, {}
    # Keys of the frame's own types (a scan's lean tables hold names as Categorical): no cast per row.
    keep = pl.DataFrame(chosen, schema={c: wanted.schema[c] for c in ("run", "metric", "tag")}, orient="row").with_row_index("stream")
    rows = wanted.join(keep, on=["run", "metric", "tag"], how="inner", maintain_order="left")
    ids = rows.get_column("stream").to_numpy()
    order = np.argsort(ids, kind="stable")  # each stream's rows together, in the order written
    ids, steps, values = ids[order], rows.get_column("step").to_numpy()[order], rows.get_column("value").to_numpy()[order]
    bounds = np.flatnonzero(np.r_[True, ids[1:] != ids[:-1], True])
    out = {}
    for lo, hi in zip(bounds[:-1].tolist(), bounds[1:].tolist()):
        run, metric, _ = chosen[int(ids[lo])]
        out[(run, metric)] = collapse_points(steps[lo:hi], values[lo:hi])
    return out, {(run, metric): tag for run, metric, tag in chosen}


def by_run(windows: Sequence[Mapping[str, Points]], metrics: Sequence[str]) -> dict[str, pl.DataFrame]:
    """Each metric's streams of many runs in one frame (run: the index into `windows`, step, value,
    segment), each run's rows together: what engine.judge_runs judges in one query per rule."""
    out = {}
    for m in metrics:
        parts = [(k, w[m]) for k, w in enumerate(windows) if w[m][0].size]
        if not parts:
            continue
        out[m] = pl.DataFrame({
            "run": pl.Series(np.repeat([k for k, _ in parts], [p[0].size for _, p in parts]), dtype=pl.Int64()),
            "step": pl.Series(np.concatenate([p[0] for _, p in parts]), dtype=pl.Int64()),
            "value": pl.Series(np.concatenate([p[1] for _, p in parts]), dtype=pl.Float64()),
            "segment": pl.Series(np.concatenate([p[2] for _, p in parts]), dtype=pl.Int64()),
        })
    return out


def _no_points() -> pl.DataFrame:
    return pl.DataFrame(schema={"step": pl.Int64(), "value": pl.Float64(), "segment": pl.Int64()})


def preferred(metric: str, tags: Sequence[tuple[str, int]]) -> str:
    """Of the tags (with their point counts, in the order first written) that carry `metric`, the
    one its stream is read from: the best ranked (`vocabulary`: a user alias, the canonical name,
    another spelling, a test set, an epoch aggregate), then the one with most points, then the first."""
    return min(enumerate(tags), key=lambda it: (rank_of(it[1][0], metric), -it[1][1], it[0]))[1][0]


def context(run_frame: pl.DataFrame, metric: str) -> pl.DataFrame:
    """(step, value) of a context metric in step order, the latest write of each step winning: causes
    look things up by step, and after a resume the replayed values are the ones that held."""
    return as_context(stream(run_frame, metric))


def as_context(points: pl.DataFrame) -> pl.DataFrame:
    if not points.height or points.get_column("segment").max() == 0:
        return points.select("step", "value")  # one segment: steps already increase strictly
    return points.unique(subset=["step"], keep="last", maintain_order=True).sort("step").select("step", "value")


def context_points(points: Points) -> tuple[np.ndarray, np.ndarray]:
    """`as_context` of a stream held as arrays: one segment is already in step order."""
    if not points[2].size or points[2].max() == 0:
        return points[0], points[1]
    c = as_context(points_frame(points))
    return c.get_column("step").to_numpy(), c.get_column("value").to_numpy()


def segments_with_history(points: pl.DataFrame, lookback: int) -> pl.DataFrame:
    """Evaluation units: each segment's points (judge=True) after up to `lookback` points of the
    timeline it continues from (judge=False). Columns: unit, step, value, judge."""
    if single_valued(points.get_column("segment")):
        # A run that never rewound: one unit, no history to splice in.
        n = points.height
        return points[["step", "value"]].hstack([_constant("judge", True, n, pl.Boolean()), _constant("unit", 0, n, pl.Int64())])
    parts = []
    timeline = points.head(0).select("step", "value")
    for seg, rows in points.partition_by("segment", as_dict=True, maintain_order=True).items():
        seg_id = seg[0] if isinstance(seg, tuple) else seg
        rows = rows.select("step", "value")
        first = rows.get_column("step")[0]
        before = timeline.filter(pl.col("step") < first)
        history = before.tail(lookback) if lookback > 0 else before.head(0)
        parts.append(history.with_columns(pl.lit(False).alias("judge"), pl.lit(seg_id, dtype=pl.Int64).alias("unit")))
        parts.append(rows.with_columns(pl.lit(True).alias("judge"), pl.lit(seg_id, dtype=pl.Int64).alias("unit")))
        timeline = pl.concat([before, rows])
    if not parts:
        return pl.DataFrame(schema={"step": pl.Int64(), "value": pl.Float64(), "judge": pl.Boolean(), "unit": pl.Int64()})
    return pl.concat(parts)
