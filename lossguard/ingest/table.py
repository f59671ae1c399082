"""The canonical long table every reader produces, and the small helpers that build it.

One row per (step, tag) value as written in the log. Keeping the raw order and every row (duplicates
from several ranks, steps going backwards after a resume) is deliberate: deciding segments is the
stream layer's job, and it can only do it if the reader lost nothing.
"""

from __future__ import annotations

import polars as pl

SCHEMA: dict[str, pl.DataType] = {
    "run": pl.String(),
    "source": pl.String(),
    "step": pl.Int64(),
    "metric": pl.String(),
    "tag": pl.String(),
    "value": pl.Float64(),
    "wall_time": pl.Float64(),
}
COLUMNS = list(SCHEMA)

# What a format parser returns before run, source and metric are attached.
RAW_SCHEMA: dict[str, pl.DataType] = {
    "step": pl.Int64(),
    "tag": pl.String(),
    "value": pl.Float64(),
    "wall_time": pl.Float64(),
}

CANONICAL_METRICS = ("loss", "eval_loss", "lr", "grad_norm", "loss_scale", "step_time", "throughput")
"""The metrics rules judge: a loss, what explains its spikes, and the run's pace (a step's time, or
work a second)."""


Span = tuple[int, int]
"""First and last step of a table's rows, every metric's: what a run covers."""


def span_of(frame: pl.DataFrame) -> Span | None:
    steps = frame.get_column("step").drop_nulls()
    return None if not steps.len() else (int(steps.min()), int(steps.max()))


def joined(spans: list[Span | None]) -> Span | None:
    known = [s for s in spans if s is not None]
    return (min(s[0] for s in known), max(s[1] for s in known)) if known else None


def empty_raw() -> pl.DataFrame:
    return pl.DataFrame(schema=RAW_SCHEMA)


def empty(*, lean: bool = False) -> pl.DataFrame:
    if lean:
        return pl.DataFrame(schema={"step": pl.Int64(), "metric": pl.Categorical(), "tag": pl.Categorical(), "value": pl.Float64()})
    return pl.DataFrame(schema=SCHEMA)


def conform_raw(frame: pl.DataFrame) -> pl.DataFrame:
    """Cast and order a parser's output to RAW_SCHEMA (missing wall_time becomes null). A tag
    column a parser built as Categorical stays one: readers of wide tables (CSV, JSON lines) make
    tens of millions of rows from a handful of names, and strings would cost them a third of the read."""
    if "wall_time" not in frame.columns:
        frame = frame.with_columns(pl.lit(None, dtype=pl.Float64).alias("wall_time"))
    keep = {"tag"} if frame.schema.get("tag") == pl.Categorical() else set()
    columns = [pl.col(c) if c in keep else pl.col(c).cast(t) for c, t in RAW_SCHEMA.items()]
    if "run" in frame.columns:
        columns.append(pl.col("run").cast(pl.String))  # the file's own name for the row's run (finish)
    if "line_no" in frame.columns:
        # The line each row came from: the line formats' reader names the first line of rows no step
        # could be found for, and splits a batch of many files' lines by file (readmany).
        columns.append(pl.col("line_no").cast(pl.Int64))
    return frame.select(columns)


LEAN = ("step", "metric", "tag", "value")


def run_of(run: str, own: str) -> str:
    """The run of a row whose file names it `own` (a tracker's `project/name`), found under the
    run discovery named the file's: the file's folder names where it is, the file who it is."""
    return own if run == "." else f"{run}/{own}"


def own_runs(run: str, raw: pl.DataFrame) -> pl.Expr:
    """run_of over a raw frame's `run` column: one literal where a single run names every row (a
    tracker's file of one run, read alone: a fifth of the time of joining the names row by row)."""
    names = raw.get_column("run")
    if names.len() and names.dtype == pl.String() and not names.null_count() and (names == names[0]).all():
        return pl.lit(run_of(run, names[0]), dtype=pl.String())
    return pl.col("run").cast(pl.String()) if run == "." else pl.concat_str(pl.lit(f"{run}/"), pl.col("run").cast(pl.String()))


def finish(raw: pl.DataFrame, *, run: str, source: str, metric_of: dict[str, str], lean: bool = False) -> pl.DataFrame:
    """Attach run, source and the canonical metric name to a parser's raw rows. `lean` keeps only
    what analysis needs (LEAN): run and source are the same on every row of a file, and as columns
    they would double the memory of a large log's table. A file that names its rows' runs (a raw
    `run` column: a tracker's database holds many) keeps a `run` column in a lean table too, each
    row's own (run_of), and is split into its runs by who reads it."""
    renamed = {t: m for t, m in metric_of.items() if t != m}
    named = "run" in raw.columns
    if lean:
        # Categorical names: 4 bytes a row instead of a 16-byte string view, for tables of 10^7+ rows
        # (renaming then works on the few categories, not on every row).
        tag = pl.col("tag").cast(pl.Categorical())
        return raw.select(
            *([own_runs(run, raw).alias("run")] if named else []),
            pl.col("step").cast(pl.Int64()),
            (tag.replace(renamed) if renamed else tag).alias("metric"),
            tag.alias("tag"),
            pl.col("value").cast(pl.Float64()),
        )
    metric = pl.col("tag").cast(pl.String()).replace(renamed) if renamed else pl.col("tag").cast(pl.String())
    return raw.select(
        (own_runs(run, raw) if named else pl.lit(run, dtype=pl.String())).alias("run"),
        pl.lit(source, dtype=pl.String()).alias("source"),
        pl.col("step").cast(pl.Int64()),
        metric.cast(pl.String()).alias("metric"),
        pl.col("tag").cast(pl.String()),
        pl.col("value").cast(pl.Float64()),
        pl.col("wall_time").cast(pl.Float64()),
    )
