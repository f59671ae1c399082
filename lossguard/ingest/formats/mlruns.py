"""MLflow's file store (`mlruns/`, `mlflow.set_tracking_uri("file:...")`): a file a metric,
`mlruns/<experiment id>/<run id>/metrics/<key>`, where a `/` in the key is a folder
(`train/loss`), and a line a value, as FileStore._log_run_metric appends them
(mlflow/store/tracking/file_store.py):

    1796191965954 2.3125 120            timestamp (ms), value, step
    1796191965955 nan 121               NaN and infinities as Python prints them (`inf`, `-inf`)
    1796191965956 2.25 122 eval 8f3a    with a dataset: its name and digest after the step
    1796191965957 2.25                  (MLflow before 1.0: no step, which MLflow reads as 0)

Every row names its run, `experiment name/run name` (sources/mlruns.py), so a store of many runs is
many runs; a deleted run is not read. A store of another name is known by the meta.yaml of its
experiment and run beside the metrics, and names the run it is found in itself. The store's other folders (params, tags, artifacts, models'
metrics, the `.trash` of deleted experiments) hold no run's metric history.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl

from .. import table
from ..cursor import Cursor
from ..problems import Problem
from ..sources import mlruns
from . import mlruns_pace
from .base import Format, LineFormat, Layout
from .onemetric import PLACEHOLDER, STEPLESS, Named, OneMetric, in_seconds

FOLDER = "mlruns"
METRICS = "metrics"


def parse(lines: pl.DataFrame, cursor: Cursor, raw: bytes | None = None, *, path: Path | None = None) -> tuple[pl.DataFrame, Cursor]:
    """`timestamp value [step [dataset digest]]` lines; a line of another shape keeps a null step,
    and the line reader says so (naming the first such line). With the file's `path`, the rows of
    a metric logged without a step go at the steps of the one keeping pace with it (_paced)."""
    fields = pl.col("text").str.strip_chars().str.split(" ")
    n = fields.list.len()
    value = fields.list.get(1, null_on_oob=True).cast(pl.Float64, strict=False)
    stamp = fields.list.first().cast(pl.Int64, strict=False)
    shaped = n.is_in([2, 3, 5]) & value.is_not_null() & stamp.is_not_null()
    step = pl.when(n == 2).then(pl.lit(0, dtype=pl.Int64)).otherwise(fields.list.get(2, null_on_oob=True).cast(pl.Int64, strict=False))
    rows = lines.select(
        pl.when(shaped).then(step).alias("step"),
        pl.lit(PLACEHOLDER).alias("tag"),
        value.alias("value"),
        stamp.cast(pl.Float64).alias("wall_time"),
        "line_no",
    )
    before = cursor
    rows, cursor = numbered(_logged_order(rows), cursor, path=path)
    steps = rows.get_column("step").drop_nulls()
    cursor = cursor.advance(last_step=int(steps[-1]) if steps.len() else cursor.last_step)  # (as numbered: the next rows go on from it)
    if path is not None and cursor.steps == STEPLESS:
        rows, cursor = _paced(path, rows, before, cursor)
    return table.conform_raw(in_seconds(rows)), cursor


def _paced(path: Path, rows: pl.DataFrame, before: Cursor, after: Cursor) -> tuple[pl.DataFrame, Cursor]:
    """Numbered rows from the metric's third on at the steps of the metric keeping pace with it,
    decided when the third is read (mlruns_pace)."""
    at = _metrics_at(path.parts)
    if at is None:
        return rows, after
    metrics = Path(*path.parts[: at + 1])
    pace = before.pace
    if pace is None and before.index <= 2 < after.index:
        stamps = mlruns_pace.head_stamps(path)
        pace = mlruns_pace.decide(path, metrics, stamps) if len(stamps) == 3 else mlruns_pace.NO_PACE
        after = after.advance(pace=pace)
    if not pace:
        return rows, after
    index = before.index + pl.col("step").is_not_null().cum_sum() - 1
    rows = rows.with_row_index("_row")
    late = mlruns_pace.placed(rows.filter(index >= 2), metrics / pace).select("_row", pl.col("step").alias("_paced"))
    rows = rows.join(late, on="_row", how="left", maintain_order="left")
    return rows.with_columns(pl.coalesce("_paced", "step").alias("step")).drop("_row", "_paced"), after


def _logged_order(rows: pl.DataFrame) -> pl.DataFrame:
    """A block's lines in the order logged: by timestamp, then step. MLflow's asynchronous logging
    (`synchronous=False`, transformers' MLflowCallback) appends batches from a pool of threads, so
    lines land out of order, and each step going back would be taken for a resume (see
    mlflow_db._logged_order). A line of another shape (no timestamp) keeps its place at the end."""
    back = rows.select(((pl.col("wall_time").diff() < 0) | ((pl.col("wall_time").diff() == 0) & (pl.col("step").diff() < 0))).any()).item()
    return rows.sort(["wall_time", "step"], nulls_last=True, maintain_order=True) if back else rows


def numbered(rows: pl.DataFrame, cursor: Cursor, *, path: Path | None = None) -> tuple[pl.DataFrame, Cursor]:
    """A metric logged without a step (`log_metric(key, value)`: MLflow stores step 0 for each row)
    numbered in the order logged: one step for all would leave nothing to judge. From its second
    row sharing the first's step, row i is at step first + i (the first stays where it is, so a
    read in pieces numbers as one read does); a metric whose steps differ keeps them (`index`:
    rows read, `steps`: STEPLESS once numbering, MLFLOW once not). Whether they differ is asked of
    the whole file (`path`) when it is decided, as the SQLite store's reader asks the whole store:
    a loss logged at every micro-batch of gradient accumulation (`step=global_step`, four rows a
    step), or an eval at step 0 before training's evals at 0, 10..., share a step in their first
    two rows only. (A daemon reading a file that holds only such rows yet decides as they are.)"""
    valid = rows.get_column("step").drop_nulls()
    n, prior = valid.len(), cursor.index
    if not n or cursor.steps == MLFLOW:
        return rows, cursor.advance(index=prior + n)
    if cursor.steps != STEPLESS:
        shared = cursor.last_step if prior else int(valid[0])
        differ = (valid != shared).arg_true()
        same = n if not differ.len() else int(differ[0])
        if prior + same < 2:
            return rows, cursor.advance(index=prior + n, steps=MLFLOW if differ.len() else None)
        if differ.len() or (path is not None and _steps_differ(path, shared)):
            return rows, cursor.advance(index=prior + n, steps=MLFLOW)
        first = shared + prior
    else:
        first = cursor.last_step + 1
    step = pl.col("step")
    rows = rows.with_columns(pl.when(step.is_not_null()).then(first + step.is_not_null().cum_sum() - 1).alias("step"))
    return rows, cursor.advance(index=prior + n, steps=STEPLESS)


def _steps_differ(path: Path, shared: int) -> bool:
    """Whether any line of the metric file, as it is now, is at another step than `shared`."""
    try:
        raw = path.read_bytes()
    except OSError:
        return False
    return bool((mlruns_pace.rows_of(raw[: raw.rfind(b"\n") + 1]).get_column("step") != shared).any())


MLFLOW = "mlflow"
"""Cursor.steps of a metric file whose steps are MLflow's own (STEPLESS: numbered; None: undecided)."""


def _metrics_at(parts: tuple[str, ...]) -> int | None:
    """Where the run's `metrics` folder is in a metric file's path parts: the first `metrics` beside
    a run's meta.yaml (a key may hold a folder of that name too, `metrics/accuracy`)."""
    for i in range(2, len(parts) - 1):
        if parts[i] == METRICS and Path(*parts[:i], mlruns.META).is_file():
            return i
    return None


def _named(path: Path) -> Named:
    parts = path.parts
    at = _metrics_at(parts)
    if at is None:
        return Named(path.name)  # (read with --format mlruns from anywhere)
    owner = mlruns.owner(str(path), at)
    problems = (Problem(str(path), owner.problem),) if owner.problem else ()
    return Named("/".join(parts[at + 1 :]), owner.run, skipped=owner.deleted, problems=problems)


def renamed(parts: list[str]) -> int | None:
    """Where in a path's parts a store of another name than `mlruns` is (`file:/data/tracking`):
    the folder above `<experiment>/<run>/metrics/`, both of which hold their meta.yaml; -1 for a
    path relative to the store itself (`cd /data/tracking && lossguard scan .`)."""
    if METRICS not in parts:
        return None
    for i in range(2, len(parts) - 1):
        if parts[i] == METRICS and (i == 2 or parts[i - 3] != mlruns.TRASH):
            run = Path("/".join(parts[:i]) or "/")
            if (run / mlruns.META).is_file() and (run.parent / mlruns.META).is_file():
                return i - 3
    return None


def _logs(below: tuple[str, ...]) -> bool:
    """`<experiment>/<run>/metrics/<key...>`, of no deleted experiment."""
    return len(below) >= 4 and below[2] == METRICS and below[0] != mlruns.TRASH


def _in_metrics(below: tuple[str, ...]) -> bool:
    """A run's `metrics/` folder or one below it (`<experiment>/<run>/metrics/...`)."""
    return len(below) >= 3 and below[2] == METRICS and below[0] != mlruns.TRASH


def _own(name: str) -> bool:
    """What MLflow's file store keeps in its folder: experiments by their numeric ids, `.trash`,
    the model registry's `models`. A folder merely called `mlruns` (a checkout, a project) holding
    anything else is walked as any folder, its logs not hidden."""
    return name.isdigit() or name in (mlruns.TRASH, "models")


MLRUNS = OneMetric(LineFormat("mlruns", parse), _named, by_path=True)
FORMAT = Format(
    reader=MLRUNS, names_runs=True,
    # Where a run's metrics are not: its artifacts (checkpoints, thousands of files), deleted
    # experiments, traces. (params/ and tags/ are a small file each and are left to `logs`: a
    # metric key may well have a folder of either name, `params/norm`.)
    layout=Layout(folder=FOLDER, logs=_logs, skip=frozenset({"artifacts", mlruns.TRASH, "traces"}), renamed=renamed, own=_own, keys=_in_metrics),
)
