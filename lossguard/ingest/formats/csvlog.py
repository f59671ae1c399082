"""CSV metrics files: PyTorch Lightning's CSVLogger `metrics.csv` (sparse columns, train and val rows
interleaved) and any CSV with a step column; with none, an `epoch` column is the step (Keras'
CSVLogger, whose `training.log` is CSV under a `.log` name: `epoch,accuracy,loss,val_loss`, epochs
from 0, `NA` for a value not logged that epoch; said once a file), else rows are numbered.
DeepSpeed's csv_monitor writes one such file a metric (`Train_Samples_train_loss.csv`: `step,train_loss`,
its step DeepSpeed's global sample count), and repeats the header when a job resumes into the same
folder: a line whose step is no number is no record.

Lightning rewrites the whole file, with a wider header, when a new metric first appears. The cursor
keeps the header it read and how many data rows it has handed out; a changed header means "read the
file again from the top and skip the rows already handed out".
"""

from __future__ import annotations

import csv
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl

from .. import table
from ..cursor import Cursor
from ..problems import Problem
from ..sources.textfile import STREAMED_BLOCK, iter_blocks, not_utf8
from .base import STEP_FALLBACKS, Format, Keep, Parsed, Sink, lines_of

SEPARATORS = (",", "\t", ";", "|")
"""The field separators a metrics table is written with, in the order a tie between them is settled."""
QUOTED = re.compile(r'"(?:[^"]|"")*"')


@dataclass(frozen=True)
class Dialect:
    """How a file's fields are written, as its header line shows: Python's csv module and pandas
    write commas unless told otherwise (`delimiter="\t"`, `sep=";"`), and a spreadsheet saving in
    a locale whose decimal mark is the comma (LibreOffice, Excel in de_DE, fr_FR...) separates its
    fields with `;` and writes `1,5` for 1.5. Read with commas, such a file was one column a line:
    nothing read, and nothing said."""

    separator: str = ","
    decimal_comma: bool = False
    aligned: bool = False
    """Columns of bare numbers under a header of names, apart by runs of spaces or tabs (a training
    script's own `print(f"{step:6d} {loss:8.4f}")` under `print("step loss lr")`): no quoting."""

    @classmethod
    def of(cls, header: str) -> Dialect:
        """The separator the header holds most of outside quotes (a metric's name holds none of them,
        or is quoted: `"loss, smoothed"`); a header of one name is comma-separated, one of several
        names apart by blanks only is an aligned table. A file not separated by commas may write its
        decimals with one."""
        bare = QUOTED.sub("", header)
        counts = {sep: bare.count(sep) for sep in SEPARATORS}
        separator = max(SEPARATORS, key=counts.__getitem__)
        if not counts[separator]:
            return ALIGNED if len(header.split()) > 1 else COMMAS
        return cls(separator, decimal_comma=separator != ",")

    def names(self, header: str) -> list[str]:
        if self.aligned:
            return header.split()
        return next(csv.reader([header], delimiter=self.separator), [])

    def fields(self, text: str) -> list[str]:
        if self.aligned:
            return text.split()
        return next(csv.reader([text], delimiter=self.separator), [])


COMMAS = Dialect()
ALIGNED = Dialect(aligned=True)
_BLANKS = re.compile(rb"[ \t]+")
_EDGE_COMMAS = re.compile(rb"^,|,(?=\r?$)", re.MULTILINE)


def _with_commas(data: bytes) -> bytes:
    """An aligned table's lines with one comma where each run of blanks was (none at a line's ends),
    which polars' CSV reader then reads as any CSV: a field of an aligned table holds no blank."""
    return _EDGE_COMMAS.sub(b"", _BLANKS.sub(b",", data))

STEP_COLUMNS = ("step", "global_step", "iteration", "iter", "trainer/global_step", "_step", "num_updates", "steps", "training_iteration")
EPOCH = "epoch"


def _first_line(path: Path, most: int = 1 << 20) -> str | None:
    with open(path, "rb") as fh:
        head = fh.readline(most)
    if not head.endswith(b"\n"):
        return None
    return head.decode("utf-8", errors="replace").rstrip("\r\n")


def _frame(header: str, body: bytes, *, dialect: Dialect, source: str, first_line: int, problems: list[Problem]) -> pl.DataFrame:
    """All cells as strings; polars does the work, the stdlib reader only where polars refuses."""
    if dialect.aligned:
        header, body, dialect = ",".join(dialect.names(header)), _with_commas(body), COMMAS
    data = header.encode("utf-8") + b"\n" + body
    names = dialect.names(header)
    options = {"separator": dialect.separator, "truncate_ragged_lines": True, "encoding": "utf8-lossy"}
    try:
        # Numbers parsed by the CSV reader itself; a column that is not numbers everywhere falls back to text.
        return pl.read_csv(data, schema=dict.fromkeys(names, pl.Float64()), decimal_comma=dialect.decimal_comma, **options)
    except pl.exceptions.PolarsError:
        pass
    try:
        frame = pl.read_csv(data, infer_schema=False, **options)
    except pl.exceptions.PolarsError as exc:
        rows = []
        bad: list[int] = []
        # Line by line, so that one line the stdlib reader refuses too (a stray carriage return in a
        # field, a field over its size limit) costs that line, not the block.
        for i, text in enumerate(lines_of(body.decode("utf-8", errors="replace"))):
            try:
                fields = dialect.fields(text)
            except csv.Error:
                bad.append(first_line + i)
                continue
            if len(fields) > len(names):
                problems.append(Problem(source, f"row has {len(fields)} fields, header has {len(names)}; extra fields ignored", line=first_line + i))
            rows.append((fields + [""] * len(names))[: len(names)])
        if bad:
            more = f" (and {len(bad) - 1} more lines)" if len(bad) > 1 else ""
            problems.append(Problem(source, f"unreadable CSV line skipped{more}", line=bad[0]))
        if not rows and not bad:
            problems.append(Problem(source, f"unreadable CSV: {exc}", line=first_line))
        frame = pl.DataFrame(rows, schema=dict.fromkeys(names, pl.String()), orient="row")
    return _decimal_points(frame) if dialect.decimal_comma else frame


def _numbers(column: pl.Series) -> pl.Series:
    if column.dtype == pl.String:
        return column.str.strip_chars().cast(pl.Float64, strict=False)
    return column.cast(pl.Float64, strict=False)


DECIMAL_COMMA = r"^\s*[-+]?\d*,\d+(?:[eE][-+]?\d+)?\s*$"


def _decimal_points(frame: pl.DataFrame) -> pl.DataFrame:
    """A comma-decimal file's numbers as numbers (`1,5`: 1.5), where polars read the block as text
    (a cell no number): only cells that are a number but for their comma change."""
    text = [c for c, t in frame.schema.items() if t == pl.String]
    return frame.with_columns(
        pl.when(pl.col(c).str.contains(DECIMAL_COMMA)).then(pl.col(c).str.replace(",", ".", literal=True)).otherwise(pl.col(c)).alias(c) for c in text
    )


def _rows(frame: pl.DataFrame, cursor: Cursor, *, keep: Keep | None = None, skip: int = 0, tag: str = "value") -> tuple[pl.DataFrame, table.Span | None, Cursor]:
    """Long rows in file order (row, then column) with `record`, the 1-based data-row number, of the
    records after `skip` and the columns `keep` keeps; and the span of every column's rows. A table
    already long (a `value` column) is read as it is (_long_rows), `tag` naming a file of one metric."""
    lowered = {c.lower(): c for c in frame.columns}
    if frame.height and _long(lowered):
        return _long_rows(frame, lowered, cursor, keep=keep, skip=skip, tag=tag)
    if frame.height and (chart := _chart(frame.columns)):
        return _chart_rows(frame, lowered, chart, cursor, keep=keep, skip=skip)
    step_col = _step_column(lowered)
    by_epoch = step_col is not None and step_col.lower() == EPOCH
    n = frame.height
    if n == 0:
        return table.empty_raw().with_columns(pl.lit(None, dtype=pl.Int64).alias("record")), None, cursor
    record = np.arange(cursor.index + 1, cursor.index + 1 + n, dtype=np.int64)
    if step_col is None:
        steps = pl.Series(record)
    else:
        steps = _numbers(frame.get_column(step_col)).cast(pl.Int64, strict=False)
    names = [c for c in frame.columns if c != step_col and c]
    kept = [c for c in names if keep(c)] if keep is not None else names
    values = frame.select([_numbers(frame.get_column(c)) for c in kept])
    placed = steps.is_not_null()
    if skip > cursor.index:
        placed = placed & pl.Series(record > skip)
    span = None
    if keep is not None:
        # What every column covers, kept or not: rows with a step and any value.
        valued = frame.select(pl.any_horizontal([_numbers(frame.get_column(c)).is_not_null() for c in names]) if names else pl.lit(False)).to_series()
        covered = steps.filter(placed & valued)
        span = (int(covered.min()), int(covered.max())) if covered.len() else None
    k = len(kept)
    own = steps.drop_nulls() if step_col else None
    last_step = own[-1] if own is not None and own.len() else cursor.last_step
    after = cursor.advance(index=cursor.index + n, last_step=last_step, steps=EPOCH if by_epoch else cursor.steps)
    if not k:
        return table.empty_raw().with_columns(pl.lit(None, dtype=pl.Int64).alias("record")), span, after
    # Row-major, as the file reads: every value of row 1, then of row 2...
    valid = (values.select(pl.all().is_not_null()).to_numpy(order="c") & placed.to_numpy()[:, None]).ravel()
    rows = pl.DataFrame(
        {
            "step": np.repeat(steps.fill_null(0).to_numpy(), k)[valid],
            "record": np.repeat(record, k)[valid],
            "tag": pl.Series(kept, dtype=pl.Categorical()).gather(pl.Series(np.tile(np.arange(k, dtype=np.uint32), n)[valid])),
            "value": values.to_numpy(order="c").astype(np.float64, copy=False).ravel()[valid],
        },
        schema={"step": pl.Int64(), "record": pl.Int64(), "tag": pl.Categorical(), "value": pl.Float64()},
    ).with_columns(pl.lit(None, dtype=pl.Float64).alias("wall_time"))
    return rows, span, after


VALUE = "value"
NAME_COLUMNS = ("tag", "metric", "key", "name")
WALL_COLUMNS = ("wall_time", "wall time", "timestamp")
TENSORBOARD_EXPORT = re.compile(r"^run-(?P<run>.+)-tag-(?P<tag>.+)\.csv$")
"""TensorBoard's "download as CSV" of one run's tag (`Wall time,Step,Value`), its `/`s as `_`s."""


def _long(lowered: dict[str, str]) -> bool:
    """A long table: a `value` column beside a column naming each row's metric, or beside a step and
    a wall time only (one metric's, TensorBoard's download). A wide table with a metric called
    `value` (an RL value estimate, `step,policy_loss,value`) is no long one."""
    if VALUE not in lowered:
        return False
    return any(k in lowered for k in NAME_COLUMNS) or set(lowered) <= {VALUE, *STEP_COLUMNS, *WALL_COLUMNS}


def _long_rows(
    frame: pl.DataFrame, lowered: dict[str, str], cursor: Cursor, *, keep: Keep | None, skip: int, tag: str
) -> tuple[pl.DataFrame, table.Span | None, Cursor]:
    """A table of one value a row: `step, metric, value` (lossguard's own `read --format csv`, with
    its `run` column, many custom loggers) or one metric's `Wall time, Step, Value` (TensorBoard's
    CSV download, named `tag` by its file). Read as columns, it was a run of two metrics, `value`
    and `wall_time`, neither of them judged."""
    n = frame.height
    record = np.arange(cursor.index + 1, cursor.index + 1 + n, dtype=np.int64)
    step_col = next((lowered[k] for k in STEP_COLUMNS if k in lowered), None)
    name_col = next((lowered[k] for k in NAME_COLUMNS if k in lowered), None)
    wall_col = next((lowered[k] for k in WALL_COLUMNS if k in lowered), None)
    steps = _numbers(frame.get_column(step_col)).cast(pl.Int64, strict=False) if step_col else pl.Series(record)
    names = frame.get_column(name_col).cast(pl.String).str.strip_chars() if name_col else pl.repeat(tag, n, eager=True, dtype=pl.String())
    values = _numbers(frame.get_column(lowered[VALUE]))
    wall = _numbers(frame.get_column(wall_col)) if wall_col else pl.repeat(None, n, eager=True, dtype=pl.Float64())
    columns = {"step": steps, "record": pl.Series(record), "tag": names.cast(pl.Categorical()), "value": values, "wall_time": wall}
    if "run" in lowered:
        columns["run"] = frame.get_column(lowered["run"]).cast(pl.String)
    rows = pl.DataFrame(columns).filter(pl.col("step").is_not_null() & pl.col("value").is_not_null() & (pl.col("tag").cast(pl.String) != ""))
    covered = rows.get_column("step")
    span = (int(covered.min()), int(covered.max())) if keep is not None and covered.len() else None
    rows = rows.filter(pl.col("record") > skip) if skip > cursor.index else rows
    if keep is not None:
        kept = [t for t in rows.get_column("tag").cast(pl.String).unique().to_list() if keep(t)]  # (asked once a name)
        rows = rows.filter(pl.col("tag").cast(pl.String).is_in(kept))
    own = steps.drop_nulls() if step_col else None
    after = cursor.advance(index=cursor.index + n, last_step=own[-1] if own is not None and own.len() else cursor.last_step)
    return rows, span, after


CHART_COLUMN = re.compile(r"^(?P<run>.+) - (?P<metric>.+?)(?P<range>__MIN|__MAX)?$")
"""A column of W&B's "Export CSV" of a line chart: `<run> - <metric>` a run's values, `__MIN` and
`__MAX` after it the range of the chart's point (the values a bucket of a sampled chart, or a
smoothed line, stands for: the same metric, not one to judge)."""


def _chart(columns: list[str]) -> dict[str, tuple[str, str]] | None:
    """The columns of a W&B chart export holding values, each with its run and metric; None for a
    file of another shape. Every column but the x-axis (`Step`, or a wall time) is `<run> - <metric>`
    (a run's name may hold ` - `: the metric is after the last)."""
    values: dict[str, tuple[str, str]] = {}
    axis = {*STEP_COLUMNS, EPOCH, *WALL_COLUMNS, "relative time (wall)", "relative time (process)"}
    for column in columns:
        if column.lower() in axis:
            continue
        found = CHART_COLUMN.match(column)
        if found is None:
            return None
        if found["range"] is None:
            values[column] = (found["run"], found["metric"])
    return values or None


def _chart_rows(
    frame: pl.DataFrame, lowered: dict[str, str], chart: dict[str, tuple[str, str]], cursor: Cursor, *, keep: Keep | None, skip: int
) -> tuple[pl.DataFrame, table.Span | None, Cursor]:
    """W&B's line-chart export, several runs side by side (`Step, a - train/loss, a - train/loss__MIN,
    a - train/loss__MAX, b - train/loss, ...`): each `<run> - ` a run of its own (the rows' `run`),
    its metric named as the run logged it; the `__MIN`/`__MAX` range columns are not read. Read as a
    table of columns, no column was the loss and two runs' same metric fell into one series."""
    n = frame.height
    record = np.arange(cursor.index + 1, cursor.index + 1 + n, dtype=np.int64)
    step_col = _step_column(lowered)
    steps = _numbers(frame.get_column(step_col)).cast(pl.Int64, strict=False) if step_col else pl.Series(record)
    columns = list(chart)
    long = (
        frame.select(steps.alias("step"), pl.Series("record", record), *(_numbers(frame.get_column(c)).alias(str(k)) for k, c in enumerate(columns)))
        .unpivot(index=["step", "record"], variable_name="column", value_name="value")
        .with_columns(pl.col("column").cast(pl.UInt32))
        .filter(pl.col("step").is_not_null() & pl.col("value").is_not_null())
        .sort("record", "column")  # (row-major, as the file reads)
    )
    runs = pl.Series([chart[c][0] for c in columns], dtype=pl.String())
    tags = pl.Series([chart[c][1] for c in columns], dtype=pl.String())
    rows = long.select(
        "step", "record", tags.gather(long.get_column("column")).cast(pl.Categorical()).alias("tag"), "value",
        pl.lit(None, dtype=pl.Float64).alias("wall_time"), runs.gather(long.get_column("column")).alias("run"),
    )
    covered = rows.get_column("step")
    span = (int(covered.min()), int(covered.max())) if keep is not None and covered.len() else None
    rows = rows.filter(pl.col("record") > skip) if skip > cursor.index else rows
    if keep is not None:
        kept = [t for t in dict.fromkeys(tags.to_list()) if keep(t)]
        rows = rows.filter(pl.col("tag").cast(pl.String).is_in(kept))
    own = steps.drop_nulls() if step_col else None
    after = cursor.advance(index=cursor.index + n, last_step=own[-1] if own is not None and own.len() else cursor.last_step)
    return rows, span, after


class CsvFormat:
    name = "csv"
    streams = True
    """`each` takes the rows of each block as it is read (reader.read)."""
    projects = True
    """`keep` picks the columns made into rows (the others are only looked at for the span)."""

    def read(self, path: Path, cursor: Cursor, *, final: bool, limit: int | None = None, each: Sink | None = None, keep: Keep | None = None) -> Parsed:
        sink = (lambda rows: each(table.conform_raw(rows))) if each is not None else None
        parsed = self._read(path, cursor, final=final, limit=limit, each=sink, keep=keep)
        problems = parsed.problems
        if parsed.cursor.steps != cursor.steps and parsed.cursor.steps in STEP_FALLBACKS:
            problems = (*problems, Problem(str(path), STEP_FALLBACKS[parsed.cursor.steps]))
        return Parsed(table.conform_raw(parsed.rows), parsed.cursor, problems, span=parsed.span, projected=parsed.projected)

    def _read(
        self, path: Path, cursor: Cursor, *, final: bool, limit: int | None = None, each: Sink | None = None, keep: Keep | None = None, skip: int = 0
    ) -> Parsed:
        """`skip`: data rows already handed out (of a file rewritten with a new header)."""
        problems: list[Problem] = []
        whole = final and limit is None and cursor.offset == 0  # (the whole file, read from its top: scan's read)
        source = str(path)
        if cursor.header is not None and cursor.offset > 0:
            current = _first_line(path)
            if current is not None and current != cursor.header:
                # Rewritten with a new header (Lightning adds a column): start over, skip what was seen.
                fresh = self._read(path, Cursor(), final=final, limit=limit, each=each, keep=keep, skip=cursor.index)
                message = "rewritten with a new header; read again from the top, rows already read are skipped"
                return Parsed(fresh.rows, fresh.cursor, (*fresh.problems, Problem(source, message, line=1)), span=fresh.span, projected=fresh.projected)
        frames: list[pl.DataFrame] = []
        spans: list[table.Span | None] = []
        warned = False
        handed, unplaced, first_unplaced = 0, 0, None
        for block in iter_blocks(path, cursor, final=final, problems=problems, limit=limit, block=STREAMED_BLOCK if each is not None else None):
            data, first = block.data, block.first_line
            if not warned:
                problem = not_utf8(data, first_line=first, source=source)
                if problem:
                    problems.append(problem)
                    warned = True
            header = cursor.header
            if header is None:
                if not data:
                    cursor = block.cursor
                    continue
                head, _, data = data.partition(b"\n")
                header, first = head.decode("utf-8", errors="replace").rstrip("\r"), first + 1
            if data and not data.isspace():  # (strip() would copy the block to answer)
                frame = _frame(header, data, dialect=Dialect.of(header), source=source, first_line=first, problems=problems)
                lost = _unplaced(frame, skip=skip - cursor.index)
                if lost.size:
                    unplaced += lost.size
                    first_unplaced = first_unplaced if first_unplaced is not None else first + int(lost[0])
                rows, span, cursor = _rows(frame, cursor, keep=keep, skip=skip, tag=_one_metric(path))
                spans.append(span)
                handed += rows.height
                each(rows) if each is not None else frames.append(rows)
            cursor = block.cursor.advance(header=header, index=cursor.index, last_step=cursor.last_step, steps=cursor.steps)
        if unplaced:
            # One summary per read, as for the text formats' lines: a file can hold millions of them.
            more = f" (and {unplaced - 1:,} more row(s) like it)" if unplaced > 1 else ""
            problems.append(Problem(source, f"step is not a whole number from 0 to 2^63-1; this row's values are skipped{more}", line=first_unplaced))
        span = table.joined(spans)
        if whole and not handed and span is None and cursor.header is not None:
            problems.append(_nothing_read(source, cursor))
        rows = pl.concat(frames, rechunk=False) if frames else _rows(pl.DataFrame(), cursor)[0]
        return Parsed(rows, cursor, tuple(problems), span=span, projected=keep is not None)


def _step_column(lowered: dict[str, str]) -> str | None:
    """The column holding a row's step: a step column, else the epoch (Keras' CSVLogger)."""
    return next((lowered[k] for k in (*STEP_COLUMNS, EPOCH) if k in lowered), None)


def _unplaced(frame: pl.DataFrame, *, skip: int = 0) -> np.ndarray:
    """The rows (0-based, of those after the first `skip`) whose step cell holds something that is
    no whole number (`inf`, `nan`, `1e30`, a word): their values are at no step. A cell repeating
    the step column's own name is the header written again (DeepSpeed's csv_monitor on a resumed
    job), no row; an empty cell is no step written."""
    step_col = _step_column({c.lower(): c for c in frame.columns})
    if step_col is None or not frame.height:
        return np.zeros(0, dtype=np.int64)
    cells = frame.get_column(step_col)
    if cells.dtype == pl.String:
        text = cells.str.strip_chars()
        written = text.is_not_null() & (text != "") & (text.str.to_lowercase() != step_col.lower())
    else:
        written = cells.is_not_null()
    lost = (written & _numbers(cells).cast(pl.Int64, strict=False).is_null()).to_numpy()
    lost[: max(skip, 0)] = False
    return np.flatnonzero(lost)


def _nothing_read(source: str, cursor: Cursor) -> Problem:
    """What a whole file that gave no value says: scan would otherwise call the run clean having
    judged nothing (a file whose separator or decimal mark was not recognised, a table of notes)."""
    if not cursor.index:
        return Problem(source, "a header and no data row: no metric read from this file")
    header = cursor.header or ""
    shown = header if len(header) <= 120 else header[:117] + "..."
    return Problem(source, f"no metric read from this file: none of its columns holds a number at a step in its {cursor.index:,} data row(s) (header: {shown!r})")


def _one_metric(path: Path) -> str:
    """The metric a long table of one metric holds: its file's (TensorBoard's `run-x-tag-train_loss.csv`: train_loss)."""
    exported = TENSORBOARD_EXPORT.match(path.name)
    return exported["tag"] if exported else path.stem


CSV = CsvFormat()
KERAS_HEADER = re.compile(r"^epoch(?:,[^,\s\"][^,\"]*)+$")
"""Keras' CSVLogger's first line: `epoch`, then its metrics' names (sorted), comma-separated."""


ALIGNED_NAME = re.compile(r"[A-Za-z_][\w./-]*")
ALIGNED_NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*(?:[eE][-+]?\d+)?|\.\d+(?:[eE][-+]?\d+)?|nan|inf|NaN|Inf|-?Infinity)")
ALIGNED_ROWS = 3
"""Rows of numbers under an aligned header that make a table of it (one could be any line)."""


def _is_aligned_table(path: Path, header: str) -> bool:
    """A header of two or more names apart by blanks, one of them a metric lossguard judges or a
    step, over rows of as many bare numbers (the first ALIGNED_ROWS of them, or as many as are
    written yet when at least one is). Names alone are no table: a sentence is names too."""
    names = header.split()
    if len(names) < 2 or not all(ALIGNED_NAME.fullmatch(name) for name in names):
        return False
    from .. import vocabulary

    lowered = [name.lower() for name in names]
    if not any(name in STEP_COLUMNS or name == EPOCH or vocabulary.recognise(name) is not None for name in lowered):
        return False
    with open(path, "rb") as fh:
        fh.readline(64 << 10)
        head = fh.read(16 << 10)
    rows = head.decode("utf-8", errors="replace").split("\n")[:-1][:ALIGNED_ROWS]
    return bool(rows) and all(
        len(fields := row.split()) == len(names) and all(ALIGNED_NUMBER.fullmatch(f) for f in fields) for row in rows
    )


def _is_table_under_another_name(path: Path, head: Callable[[], bytes]) -> bool:
    """A CSV file under another suffix (Keras' `training.log`), or an aligned table of numbers
    (Dialect.aligned) in a `.txt` or `.log`: told by its header line and first rows, so a run's file
    is known before its first epoch ends. (The lines are read here, not from `head`, which reads
    megabytes.)"""
    if path.suffix.lower() == ".csv":
        return False
    line = _first_line(path, 64 << 10)
    if line is None:
        return False
    return KERAS_HEADER.match(line) is not None or _is_aligned_table(path, line.rstrip("\r"))


FORMAT = Format(reader=CSV, suffixes=(".csv",), head=_is_table_under_another_name)
