"""Writing the canonical table for people (aligned text, names made printable) and programs (CSV,
JSON lines: names exact)."""

from __future__ import annotations

import json
import os
import queue
import re
import threading
from collections.abc import Callable, Sequence
from typing import NamedTuple, TextIO

import polars as pl

from ..ingest import table
from ..display import table_lines
from ..escaping import printable
from ..model import json_number

BLOCKWISE = ("csv", "json")
"""Output formats written a block at a time (BlockWriter): `lossguard read` streams them."""


SLICE = 200_000
"""Rows turned into text at a time."""


class BlockWriter:
    """CSV or JSON lines of the canonical table, written a block at a time as the blocks are read,
    byte for byte what writing the whole table at once writes (the CSV header once, at the top).

    Run and source are the same on every row of a file's block, and written out on every row they
    were most of the work: polars' CSV writer is given the other columns only, and the text before
    them (`run,source,` or `{"run": ..., "step": `) once per line as its line terminator. With
    `behind`, blocks are written on a thread of their own while the next one is read (polars
    releases the GIL in both): a read then costs about the longer of the two, not their sum. Use it
    as a context manager then, so the thread is stopped on every way out."""

    def __init__(self, fmt: str, out: TextIO, *, metrics: Sequence[str] | None = None, behind: bool = False) -> None:
        self.fmt = fmt
        self.out = out
        self.metrics = list(metrics) if metrics else None
        self.rows = 0
        """Rows read (before the metric filter)."""
        self._header = fmt == "csv"
        self._behind = behind
        self._queue: queue.Queue[list[_Stretch] | None] = queue.Queue(maxsize=1)
        self._thread: threading.Thread | None = None
        self._failed: BaseException | None = None

    def write(self, frame: pl.DataFrame) -> None:
        if not frame.height:
            return
        self.rows += frame.height
        stretches = _stretches(frame)
        if not self._behind:
            self._write(stretches)
            return
        if self._thread is None:
            self._thread = threading.Thread(target=self._drain, name="lossguard-read-writer", daemon=True)
            self._thread.start()
        if self._failed is not None:
            raise self._failed
        self._queue.put(stretches)

    def close(self) -> None:
        """The blocks still queued; then the header of a table with no rows, if no block wrote one."""
        self._stop()
        if self._failed is not None:
            raise self._failed
        if self._header:
            self.out.write(pl.DataFrame(schema=table.SCHEMA).write_csv())
            self._header = False

    def __enter__(self) -> BlockWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop()

    def _stop(self) -> None:
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join()
            self._thread = None

    def _drain(self) -> None:
        while (stretches := self._queue.get()) is not None:
            if self._failed is None:
                try:
                    self._write(stretches)
                except BaseException as exc:  # noqa: BLE001 - handed to the reading thread (a closed pipe, a full disk)
                    self._failed = exc

    def _write(self, stretches: list[_Stretch]) -> None:
        # Bytes straight to the binary stream under `out` when it has one (polars writes them itself:
        # no text of the block is built in Python), in slices either way (the text of a whole block, a
        # few million rows, would be several times its table).
        binary = getattr(self.out, "buffer", None)
        if binary is not None:
            self.out.flush()
        for stretch in stretches:
            rows = stretch.rows
            if self.metrics is not None:
                rows = rows.filter(pl.col("metric").is_in(self.metrics) | pl.col("tag").is_in(self.metrics))
            if not rows.height:
                continue
            if self._header:
                self._text(binary, pl.DataFrame(schema=table.SCHEMA).write_csv())
                self._header = False
            lines = _csv_lines(stretch.run, stretch.source, rows) if self.fmt == "csv" else _json_lines(stretch.run, stretch.source, rows)
            # Each line ends in the next one's lead; the last one in the bare terminator.
            self._text(binary, lines.lead)
            last = rows.height - 1
            for start in range(0, last, SLICE):
                self._rows(binary, lines.columns(rows.slice(start, min(SLICE, last - start))), line_terminator=lines.end + lines.lead, **lines.options)
            self._rows(binary, lines.columns(rows.slice(last)), line_terminator=lines.end, **lines.options)

    def _text(self, binary, text: str) -> None:  # noqa: ANN001
        binary.write(text.encode()) if binary is not None else self.out.write(text)

    def _rows(self, binary, rows: pl.DataFrame, **kwargs) -> None:  # noqa: ANN001, ANN003
        try:
            if binary is not None:
                rows.write_csv(binary, include_header=False, **kwargs)
            else:
                self.out.write(rows.write_csv(include_header=False, **kwargs))
        except OSError as exc:
            raise _as_raised(exc, self.out) from None


def _as_raised(exc: OSError, out: TextIO) -> Exception:
    """A write's failure as the CLI reports it (`output.write_failed`). Polars reports an OS error as
    a plain OSError, with the code at most in its text (Rust's `(os error 32)`, or Python's
    `[Errno 32]` when it came from the Python file polars wrote to); a closed pipe must be
    BrokenPipeError, which the CLI takes for the reader of its output going away (`| head`)."""
    from .output import write_failed

    if type(exc) is not OSError:  # (a subclass says what it is already)
        return exc
    found = re.search(r"\(os error (\d+)\)|\[Errno (\d+)\]", str(exc))
    code = exc.errno or (int(found.group(1) or found.group(2)) if found else None)
    return write_failed(OSError(code, os.strerror(code)), getattr(out, "name", "the output")) if code else exc


class _Stretch(NamedTuple):
    """Rows of one run and source, less those two columns: what a block costs on the writer's queue."""

    run: str | None
    source: str | None
    rows: pl.DataFrame


def _stretches(frame: pl.DataFrame) -> list[_Stretch]:
    """The frame in stretches of one run and source (a block from a read always is one)."""
    same = frame.select(pl.all_horizontal(pl.col(c).eq_missing(pl.col(c).first()).all() for c in ("run", "source"))).item()
    lengths = [frame.height] if same else frame.select(pl.struct("run", "source").rle().struct.field("len")).to_series().to_list()
    stretches, start = [], 0
    for length in lengths:
        part = frame.slice(start, length)
        # From a one-row frame: run and source are usually polars' constant columns, which a Series
        # of them would spell out on every row (tens of MB for a big table).
        run, source = part.head(1).select("run", "source").row(0)
        stretches.append(_Stretch(run, source, part.drop("run", "source")))
        start += length
    return stretches


class _Lines(NamedTuple):
    """How a stretch of one file's rows is written: `lead`, the text every line starts with, once;
    `columns(rows)`, what polars writes after it (with `options`); `end`, what ends each line."""

    lead: str
    columns: Callable[[pl.DataFrame], pl.DataFrame]
    end: str
    options: dict


FORMULA = ("=", "+", "-", "@")
"""What a spreadsheet takes a cell for a formula by (`=HYPERLINK(...)` as a W&B project or an MLflow
run name): such a name is written after a `'`, which shows it as text (OWASP's CSV injection)."""


def cell(name: str) -> str:
    """A name as a CSV field shows it: control characters visible (printable), a formula defused."""
    shown = printable(name)
    return "'" + shown if shown.startswith(FORMULA) else shown


def _csv_lines(run: str | None, source: str | None, rows: pl.DataFrame) -> _Lines:
    """Run and source as polars writes them (its own quoting, taken from a one-row write), then the
    other columns, never quoted when polars would quote none of their names. CSV has no escapes of
    its own: control characters in names are written as the table shows them (`\\x1b`), so that
    `read --format csv` on a terminal cannot drive it (JSON keeps them exact, escaped as JSON is)."""
    shown = {"run": [None if run is None else cell(run)], "source": [None if source is None else cell(source)]}
    lead = pl.DataFrame(shown, schema={"run": pl.String(), "source": pl.String()}).write_csv(include_header=False)[:-1] + ","
    shown_as = {c: {n: cell(n) for n in rows.get_column(c).unique().drop_nulls().to_list()} for c in ("metric", "tag")}
    escaped = {c: {n: s for n, s in names.items() if s != n} for c, names in shown_as.items()}
    plain = all(_csv_as_is(pl.Series(c, list(names.values()), dtype=pl.String())) for c, names in shown_as.items())
    # No wall time (most text logs): its empty field ends the line too.
    timed = _any_value(rows.get_column("wall_time"))

    def columns(part: pl.DataFrame) -> pl.DataFrame:
        part = part.with_columns(pl.col(c).replace(mapping) for c, mapping in escaped.items() if mapping) if any(escaped.values()) else part
        return part if timed else part.drop("wall_time")

    return _Lines(lead, columns, "\n" if timed else ",\n", {"float_precision": None, "quote_style": "never" if plain else "necessary"})


def _any_value(column: pl.Series) -> bool:
    return column.null_count() < column.len()


def _csv_as_is(names: pl.Series) -> bool:
    """Polars writes none of these names quoted (asked of polars itself: writing them either way)."""
    one = names.to_frame()
    return one.write_csv(include_header=False) == one.write_csv(include_header=False, quote_style="never")


def _json_lines(run: str | None, source: str | None, rows: pl.DataFrame) -> _Lines:
    """Each row as `json.dumps(row)` writes it, NaN and infinities as json_number's strings: the step
    as polars writes it, the rest of the line built column-wise (a Python dict per row made JSON
    output 6x slower than the read). Names are encoded by json.dumps itself (the few distinct ones;
    plain ones, nearly all, only need quotes around them); numbers as Python's repr (_json_float)."""
    lead = f'{{"run": {json.dumps(run)}, "source": {json.dumps(source)}, "step": '
    # The separator polars writes after the step is JSON's comma.
    names = [' "metric": ', *_json_name(rows, "metric"), ', "tag": ', *_json_name(rows, "tag"), ', "value": ']
    timed = _any_value(rows.get_column("wall_time"))

    def columns(part: pl.DataFrame) -> pl.DataFrame:
        pieces = [*names, pl.lit(_json_float(part.get_column("value")))]
        if timed:
            pieces += [', "wall_time": ', pl.lit(_json_float(part.get_column("wall_time")))]
        return part.select("step", _formatted(pieces).alias("rest"))

    end = "}\n" if timed else ', "wall_time": null}\n'
    return _Lines(lead, columns, end, {"quote_style": "never", "null_value": "null"})


def _json_name(rows: pl.DataFrame, column: str) -> list[str | pl.Expr]:
    names = rows.get_column(column).unique()
    listed = names.drop_nulls().to_list()
    if len(listed) == names.len() and all(json.dumps(n) == f'"{n}"' for n in listed):
        return ['"', pl.col(column), '"']
    return [pl.col(column).replace_strict(listed, [json.dumps(n) for n in listed], default=None).fill_null("null")]


def _formatted(pieces: list[str | pl.Expr]) -> pl.Expr:
    """The pieces (text as is, columns' values) joined on each row: `pl.format` does it in two thirds
    of concat_str's time. The text is lossguard's own JSON punctuation, which holds no braces."""
    assert not any(isinstance(p, str) and ("{" in p or "}" in p) for p in pieces)
    return pl.format("".join(p if isinstance(p, str) else "{}" for p in pieces), *(p for p in pieces if not isinstance(p, str)))


def _json_float(column: pl.Series) -> pl.Series:
    """polars' shortest float form is Python's repr except below 1e-4, where Python switches to an
    exponent (those few by repr)."""
    text = column.cast(pl.String)
    small = (column.abs() < 1e-4) & (column != 0)
    if small.any():
        text = text.scatter(small.arg_true(), [repr(v) for v in column.filter(small).to_list()])
    nonfinite = ~column.is_finite()
    if nonfinite.any():
        text = text.scatter(nonfinite.arg_true(), [json.dumps(json_number(v)) for v in column.filter(nonfinite).to_list()])
    return text.fill_null("null")


def write_mapping(frame: pl.DataFrame, out: TextIO, steps: dict[str, list[str]] | None = None) -> None:
    """Which tag each run's canonical metrics are read from, one line a run: the first thing to check
    when a cause looks wrong is whether the grad norm was found at all; and, from `steps` (run ->
    what was said), how a file's steps were placed where its format had to choose."""
    from ..detection.engine import tags_used
    from ..detection.loss_parts import with_summed_loss

    for (run,), rows in frame.partition_by("run", as_dict=True, maintain_order=True).items():
        used = tags_used(with_summed_loss(rows))
        said = ", ".join(f"{metric} <- {printable(tag)}" for metric, tag in used.items()) or "none recognised"
        placed = "".join(f"; {printable(s)}" for s in (steps or {}).get(run, []))
        out.write(f"metrics ({printable(run)}): {said}{placed}\n")
    out.write("\n")


def write_table(frame: pl.DataFrame, fmt: str, out: TextIO) -> None:
    if fmt in BLOCKWISE:
        writer = BlockWriter(fmt, out)
        writer.write(frame)
        writer.close()
    else:
        cols = frame.columns
        rows = [[("" if v is None else (repr(v) if isinstance(v, float) else printable(str(v)))) for v in r] for r in frame.iter_rows()]
        out.write("".join(line + "\n" for line in table_lines(rows, cols)))
