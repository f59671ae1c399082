"""The lines of many small logs of one format parsed in one call: what a daemon pass over hundreds of
busy runs reads (a few new lines from each file), and what a scan of a thousand small runs reads.
`reader.read` costs 4-15 ms a file whatever it reads (a few dozen polars queries), which held a pass
over 300 runs to over a second and a scan of 1,000 runs to 10 s; here the queries run once over all
the files' lines.

Only where the answer cannot differ from reading each file alone. A format says which of its lines
depend on the lines before them in their file, or on the cursor (`Together.marks`: a JSON line
naming no step; a Megatron OVERFLOW line before any iteration line of its file), and what of a
file's cursor the batch's parse can not tell (`Together.settles`: whether a key-value log's steps
are its `step` keys or its epochs): such a file is left for `reader.read`, as is one whose bytes are not one clean block (UTF-8, no binary damage,
no over-long line, no byte-order mark) or whose rows are not all at a usable step, and everything
when the parser does not give back the line each row came from. Each file's cursor goes on as the
parser moves it (its records counted, its last step kept). tests/test_many_runs.py pins all of it
to `read`.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl

from . import table
from .cursor import Cursor
from ..escaping import decodable
from .formats.base import BINARY_LINE, REPEATS, SMALL_BLOCK, LineFormat, only_newlines, repeats, split_lines
from .formats.onemetric import OneMetric
from .needs import Needs
from .problems import Problem
from .reader import BUILTIN, ReadOptions, ReadResult
from .sources.textfile import iter_blocks

@dataclass(frozen=True)
class Job:
    path: Path
    cursor: Cursor
    run: str
    fmt: str
    """Jobs of one format are parsed together; a format that can not be (`batched`) is read alone."""
    limit: int | None = None
    final: bool = False
    """As `read` takes it: the file is complete (a scan), so a last line without its newline is read."""


@dataclass
class _File:
    job: Job
    data: bytes
    """The new lines' bytes (UTF-8), ending in a newline."""
    lines: int
    end: Cursor
    """Where reading goes on after the block."""


def batched(fmt: str | None, options: ReadOptions) -> bool:
    """Whether files of `fmt` can be read together (a user's format of the same name can not):
    lines a format's `together` marks, or records a format's `read_together` decodes (W&B's)."""
    reader = BUILTIN.get(fmt) if fmt else None
    if reader is None or options.reader(fmt) is not reader:
        return False
    lines = _lines_of(reader)
    return (lines is not None and lines.together is not None) or hasattr(reader, "read_together")


def _lines_of(reader) -> LineFormat | None:  # noqa: ANN001 - (any built-in reader)
    """The line format a batch parses for `reader`: its own, or that of a reader of one metric a
    file (DVCLive's), whose files each give their rows the tag their path names."""
    if isinstance(reader, OneMetric):
        return reader.lines
    return reader if isinstance(reader, LineFormat) else None


def read_many(jobs: Sequence[Job], *, options: ReadOptions, needs: Needs | None = None, lean: bool = False, largest: int = SMALL_BLOCK) -> list[ReadResult | None]:
    """For each job, what `read(path, cursor, run=run, fmt=fmt, final=final, options=options,
    limit=limit, needs=needs, lean=lean)` returns, or None where the file must be read on its own
    (also any file with `largest` bytes or more to read). Each format's files in one parse."""
    out: list[ReadResult | None] = [None] * len(jobs)
    by_format: dict[str, list[int]] = {}
    for k, job in enumerate(jobs):
        if batched(job.fmt, options):
            by_format.setdefault(job.fmt, []).append(k)
    for fmt, at in by_format.items():
        reader = BUILTIN[fmt]
        lines = _lines_of(reader)
        if lines is None:
            _records_together(reader, [(k, jobs[k]) for k in at], out, options, needs, lean, largest)
            continue
        files: list[tuple[int, _File]] = []
        tags: list[str] | None = [] if isinstance(reader, OneMetric) else None
        for k in at:
            if tags is not None:
                named = reader.named(jobs[k].path)
                if named.skipped or named.problems or named.run is not None:
                    continue  # (read() says what its place says, or names the rows' run)
            got = _block(jobs[k], largest, lean)
            if isinstance(got, ReadResult):
                out[k] = got
            elif got is not None:
                files.append((k, got))
                if tags is not None:
                    tags.append(named.tag)
        if not files:
            continue
        try:
            _parse_together(lines, files, options, out, needs, lean, tags)
        except Exception:  # noqa: BLE001 - each file is then read on its own, where read() names the one at fault
            for k, _ in files:
                out[k] = None
    return out


def _parse_together(
    reader: LineFormat, files: list[tuple[int, _File]], options: ReadOptions, out: list[ReadResult | None], needs: Needs | None, lean: bool,
    tags_of: list[str] | None = None,
) -> None:
    """Fills `out` for the files whose rows the one parse gives exactly; with `tags_of`, each
    file's rows take its tag (a reader of one metric a file)."""
    together = reader.together
    assert together is not None
    counts = [f.lines for _, f in files]
    starts = np.cumsum([0, *counts])
    # Cut as one block: the files' lines, numbered on across them (a row's line says its file).
    lines, _ = split_lines(b"".join(f.data for _, f in files), 0, source="")
    if lines.height != starts[-1]:
        return
    lines = lines.with_columns(pl.Series("file", np.repeat(np.arange(len(files)), counts), dtype=pl.Int64()))
    kept = lines
    if reader.prefilter:
        kept = kept.filter(pl.col("text").str.contains(reader.prefilter))
    marks = together.marks(kept).with_columns(kept.get_column("line_no"), kept.get_column("file"))
    alone = set(marks.filter(pl.col("alone")).get_column("file").unique().to_list())
    fine = [i not in alone for i in range(len(files))]
    if not any(fine):
        return
    # What else the marks hold goes to the parse with the lines (Together.marks: marked once for both).
    lines_in = kept.select("line_no", "text").with_columns(marks.select(pl.exclude("line_no", "file", *MARKS)))
    if alone:
        lines_in = lines_in.filter(~kept.get_column("file").is_in(list(alone)))
    keep = needs.keeper(options.aliases) if needs is not None else None
    rows, state = reader.parse(lines_in, Cursor(), None, keep=keep) if reader.narrows and keep is not None else reader.parse(lines_in, Cursor(), None)
    line_no = rows.get_column("line_no").to_numpy() if "line_no" in rows.columns else None
    if line_no is None or (line_no.size > 1 and not bool((line_no[1:] >= line_no[:-1]).all())):
        return
    refusing = _refusing(reader, lines_in, rows, starts)
    rows = rows.drop("line_no")
    bounds = np.searchsorted(line_no, starts)
    if tags_of is not None:
        owner = pl.Series(np.repeat(np.arange(len(files)), np.diff(bounds)), dtype=pl.Int64())
        rows = table.conform_raw(rows.with_columns(pl.Series("tag", tags_of, dtype=pl.String()).gather(owner)))
    tags = rows.get_column("tag").cast(pl.String).unique().to_list()
    finished = table.finish(rows, run="", source="", metric_of=options.aliases.mapping(tags), lean=lean)
    if not lean:
        # Each row's run and source, from the file its line came from (one gather for all files).
        owner = pl.Series(np.repeat(np.arange(len(files)), np.diff(bounds)), dtype=pl.Int64())
        finished = finished.with_columns(
            pl.Series("run", [f.job.run for _, f in files], dtype=pl.String()).gather(owner),
            pl.Series("source", [decodable(str(f.job.path)) for _, f in files], dtype=pl.String()).gather(owner),
        )
    steps = rows.get_column("step").fill_null(0).to_numpy()
    nulls = rows.get_column("step").is_null().to_numpy()
    kept_bounds = bounds
    if keep is not None:
        # The projection, after the steps of every row were taken: they are each file's span.
        wanted = [t for t in tags if keep(t)]
        if len(wanted) < len(tags):
            mask = rows.get_column("tag").cast(pl.String).is_in(wanted).to_numpy()
            finished = finished.filter(pl.Series(mask))
            kept_bounds = np.searchsorted(line_no[mask], starts)
    record, last_steps = _marked(marks, lines.height)
    for i, (k, f) in enumerate(files):
        if not fine[i]:
            continue
        lo, hi = int(bounds[i]), int(bounds[i + 1])
        if i in refusing or nulls[lo:hi].any() or (together.repeats and f.job.cursor.steps != REPEATS and repeats(steps[lo:hi], f.job.cursor.last_step)):
            continue  # a step that is no whole number, or a repeated one not yet said: read() says it
        mine = line_no[lo:hi]
        records = int(np.unique(mine if record is None else mine[record[mine]]).size)
        if last_steps is not None:
            last = last_steps.get(i, f.job.cursor.last_step)
        else:
            last = int(steps[hi - 1]) if hi > lo else f.job.cursor.last_step
        settled = together.settles(f.job.cursor, state, hi > lo) if together.settles is not None else {}
        if settled is None:
            continue
        cursor = f.job.cursor.advance(
            index=f.job.cursor.index + records, last_step=last, offset=f.end.offset, line=f.end.line, skipping=f.end.skipping, **settled
        )
        span = (int(steps[lo:hi].min()), int(steps[lo:hi].max())) if hi > lo else None
        klo, khi = int(kept_bounds[i]), int(kept_bounds[i + 1])
        out[k] = ReadResult(finished.slice(klo, khi - klo), cursor, span=span)


def _refusing(reader: LineFormat, lines: pl.DataFrame, rows: pl.DataFrame, starts: np.ndarray) -> set[int]:
    """The files of a batch with a line their format refuses (LineFormat.refused): each is read on
    its own, whose read says so."""
    if reader.refused is None:
        return set()
    return {int(np.searchsorted(starts, n, side="right")) - 1 for n, _ in reader.refused(lines, rows)}


def _records_together(reader, jobs: list[tuple[int, Job]], out: list[ReadResult | None], options: ReadOptions, needs: Needs | None, lean: bool, largest: int) -> None:  # noqa: ANN001 - (a format with read_together)
    """Fills `out` for the files of a records format its `read_together` read: their raw rows
    finished as one table (each row's run as read() names it: table.run_of),
    then sliced file by file. Complete files (a scan's) are read alone."""
    todo = [(k, job) for k, job in jobs if not job.final]
    if not todo:
        return
    keep = needs.keeper(options.aliases) if needs is not None else None
    try:
        rows, found = reader.read_together([(job.path, job.cursor, job.limit) for _, job in todo], keep=keep, largest=largest)
    except Exception:  # noqa: BLE001 - each file is then read on its own, where read() names the one at fault
        return
    read = [(k, job, f) for (k, job), f in zip(todo, found) if f is not None]
    owner = pl.Series(np.repeat(np.arange(len(read)), [f[2] for _, _, f in read]), dtype=pl.Int64())
    runs = [table.run_of(job.run, f[0].name or "") for _, job, f in read]
    rows = rows.with_columns(pl.Series("run", runs, dtype=pl.String()).gather(owner))
    tags = rows.get_column("tag").unique().to_list()
    finished = table.finish(rows, run=".", source="", metric_of=options.aliases.mapping(tags), lean=lean)
    if not lean:
        finished = finished.with_columns(pl.Series("source", [decodable(str(job.path)) for _, job, _ in read], dtype=pl.String()).gather(owner))
    at = 0
    for k, _, (cursor, span, count) in read:
        out[k] = ReadResult(finished.slice(at, count), cursor, span=span, named=True)
        at += count


def _marked(marks: pl.DataFrame, lines: int) -> tuple[np.ndarray | None, dict[int, int] | None]:
    """What Together.marks said beyond `alone`: per line of the batch, whether its rows count as a
    record (None: every line with rows does), and per file the step its cursor is left at (None:
    its last row's)."""
    record = None
    if "record" in marks.columns:
        record = np.zeros(lines, dtype=bool)
        record[marks.filter(pl.col("record")).get_column("line_no").to_numpy()] = True
    last_steps: dict[int, int] | None = None
    if "last_step" in marks.columns:
        stepped = marks.filter(pl.col("last_step").is_not_null()).group_by("file").agg(pl.col("last_step").last())
        last_steps = dict(zip(stepped.get_column("file").to_list(), stepped.get_column("last_step").to_list()))
    return record, last_steps


MARKS = ("alone", "record", "last_step")
"""The columns of Together.marks that readmany reads; any other is the parser's own."""


def _block(job: Job, largest: int, lean: bool) -> _File | ReadResult | None:
    """The file's new lines, if they are one clean block; a result when there is nothing new."""
    problems: list[Problem] = []
    try:
        blocks = list(iter_blocks(job.path, job.cursor, final=job.final, problems=problems, limit=job.limit))
    except OSError:
        return None  # read() names the problem
    if problems or len(blocks) > 1:
        return None
    if not blocks:
        return ReadResult(table.empty(lean=lean), job.cursor)
    block = blocks[0]
    if len(block.data) >= largest or b"\x00" in block.data:
        return None
    try:
        text = block.data.decode("utf-8")
    except UnicodeDecodeError:
        return None
    if text.startswith("\ufeff") or not text:
        return None  # a byte-order mark is dropped only at a block's start
    # Binary damage (BINARY_LINE): read() skips those lines and says so.
    newlines = block.data.count(b"\n")
    if not only_newlines(block.data, newlines) and (_BINARY.search(text) or "\x1b" in text):
        return None  # (and colours, which the read of the file alone strips: base.ANSI)
    if block.data.endswith(b"\n"):
        return _File(job, block.data, newlines, block.cursor)
    return _File(job, block.data + b"\n", newlines + 1, block.cursor)  # a complete file's last line


_BINARY = re.compile(BINARY_LINE)
