"""MLflow's SQLite tracking store (the default since MLflow 3.7: `mlflow.db` in the working
directory; verl's is `/tmp/mlruns.db`), known by its tables whatever the file is called.

One database holds many runs: each row's `run` is `experiment/run name` (the run's `name`, else
its `mlflow.runName` tag, else its id). MLflow lets two runs of an experiment share a name; they
are never merged: the first of them (by start time, deleted ones counted, so that deleting one
renames no other) keeps the name, each later one is `name (<first 8 characters of its run id>)`.
Deleted runs (and the runs of deleted experiments) are not runs. MLflow keeps NaN as 0 with
`is_nan = 1` and +-Inf as +-1.7976931348623157e308 (sqlalchemy_store.sanitize_metric_value):
both are mapped back, or the non-finite rules would never see them. A value of exactly
+-float max is taken for an infinity: MLflow's encoding can not tell them apart."""

from __future__ import annotations

import sqlite3
import sys
from collections.abc import Collection
from pathlib import Path

import polars as pl

from ..cursor import Cursor
from ..problems import Problem
from ..sources import sqlite_db
from .base import NAMED_RAW, Format, Parsed, no_rows
from .onemetric import stepless

TABLES = frozenset({"experiments", "runs", "metrics", "alembic_version"})
"""What every MLflow SQL store holds since its first migration (and no other tracker's does)."""
METRICS = sqlite_db.Table("metrics", key="rowid", columns="run_uuid, key, value, is_nan, step, timestamp", identity="run_uuid, key, step, timestamp, value")
FLOAT_MAX = sys.float_info.max


class MlflowDbFormat:
    name = "mlflow_db"

    def read(self, path: Path, cursor: Cursor, *, final: bool, limit: int | None = None) -> Parsed:
        source = str(path)
        size, _ = sqlite_db.stamp(path)
        try:
            with sqlite_db.opened(path) as db:
                fetched = sqlite_db.fetch(db, METRICS, cursor, _batch, size=size, limit=limit)
                got = pl.concat(fetched.batches, rechunk=False) if fetched.batches else None
                names = run_names(db, got.get_column("uuid").unique().to_list()) if got is not None else {}
                got, begun = _numbered(db, got) if got is not None else (None, [])
        except sqlite_db.Unreadable as exc:
            return no_rows(source, cursor if exc.dead else sqlite_db.again(cursor), exc.message, dead=exc.dead)
        problems = (Problem(source, sqlite_db.RESTARTED),) if fetched.restarted else ()
        problems += tuple(Problem(source, stepless(names[uuid], key)) for uuid, key in begun if uuid in names)
        return Parsed(_frame(got, names) if got is not None else pl.DataFrame(schema=NAMED_RAW), fetched.cursor, problems)


STEPLESS = "SELECT min(step) = max(step), sum(rowid < ?), count(*) FROM metrics WHERE run_uuid = ? AND key = ?"
"""Whether a metric's rows all share one step, how many come before a row, and how many it has."""


def _numbered(db: sqlite3.Connection, got: pl.DataFrame) -> tuple[pl.DataFrame, list[tuple[str, str]]]:
    """The rows of metrics logged without a step (`log_metric(key, value)`: step 0 in every row)
    numbered in the order logged, as the file store's are (formats.mlruns.numbered): a metric whose
    rows in the whole store share one step, and are more than one, has its i-th row at that step + i.
    Only metrics whose fetched rows share a step are asked about (one indexed count each). Also the
    (run id, key) of those whose numbering this read begins (it holds their second row): said once."""
    one = got.group_by("uuid", "tag").agg(pl.col("step").min().alias("lo"), pl.col("step").max().alias("hi"), pl.col("_key").min().alias("at"), pl.len().alias("n"))
    bases, begun = [], []
    for uuid, key, lo, hi, at, n in one.filter(pl.col("lo") == pl.col("hi")).iter_rows():
        same, before, total = db.execute(STEPLESS, (at, uuid, key)).fetchone()
        if same and total > 1:
            bases.append((uuid, key, lo + before))
            if before <= 1 < before + n:
                begun.append((uuid, key))
    if not bases:
        return got, begun
    base = pl.DataFrame(bases, orient="row", schema={"uuid": pl.String(), "tag": pl.String(), "base": pl.Int64()})
    got = got.join(base, on=["uuid", "tag"], how="left", maintain_order="left")
    rank = pl.int_range(pl.len(), dtype=pl.Int64).over("uuid", "tag")
    return got.with_columns(pl.when(pl.col("base").is_not_null()).then(pl.col("base") + rank).otherwise(pl.col("step")).alias("step")).drop("base"), begun


BATCH = {"_key": pl.Int64(), "uuid": pl.String(), "tag": pl.String(), "value": pl.Float64(), "is_nan": pl.Int64(), "step": pl.Int64(), "ts": pl.Int64()}


def _batch(rows: list[tuple]) -> pl.DataFrame:
    return pl.DataFrame(rows, orient="row", strict=False, schema=BATCH)


def _frame(got: pl.DataFrame, names: dict[str, str]) -> pl.DataFrame:
    """The fetched metric rows as raw rows, NaN and +-Inf decoded, rows of runs that are no runs
    (deleted) left out."""
    value = pl.col("value")
    decoded = (
        pl.when(pl.col("is_nan") != 0).then(float("nan"))
        .when(value == FLOAT_MAX).then(float("inf"))
        .when(value == -FLOAT_MAX).then(float("-inf"))
        .otherwise(value)
    )
    # Seconds divided by numpy, exactly: polars divides a long column by a scalar as a product with
    # its inverse, so a row's wall time would depend on how many rows came with it.
    seconds = pl.Series("wall_time", got.get_column("ts").cast(pl.Float64()).to_numpy() / 1000.0)
    return got.with_columns(seconds).select(
        pl.col("step"), pl.col("tag"), decoded.alias("value"), pl.col("wall_time"),
        pl.col("uuid").replace_strict(names, default=None, return_dtype=pl.String()).alias("run"),
    ).filter(pl.col("run").is_not_null())


RUNS = """
SELECT r.run_uuid, e.name, COALESCE(NULLIF(r.name, ''), t.value, r.run_uuid), r.lifecycle_stage, e.lifecycle_stage, r.experiment_id
FROM runs AS r JOIN experiments AS e ON e.experiment_id = r.experiment_id
LEFT JOIN tags AS t ON t.run_uuid = r.run_uuid AND t.key = 'mlflow.runName'
WHERE r.experiment_id IN (SELECT experiment_id FROM runs WHERE run_uuid IN ({marks}))
ORDER BY COALESCE(r.start_time, 0), r.run_uuid
"""


def run_names(db: sqlite3.Connection, uuids: Collection[str]) -> dict[str, str]:
    """run id -> `experiment/run name` for the runs of `uuids` that are runs (not deleted), named
    among all the runs of their experiments (the first of a name keeps it)."""
    named: dict[str, str] = {}
    wanted = sorted(u for u in uuids if u is not None)
    for i in range(0, len(wanted), 500):
        chunk = wanted[i : i + 500]
        taken: set[tuple[str, str]] = set()
        for uuid, experiment, name, stage, experiment_stage, experiment_id in db.execute(RUNS.format(marks=", ".join("?" * len(chunk))), chunk):
            first = (experiment_id, name) not in taken
            taken.add((experiment_id, name))
            if stage != "deleted" and experiment_stage != "deleted":
                named[uuid] = f"{experiment}/{name}" if first else f"{experiment}/{name} ({uuid[:8]})"
    return named


MLFLOW_DB = MlflowDbFormat()
FORMAT = Format(reader=MLFLOW_DB, tables=TABLES, names_runs=True)
