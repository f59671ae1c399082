"""The new lines of many JSON-lines logs parsed in one call: what a daemon pass over hundreds of busy
runs reads (a few lines from each file). `reader.read` costs ~4 ms a file whatever it reads (a
dozen polars queries), which held a pass over 300 runs to over a second; here the queries run
once over all the files' lines.

Only where the answer cannot differ from reading each file alone: a JSON line's rows depend on the
lines before it (and on the file's cursor) only when it carries no step of its own, so a file is
taken into the batch only if every line it brings names a step key (STEP_ITEM), its bytes are one
clean block (UTF-8, no binary damage, no over-long line) and its rows all have a usable step. Any
other file is left for `reader.read` (the result says which), and so is everything when the parser
does not give back the line each row came from. Each file's cursor goes on as the parser moves it
(its records counted, its last step kept). tests/test_many_runs.py pins all of it to `read`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl

from . import table
from .cursor import Cursor
from .formats.base import BINARY_LINE, SMALL_BLOCK, lines_of
from .formats.dictlines import STEP_ITEM
from .needs import Needs
from .problems import Problem
from .reader import BUILTIN, ReadOptions, ReadResult
from .sources.textfile import iter_blocks

FORMAT = "jsonl"
PROBE = '{"step": true, "lossguard batch probe": 0}'
"""A last line whose step holds no number: its row has no step, which makes the parser keep the
`line_no` column (it drops it when every row has a step), the only way to split the rows by file."""


@dataclass(frozen=True)
class Job:
    path: Path
    cursor: Cursor
    run: str
    limit: int | None = None


@dataclass
class _File:
    job: Job
    lines: list[str]
    end: Cursor
    """Where reading goes on after the block."""


def read_many(jobs: Sequence[Job], *, options: ReadOptions, needs: Needs | None = None) -> list[ReadResult | None]:
    """For each job, what `read(path, cursor, run=run, fmt="jsonl", final=False, options=options,
    limit=limit, needs=needs)` returns, or None where the file must be read on its own."""
    out: list[ReadResult | None] = [None] * len(jobs)
    if options.reader(FORMAT) is not BUILTIN[FORMAT]:
        return out  # a user's format of the same name
    files: list[tuple[int, _File]] = []
    for k, job in enumerate(jobs):
        got = _block(job)
        if got is None:
            continue
        if isinstance(got, ReadResult):
            out[k] = got
        else:
            files.append((k, got))
    if not files:
        return out
    try:
        _parse_together(files, options, out, needs)
    except Exception:  # noqa: BLE001 - each file is then read on its own, where read() names the one at fault
        for k, _ in files:
            out[k] = None
    return out


def _parse_together(files: list[tuple[int, _File]], options: ReadOptions, out: list[ReadResult | None], needs: Needs | None) -> None:
    """Fills `out` for the files whose rows the one parse gives exactly."""
    texts = [text for _, f in files for text in f.lines]
    starts = np.cumsum([0] + [len(f.lines) for _, f in files])
    lines = pl.DataFrame({"line_no": pl.Series(np.arange(len(texts) + 1), dtype=pl.Int64()), "text": pl.Series([*texts, PROBE], dtype=pl.String())})
    checks = lines.select(
        pl.col("text").str.contains(BINARY_LINE).alias("binary"),
        pl.col("text").str.contains(BUILTIN[FORMAT].prefilter).alias("kept"),
        pl.col("text").str.contains(STEP_ITEM).alias("stepped"),
    )
    binary, kept, stepped = (checks.get_column(c).to_numpy()[:-1] for c in ("binary", "kept", "stepped"))
    fine = [not binary[lo:hi].any() and bool(stepped[lo:hi][kept[lo:hi]].all()) for lo, hi in zip(starts[:-1], starts[1:])]
    if not any(fine):
        return
    use = np.repeat(np.array(fine), np.diff(starts))
    lines = lines.filter(pl.Series(np.r_[use & kept, True]))
    rows, _ = BUILTIN[FORMAT].parse(lines, Cursor(), None)
    if "line_no" not in rows.columns:
        return
    line_no = rows.get_column("line_no").to_numpy()
    if line_no.size > 1 and not bool((line_no[1:] >= line_no[:-1]).all()):
        return
    rows = rows.drop("line_no")
    tags = rows.get_column("tag").cast(pl.String).unique().to_list()
    bounds = np.searchsorted(line_no, starts)
    # Each row's run and source, from the file its line came from (one gather for all files).
    owner = pl.Series(np.repeat(np.arange(len(files)), np.diff(bounds)), dtype=pl.Int64())
    finished = table.finish(rows.head(bounds[-1]), run="", source="", metric_of=options.aliases.mapping(tags)).with_columns(
        pl.Series("run", [f.job.run for _, f in files], dtype=pl.String()).gather(owner),
        pl.Series("source", [str(f.job.path) for _, f in files], dtype=pl.String()).gather(owner),
    )
    steps = rows.get_column("step").fill_null(0).to_numpy()
    nulls = rows.get_column("step").is_null().to_numpy()
    kept_bounds = bounds
    if needs is not None:
        # The projection, after the steps of every row were taken: they are each file's span.
        keep = needs.keeper(options.aliases)
        wanted = [t for t in tags if keep(t)]
        if len(wanted) < len(tags):
            mask = rows.get_column("tag").cast(pl.String).is_in(wanted).to_numpy()[: bounds[-1]]
            finished = finished.filter(pl.Series(mask))
            kept_bounds = np.searchsorted(line_no[: bounds[-1]][mask], starts)
    for i, (k, f) in enumerate(files):
        if not fine[i]:
            continue
        lo, hi = int(bounds[i]), int(bounds[i + 1])
        if nulls[lo:hi].any():
            continue  # a step that is no whole number: read() says so, naming the line
        records = int(np.unique(line_no[lo:hi]).size)
        last = int(steps[hi - 1]) if hi > lo else f.job.cursor.last_step
        cursor = f.job.cursor.advance(
            index=f.job.cursor.index + records, last_step=last, offset=f.end.offset, line=f.end.line, skipping=f.end.skipping
        )
        span = (int(steps[lo:hi].min()), int(steps[lo:hi].max())) if hi > lo else None
        klo, khi = int(kept_bounds[i]), int(kept_bounds[i + 1])
        out[k] = ReadResult(finished.slice(klo, khi - klo), cursor, span=span)


def _block(job: Job) -> _File | ReadResult | None:
    """The file's new lines, if they are one clean block; a result when there is nothing new."""
    problems: list[Problem] = []
    try:
        blocks = list(iter_blocks(job.path, job.cursor, final=False, problems=problems, limit=job.limit))
    except OSError:
        return None  # read() names the problem
    if problems or len(blocks) > 1:
        return None
    if not blocks:
        return ReadResult(table.empty(), job.cursor)
    block = blocks[0]
    if len(block.data) >= SMALL_BLOCK or b"\x00" in block.data:
        return None
    try:
        text = block.data.decode("utf-8")
    except UnicodeDecodeError:
        return None
    if text.startswith("\ufeff") or not text:
        return None
    return _File(job, lines_of(text), block.cursor)
