"""A metric of MLflow's file store logged without a step (`log_metric("lr", lr)`: step 0 on every
line) put at the steps of the metric beside it that is logged with them, as the SQLite store's
reader does (formats/mlflow_db._pace): numbered apart, an LR that jumps at the 40th loss logged
every 10 steps would sit at step 40, far from a spike at 400, and the LR-schedule cause be missed.

The file store keeps a metric a file, so the order of rows across metrics is only their
timestamps, in milliseconds: a row goes at the step of the pace metric's last row logged in the
same millisecond or before it (a row of the pace metric logged just after it in the same
millisecond counts as before: a step later than the SQLite store would put it, never further).

Which metric keeps pace is decided once, at the metric's third row, by its first three (t0, t1,
t2): the metric with steps one of whose rows was logged in (t1, t2], if it also logged one in
(t0, t1] at another step (each LR row has a loss row beside it); the earliest such row decides
between several, then the name. Rows a pace metric logged before a row are in its file before the
row is read (one process logs them in turn), so reads in pieces place rows as one read does.
A metric's file is in timestamp order as MLflow appends it: the rows wanted are found by
bisecting the file, not by reading it whole at every pass of the daemon.
"""

from __future__ import annotations

import io
import os
from pathlib import Path

import polars as pl

NO_PACE = ""
"""Cursor.pace once decided that no metric keeps pace (None: not decided yet)."""
_PROBE = 4096


def _stamp(line: bytes) -> int | None:
    """A complete line's timestamp (its first field), None for a line of another shape."""
    if not line.endswith(b"\n"):
        return None
    head = line.split(b" ", 1)[0]
    return int(head) if head.isdigit() else None


def _first_after(fh, size: int, stamp: int) -> int:  # noqa: ANN001 - (a binary file)
    """An offset at a line's start before the first line stamped after `stamp`, at most a probe's
    bytes before it (bisected: lines in timestamp order; a line of another shape counts as after)."""
    lo, hi = 0, size
    while hi - lo > _PROBE:
        mid = (lo + hi) // 2
        fh.seek(mid)
        fh.readline()
        at = fh.tell()
        seen = _stamp(fh.readline())
        if seen is not None and seen <= stamp:
            lo = at
        else:
            hi = mid
    return lo


def rows_of(raw: bytes) -> pl.DataFrame:
    """(ts, step) of lines `timestamp value [step ...]` (no step: MLflow's 0), others left out."""
    if not raw:
        return pl.DataFrame(schema={"ts": pl.Int64(), "step": pl.Int64()})
    text = pl.read_csv(
        io.BytesIO(raw), has_header=False, new_columns=["text"], separator="\x1f", quote_char=None,
        schema={"text": pl.String()}, truncate_ragged_lines=True, encoding="utf8-lossy",
    )
    fields = pl.col("text").str.strip_chars().str.split(" ")
    step = pl.when(fields.list.len() == 2).then(pl.lit("0")).otherwise(fields.list.get(2, null_on_oob=True))
    rows = text.select(fields.list.first().cast(pl.Int64, strict=False).alias("ts"), step.cast(pl.Int64, strict=False).alias("step"))
    return rows.drop_nulls()


def stamped(path: Path, after: int, upto: int) -> pl.DataFrame:
    """(ts, step) of a metric file's lines stamped in (after, upto], after the last stamped at or
    before `after` (none where no line is): complete lines only. Empty if the file is gone."""
    try:
        with open(path, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            start = _first_after(fh, size, after)
            fh.seek(_first_after(fh, size, upto))
            while True:  # (past the probe's lines before the first stamped after `upto`)
                line = fh.readline()
                seen = _stamp(line)
                if not line.endswith(b"\n") or (seen is not None and seen > upto):
                    break
            stop = fh.tell() - len(line)
            fh.seek(start)
            raw = fh.read(max(0, stop - start))
    except OSError:
        return rows_of(b"")
    rows = rows_of(raw[: raw.rfind(b"\n") + 1])
    before = rows.filter(pl.col("ts") <= after).tail(1)
    return pl.concat([before, rows.filter((pl.col("ts") > after) & (pl.col("ts") <= upto))])


def head_stamps(path: Path) -> list[int]:
    """The timestamps of a metric file's first three lines (fewer if it has fewer)."""
    found: list[int] = []
    try:
        with open(path, "rb") as fh:
            for line in fh:
                seen = _stamp(line)
                if seen is not None:
                    found.append(seen)
                if len(found) == 3:
                    break
    except OSError:  # (gone since it was read: the next read says so)
        pass
    return found


def decide(path: Path, metrics: Path, stamps: list[int]) -> str:
    """The key (path under `metrics`) of the metric that keeps pace with the one in `path`, whose
    first three rows are stamped `stamps`; NO_PACE if none does."""
    t0, t1, t2 = stamps
    best: tuple[int, str] | None = None
    for other in sorted(metrics.rglob("*")):
        if other == path or not other.is_file():
            continue
        rows = stamped(other, t0, t2).filter(pl.col("ts") > t0)
        early = rows.filter(pl.col("ts") <= t1)
        late = rows.filter(pl.col("ts") > t1)
        if early.height and late.height and early.item(0, "step") != late.item(0, "step"):
            key = (late.item(0, "ts"), other.relative_to(metrics).as_posix())
            best = key if best is None or key < best else best
    return best[1] if best is not None else NO_PACE


def placed(rows: pl.DataFrame, pace: Path) -> pl.DataFrame:
    """`rows` (ms `wall_time`, numbered `step`) each at the step of the last row of `pace` stamped
    at or before it; a row the pace metric logged nothing before keeps its number."""
    stamps = rows.get_column("wall_time").drop_nulls()
    if not stamps.len():
        return rows
    marks = stamped(pace, int(stamps.min()), int(stamps.max()))
    if not marks.height:
        return rows
    marks = marks.sort("ts").select(pl.col("ts").cast(pl.Float64()), pl.col("step").alias("_at"))
    left = rows.with_row_index("_order").with_columns(pl.col("wall_time").fill_null(-1.0).alias("ts")).sort("ts")
    joined = left.join_asof(marks, on="ts", strategy="backward").sort("_order")
    step = pl.when(pl.col("step").is_not_null()).then(pl.coalesce("_at", "step"))
    return joined.with_columns(step.alias("step")).select(rows.columns)
