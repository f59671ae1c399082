"""DVCLive's metric histories: `dvclive/plots/metrics/<name>.tsv`, one file a metric, appended to at
each `Live.log_metric` (dvclive/plots/metric.py: a csv.DictWriter with tabs, the header written
when the file is created):

    step	loss                      timestamp	step	lr
    0	2.31                          1796191876559	0	0.1
    1	nan                           (`log_metric(..., timestamp=True)`: milliseconds)

The metric is the file's path under `plots/metrics/` (`train/loss.tsv` is `train/loss`: the header
holds only its last part). NaN and infinities are written as Python prints them (`nan`, `inf`:
Live.log_metric turns them into strings); a string logged as a metric is not a number and is left
out. One dvclive folder is one run: the folder holding it, as for every tracker's folder. A folder
given another name (`Live(dir="results/exp3")`) is known by what dvclive writes beside its plots:
`metrics.json` (at every `next_step`) or `dvc.yaml`; being a name the user chose, it names the run
itself (`results/exp3`), where `dvclive` says nothing of the run.
"""

from __future__ import annotations

import os
from pathlib import Path

import polars as pl

from .. import table
from ..cursor import Cursor
from .base import REPEATS, Format, LineFormat, Layout, Together, repeats
from .onemetric import PLACEHOLDER, Named, OneMetric, in_seconds

FOLDER = "dvclive"
BELOW = ("plots", "metrics")
"""Where under a dvclive folder its metric histories are."""
MARKERS = ("metrics.json", "dvc.yaml")
"""Files dvclive writes beside `plots/` (either tells its folder under another name)."""
HEADER_FIELDS = ("step", "timestamp")


def parse(lines: pl.DataFrame, cursor: Cursor, raw: bytes | None = None) -> tuple[pl.DataFrame, Cursor]:
    """`[timestamp\\t]step\\tvalue` lines; the header is no record. A line of another shape keeps a
    null step, and the line reader says so (naming the first such line)."""
    fields = pl.col("text").str.split("\t")
    n = fields.list.len()
    marked = lines.with_columns(fields.alias("fields"), n.alias("n")).filter(~pl.col("fields").list.first().is_in(HEADER_FIELDS))
    stamped = pl.col("n") == 3
    rows = marked.select(
        pl.when(pl.col("n").is_in([2, 3]))
        .then(pl.when(stamped).then(pl.col("fields").list.get(1)).otherwise(pl.col("fields").list.first()))
        .str.strip_chars()
        .cast(pl.Int64, strict=False)
        .alias("step"),
        pl.lit(PLACEHOLDER).alias("tag"),
        pl.col("fields").list.last().str.strip_chars().cast(pl.Float64, strict=False).alias("value"),
        pl.when(stamped).then(pl.col("fields").list.first().cast(pl.Float64, strict=False)).alias("wall_time"),
        "line_no",
    ).filter(pl.col("value").is_not_null() | pl.col("step").is_null())
    steps = rows.get_column("step").drop_nulls()
    # dvclive's step moves only at Live.next_step(): a metric logged again before it (each
    # micro-batch of a step, or each call of a loop that never calls it) writes rows of one step.
    said = cursor.steps == REPEATS or not repeats(steps.to_numpy(), cursor.last_step)
    return table.conform_raw(in_seconds(rows)), cursor.advance(last_step=int(steps[-1]) if steps.len() else cursor.last_step, steps=cursor.steps if said else REPEATS)


def _logs(below: tuple[str, ...]) -> bool:
    return len(below) >= 3 and below[:2] == BELOW and below[-1].endswith(".tsv")


def renamed(parts: list[str]) -> int | None:
    """Where in a path's parts a dvclive folder of another name is (the part before
    `plots/metrics/`), or None: a `.tsv` under `plots/metrics/` beside dvclive's own files, or
    one of those files (`metrics.json`, its summary, is no log) beside `plots/metrics/`."""
    if parts[-1] in MARKERS and len(parts) >= 2:
        return len(parts) - 2 if os.path.isdir(os.path.join(os.sep.join(parts[:-1]) or os.sep, *BELOW)) else None
    if not parts[-1].endswith(".tsv") or "plots" not in parts:
        return None
    for i in range(len(parts) - 4, -1, -1):
        if (parts[i + 1], parts[i + 2]) == BELOW:
            folder = os.sep.join(parts[: i + 1]) or os.sep
            if any(os.path.isfile(os.path.join(folder, m)) for m in MARKERS):
                return i
    return None


def _named(path: Path) -> Named:
    parts = path.parts
    for i in range(len(parts) - 3, -1, -1):
        if parts[i : i + 2] == BELOW:
            return Named("/".join(parts[i + 2 :]).removesuffix(".tsv"))
    return Named(path.stem)  # (read with --format dvclive from anywhere)


OWN = frozenset({"plots", "metrics.json", "params.yaml", "dvc.yaml", "report.html", "report.md", "artifacts", "images"})
"""What dvclive keeps in its folder: a folder merely called `dvclive` holding none of it (a checkout
of dvclive itself, a project) is walked as any folder, its logs not hidden."""


DVCLIVE = OneMetric(
    LineFormat("dvclive", parse, together=Together(lambda lines: lines.select(pl.repeat(False, pl.len()).alias("alone"), pl.repeat(False, pl.len()).alias("record")), repeats=True)), _named
)
"""A line's row depends on nothing before it (the header is known by its words), so many runs'
files are parsed in one call (readmany: a scan of 300 runs of 3 metrics took 4.3 s file by file, 0.9 s
so); `parse` counts no records in the cursor (its index), nor does the batch. A file repeating a
step is read alone until that was said (`repeats`)."""
FORMAT = Format(reader=DVCLIVE, layout=Layout(folder=FOLDER, logs=_logs, skip=frozenset({"artifacts"}), renamed=renamed, own=OWN.__contains__))
