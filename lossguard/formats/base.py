"""What every format reader shares: the result type and the driver for line-oriented formats.

A reader never raises for bad content: it returns the rows it could read, a cursor just past the
complete data it consumed, and Problems naming the file and line. `dead` marks a file that can not be
read further without guessing (a corrupt record length), so callers stop reopening it in a loop.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl

from .. import table
from ..cursor import Cursor
from ..problems import Problem
from ..sources.textfile import iter_blocks


@dataclass(frozen=True)
class Parsed:
    rows: pl.DataFrame
    """Raw rows (step, tag, value, wall_time), in file order."""
    cursor: Cursor
    problems: tuple[Problem, ...] = ()
    dead: bool = False


@dataclass(frozen=True)
class LineFormat:
    """A format whose records are lines. `parse` turns a frame of lines (columns `line_no`, `text`) and
    the cursor into raw rows plus the cursor fields it changed (index, last_step)."""

    name: str
    parse: Callable[[pl.DataFrame, Cursor], tuple[pl.DataFrame, Cursor]]
    prefilter: str | None = None
    """A regex a line must match to be worth parsing; cuts the regex work on noisy logs."""
    extra: dict[str, object] = field(default_factory=dict)

    def read(self, path: Path, cursor: Cursor, *, final: bool) -> Parsed:
        problems: list[Problem] = []
        frames: list[pl.DataFrame] = []
        for block in iter_blocks(path, cursor, final=final, problems=problems):
            lines = split_lines(block.text, block.first_line, self.prefilter)
            rows, state = self.parse(lines, cursor)
            if rows.height:
                frames.append(rows)
            cursor = block.cursor.advance(index=state.index, last_step=state.last_step, header=state.header)
        rows = pl.concat(frames) if frames else table.empty_raw()
        return Parsed(rows, cursor, tuple(problems))


def split_lines(text: str, first_line: int, prefilter: str | None) -> pl.DataFrame:
    """A block of text as a frame (line_no, text), without the newline and any carriage returns."""
    if not text:
        return pl.DataFrame(schema={"line_no": pl.Int64(), "text": pl.String()})
    lines = (
        pl.DataFrame({"text": [text]})
        .select(pl.col("text").str.strip_suffix("\n").str.split("\n"))
        .explode("text")
        .with_row_index("line_no", offset=first_line)
        .with_columns(pl.col("line_no").cast(pl.Int64()))
    )
    if prefilter is not None:
        lines = lines.filter(pl.col("text").str.contains(prefilter))
    return lines
