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
from dataclasses import dataclass
from pathlib import Path

import polars as pl

from ..cursor import Cursor
from ..problems import Problem
from ..sources import sqlite_db
from .base import NAMED_RAW, Format, Parsed, no_rows
from .onemetric import seconds, stepless

TABLES = frozenset({"experiments", "runs", "metrics", "alembic_version"})
"""What every MLflow SQL store holds since its first migration (and no other tracker's does)."""
TAKEN = (
    "typeof(run_uuid) = 'text' AND typeof(key) = 'text' AND typeof(value) IN ('real', 'integer') AND typeof(step) = 'integer'"
    " AND typeof(is_nan) IN ('integer', 'null')"
)
"""Whether a reader can take a row: what MLflow writes (its models type each column) and nothing a
hand or another program could put there instead (SQLite keeps what a column is given: text, a
BLOB, a step of 1e300 as a REAL). Asked of SQLite, a cheap test a row; only rows failing it come to
Python, to be passed over by name."""
METRICS = sqlite_db.Table(
    "metrics", key="rowid", columns=f"run_uuid, key, value, is_nan, step, CASE WHEN typeof(timestamp) = 'integer' THEN timestamp END, {TAKEN}",
    identity="run_uuid, key, step, timestamp, value",
)
FLOAT_MAX = sys.float_info.max


class MlflowDbFormat:
    name = "mlflow_db"

    def read(self, path: Path, cursor: Cursor, *, final: bool, limit: int | None = None) -> Parsed:
        source = str(path)
        size, _ = sqlite_db.stamp(path)
        try:
            with sqlite_db.opened(path) as db:
                fetched = sqlite_db.fetch(db, METRICS, cursor, _batch, size=size, limit=limit)
                frames = [frame for frame, _ in fetched.batches if frame.height]
                refused = [row for _, rows in fetched.batches for row in rows]
                got = pl.concat(frames, rechunk=False) if frames else None
                uuids = set(got.get_column("uuid").unique().to_list()) if got is not None else set()
                names = run_names(db, uuids | {r[1] for r in refused if isinstance(r[1], str)})
                got, begun = _numbered(db, _logged_order(got), final=final) if got is not None else (None, [])  # (numbered in the order logged)
                told = db.told
        except sqlite_db.Unreadable as exc:
            return no_rows(source, cursor if exc.dead else sqlite_db.again(cursor), exc.message, dead=exc.dead)
        problems = (Problem(source, told, unfinished=True),) if told else ()
        if fetched.restarted:
            problems += (Problem(source, sqlite_db.RESTARTED),)
        problems += tuple(sqlite_db.passed_over(source, _passed(refused, names)))
        problems += tuple(Problem(source, stepless(names[uuid], key, beside=beside)) for uuid, key, beside in begun if uuid in names)
        return Parsed(_frame(got, names) if got is not None else pl.DataFrame(schema=NAMED_RAW), fetched.cursor, problems)


STEPLESS = "SELECT min(step) = max(step), sum(rowid < ?), count(*) FROM metrics WHERE run_uuid = ? AND key = ?"
"""Whether a metric's rows all share one step, how many come before a row, and how many it has."""
FIRST_THREE = "SELECT rowid FROM metrics WHERE run_uuid = ? AND key = ? AND step = ? ORDER BY rowid LIMIT 3"
"""A metric's first three rows (at its shared step: in rowid order on the (run, key, step) index
where MLflow made it, else on the run's)."""
BETWEEN = "SELECT key, step FROM metrics WHERE run_uuid = ? AND rowid > ? AND rowid < ? AND key != ? {step} ORDER BY rowid LIMIT 1"
"""The first row of another metric of the run logged between two rows (the run's rowid index,
walked forward from the first)."""
LAST_OF = "SELECT step FROM metrics WHERE run_uuid = ? AND key = ? AND rowid < ? ORDER BY rowid DESC LIMIT 1"
"""The step of a metric's last row before a row (the run's rowid index, walked back from it)."""


@dataclass(frozen=True)
class _Stepless:
    """A metric of a run whose rows all share one step (`log_metric(key, value)`)."""

    uuid: str
    key: str
    step: int
    """The step its rows share (MLflow's 0)."""
    before: int
    """Its rows before this read's first."""
    pace: str | None
    """The metric logged with steps that its rows go at (None: they are numbered apart)."""


def _numbered(db: sqlite3.Connection, got: pl.DataFrame, *, final: bool) -> tuple[pl.DataFrame, list[tuple[str, str, bool]]]:
    """The rows of metrics logged without a step (`log_metric(key, value)`: step 0 in every row)
    given steps: a metric whose rows in the whole store share one step, and are more than one, has
    its i-th row (from the second) at that step + i, as the file store's are (formats.mlruns.numbered),
    or, from its third, at the steps of a metric its run logs with `step=` that keeps pace with it
    (_pace, _placed). Only metrics whose fetched rows share a step are asked about (a few indexed
    queries each). Also the (run id, key, paced) of those whose numbering this read decides (it
    holds their third row; a final read, their second of two: a store that is done with two rows
    would otherwise never say that their steps were made up): said once."""
    one = got.group_by("uuid", "tag").agg(pl.col("step").min().alias("lo"), pl.col("step").max().alias("hi"), pl.col("_key").min().alias("at"), pl.len().alias("n"))
    found: list[_Stepless] = []
    begun = []
    for uuid, key, lo, hi, at, n in one.filter(pl.col("lo") == pl.col("hi")).iter_rows():
        same, before, total = db.execute(STEPLESS, (at, uuid, key)).fetchone()
        if same and total > 1:
            found.append(_Stepless(uuid, key, lo, before, _pace(db, uuid, key, lo) if total > 2 else None))
            if (total > 2 and before <= 2 < before + n) or (total == 2 and final and before <= 1 < before + n):
                begun.append((uuid, key, found[-1].pace is not None))
    if not found:
        return got, begun
    numbers = pl.DataFrame([(m.uuid, m.key, m.step + m.before) for m in found], orient="row", schema={"uuid": pl.String(), "tag": pl.String(), "base": pl.Int64()})
    got = got.join(numbers, on=["uuid", "tag"], how="left", maintain_order="left").with_columns(pl.col("step").alias("stored"))
    rank = pl.int_range(pl.len(), dtype=pl.Int64).over("uuid", "tag")
    got = got.with_columns(pl.when(pl.col("base").is_not_null()).then(pl.col("base") + rank).otherwise(pl.col("step")).alias("step")).drop("base")
    paced = [m for m in found if m.pace is not None]
    return (_placed(db, got, paced) if paced else got).drop("stored"), begun


def _pace(db: sqlite3.Connection, uuid: str, key: str, step: int) -> str | None:
    """The metric logged with steps that a metric logged without one goes at: the one of its run
    whose row at another step was the first logged between its second and third rows, if that
    metric also logged a row between its first two, at another step again (an LR logged without
    a step each time a loss is logged with one, before it or after it). None otherwise: a loss
    logged without a step beside an eval logged with steps now and then is numbered on its own,
    not folded onto the eval's few steps, and metrics that are all logged without steps stay
    numbered. Decided by rows logged before its third, which every read after that sees alike, in
    one go or in pieces."""
    rows = [r for (r,) in db.execute(FIRST_THREE, (uuid, key, step)).fetchall()]
    if len(rows) < 3:  # (rows deleted since they were counted: `mlflow gc` under a read)
        return None
    first, second, third = rows
    row = db.execute(BETWEEN.format(step="AND step != ?"), (uuid, second, third, key, step)).fetchone()
    if row is None:
        return None
    earlier = db.execute(BETWEEN.format(step="AND key = ?"), (uuid, first, second, key, row[0])).fetchone()
    # Two rows at two steps: a metric logged with steps, not one whose rows share a step of their
    # own (`step=epoch` within an epoch, a constant): that one is numbered itself.
    return row[0] if earlier is not None and earlier[1] != row[1] else None


def _placed(db: sqlite3.Connection, got: pl.DataFrame, paced: list[_Stepless]) -> pl.DataFrame:
    """The rows of `paced` metrics from their third on, each at the step of the last row before it
    (in the order logged: rowid) of the metric it keeps pace with; one forward fill a run and
    metric kept pace with, however many metrics keep pace with it."""
    for uuid, pace in sorted({(m.uuid, m.pace) for m in paced}):
        group = [m for m in paced if (m.uuid, m.pace) == (uuid, pace)]
        run = got.filter(pl.col("uuid") == uuid)
        first = run.filter(pl.col("tag").is_in([m.key for m in group])).get_column("_key").min()
        seed = db.execute(LAST_OF, (uuid, pace, first)).fetchone()
        # The steps as stored, as the seed is: the pace metric's own, never numbered.
        last = pl.when(pl.col("tag") == pace).then(pl.col("stored")).forward_fill().fill_null(pl.lit(seed[0] if seed else None, dtype=pl.Int64()))
        index = pl.DataFrame([(m.key, m.before) for m in group], orient="row", schema={"tag": pl.String(), "before": pl.Int64()})
        mine = run.select("_key", "tag", last.alias("at")).join(index, on="tag", how="inner", maintain_order="left")
        mine = mine.filter((pl.int_range(pl.len(), dtype=pl.Int64).over("tag") + pl.col("before") >= 2) & pl.col("at").is_not_null()).select("_key", "at")
        got = got.join(mine, on="_key", how="left", maintain_order="left").with_columns(pl.coalesce("at", "step").alias("step")).drop("at")
    return got


def _logged_order(got: pl.DataFrame) -> pl.DataFrame:
    """Each run's metric in the order logged: by timestamp (then row), in the places its rows hold
    among the others'. MLflow's asynchronous logging (`synchronous=False`, which transformers'
    MLflowCallback uses) commits batches from a pool of threads, so rows land out of order: read in
    row order, every step going back was taken for a resume from a checkpoint, and the rows it
    seemed to replay replaced the spikes before them. A resume's own rows, logged later, stay after
    the rows they replay."""
    back = got.select(((pl.col("ts").diff() < 0) | ((pl.col("ts").diff() == 0) & (pl.col("step").diff() < 0))).over("uuid", "tag").any()).item()
    if not back:
        return got  # (each metric logged in order: nothing to move)
    slots = got.with_row_index("_slot")
    logged = slots.sort(["uuid", "tag", "ts", "step", "_key"], nulls_last=True)  # (a millisecond holds many quick steps)
    places = slots.sort(["uuid", "tag", "_slot"]).get_column("_slot")
    return logged.with_columns(places).sort("_slot").drop("_slot")


BATCH = {"_key": pl.Int64(), "uuid": pl.String(), "tag": pl.String(), "value": pl.Float64(), "is_nan": pl.Int64(), "step": pl.Int64(), "ts": pl.Int64(), "_taken": pl.Boolean()}


def _batch(rows: list[tuple]) -> tuple[pl.DataFrame, list[tuple]]:
    """A batch's rows as a frame, and those no reader can take (TAKEN) apart."""
    if all(row[-1] for row in rows):
        return pl.DataFrame(rows, orient="row", strict=False, schema=BATCH), []
    return pl.DataFrame([row for row in rows if row[-1]], orient="row", strict=False, schema=BATCH), [row for row in rows if not row[-1]]


def _passed(rows: list[tuple], names: dict[str, str]) -> list[sqlite_db.Passed]:
    """The rows no reader can take, each with why, of runs that are runs (a deleted run's are
    nobody's) or of no run at all."""
    passed = []
    for key, uuid, tag, value, is_nan, step, _, _ in rows:
        if not isinstance(uuid, str):
            passed.append(sqlite_db.Passed("(none)", key, "no run id"))
            continue
        if uuid not in names:
            continue
        if not isinstance(tag, str):
            why = f"metric name {_shown(tag)} is no text"
        elif isinstance(value, bool) or not isinstance(value, (int, float)):
            why = f"{tag}: value {_shown(value)} is not a number"
        elif not isinstance(step, int):
            why = f"{tag}: step {_shown(step)} is not a whole number"
        else:
            why = f"{tag}: is_nan {_shown(is_nan)} is not 0 or 1"
        passed.append(sqlite_db.Passed(names[uuid], key, why))
    return passed


def _shown(value: object) -> str:
    """A stored value as a warning shows it: short, a BLOB by its size."""
    if isinstance(value, bytes):
        return f"(a BLOB of {len(value):,} bytes)"
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:37]}..."


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
    return got.with_columns(seconds(got.get_column("ts"))).select(
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
