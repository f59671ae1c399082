"""Trackers that keep one metric a file, named by the file's path (DVCLive's
`plots/metrics/train/loss.tsv`, MLflow's `<run>/metrics/train/loss`): the file's lines say only
step and value, so the metric, and for MLflow the run, come from where the file is. The lines
are read by a LineFormat (whole lines, a cursor past complete ones, problems naming the line);
this puts the name its path gives on every row it hands out."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path

import polars as pl

from .. import table
from ..cursor import Cursor
from ..problems import Problem
from .base import LineFormat, Parsed, Sink

def seconds(ms: pl.Series) -> pl.Series:
    """Milliseconds (MLflow's and DVCLive's timestamps) as the `wall_time` column, in seconds,
    divided by numpy, exactly (1700000000.123, not the 1700000000.1230001 of a product with 0.001):
    polars divides a long column by a constant as a product with its reciprocal but a one-row
    column exactly, so that a timestamp read in pieces would get other digits than read whole."""
    return pl.Series("wall_time", ms.cast(pl.Float64()).to_numpy() / 1000.0, dtype=pl.Float64(), nan_to_null=True)


def in_seconds(rows: pl.DataFrame) -> pl.DataFrame:
    """Rows whose `wall_time` is in milliseconds with it in seconds (`seconds`)."""
    return rows.with_columns(seconds(rows.get_column("wall_time")))


PLACEHOLDER = ""
"""The tag a line parser gives its rows: the path's name replaces it."""


@dataclass(frozen=True)
class Named:
    """What a file's place says of its rows."""

    tag: str
    run: str | None = None
    """The run as the tracker names it (a raw `run` column), or None where the folder names it."""
    skipped: bool = False
    """Not to be read (an MLflow run deleted in its tracker: it is in the bin, not a run)."""
    problems: tuple[Problem, ...] = ()


@dataclass(frozen=True)
class OneMetric:
    """A reader of files holding one metric each, its lines read by `lines`, its name by `named`."""

    lines: LineFormat
    named: Callable[[Path], Named]
    by_path: bool = False
    """`lines.parse` takes the file's `path` (a metric placed by the others of its run)."""

    streams = True
    """`each` takes the rows of each block as it is read."""
    projects = False
    """A file is one tag: reader.read leaves out a file nobody needs after the read."""

    @property
    def name(self) -> str:
        return self.lines.name

    def read(self, path: Path, cursor: Cursor, *, final: bool, limit: int | None = None, each: Sink | None = None) -> Parsed:
        named = self.named(path)

        def tagged(rows: pl.DataFrame) -> pl.DataFrame:
            columns = [pl.lit(named.tag, dtype=pl.String()).alias("tag")]
            if named.run is not None:
                columns.append(pl.lit(named.run, dtype=pl.String()).alias("run"))
            return table.conform_raw(rows.with_columns(columns))

        if named.skipped:
            return Parsed(tagged(table.empty_raw()), cursor, named.problems)
        sink = (lambda rows: each(tagged(rows))) if each is not None else None
        lines = replace(self.lines, parse=partial(self.lines.parse, path=path)) if self.by_path else self.lines
        parsed = lines.read(path, cursor, final=final, limit=limit, each=sink)
        problems = (*named.problems, *parsed.problems)
        if parsed.cursor.steps == STEPLESS and _decided(cursor.index, parsed.cursor.index, final=final):
            told = stepless(named.run or path.parent.name, named.tag, beside=bool(parsed.cursor.pace))
            problems = (*problems, Problem(str(path), told))
        return replace(parsed, rows=tagged(parsed.rows), problems=problems)


def _decided(before: int, after: int, *, final: bool) -> bool:
    """Whether a read of a metric logged without a step says so (once): the one that reads its
    third row, where how its rows are placed is decided, or a final one of a metric of two rows."""
    return before <= 2 < after or (final and before <= 1 and after == 2)


STEPLESS = "stepless"
"""Cursor.steps of a metric logged without steps, whose rows its parser numbers in the order logged."""


def stepless(run: str, key: str, *, beside: bool = False) -> str:
    """What a read says once of a tracker's metric logged without a step (MLflow's store and file
    store both keep step 0 for each such row): numbered in order, or put at the steps of the
    metrics logged with steps `beside` it."""
    said = f"run {run}: {key} was logged without a step (all its rows at one step, MLflow's 0)"
    if beside:
        return f"{said} beside metrics logged with steps: each of its rows is put at the step of the last row with a step logged before it"
    return f"{said}: its rows are numbered in the order logged"
