"""User-defined line formats: a regex with named groups, declared in lossguard.toml, for logs no
built-in reader knows. The group `step` (optional) is the step; every other named group is a
metric tag. The same regex runs in polars (Rust regex) over all lines at once.

    [[formats]]
    name = "mytrainer"
    files = "*.train.log"          # optional: only files whose name matches
    pattern = 'it=(?P<step>\\d+) obj=(?P<loss>\\S+) eta=(?P<lr>\\S+)'
"""

from __future__ import annotations

import re
import warnings
from dataclasses import dataclass, field

import polars as pl

from .. import table
from ..cursor import Cursor
from .base import LineFormat
from .pairs import records_to_rows
from ...validate import spec


@dataclass(frozen=True, kw_only=True)
class LineFormatSpec:
    name: str = field(metadata=spec(str, min_length=1))
    pattern: str = field(metadata=spec(str))
    files: str | None = field(default=None, metadata=spec(str, optional=True))

    def _check(self) -> str | None:
        # Two engines run the pattern: Python's re when sniffing a file's head, polars' (Rust's regex
        # crate) over its lines. Each refuses what the other takes (look-around and backreferences
        # only Python has), so a pattern is checked with both: one only Python read would make every
        # file it claims unreadable.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # re's FutureWarnings: stderr stays one line per error
            try:
                compiled = re.compile(self.pattern)
            except re.error as exc:
                return f"pattern: not a valid regular expression: {exc}"
        if reason := _refused_by_polars(self.pattern):
            return f"pattern: the regex engine that reads the logs (polars, Rust's regex) refuses it: {reason}"
        if not set(compiled.groupindex) - {"step"}:
            return "pattern: needs at least one named group besides `step`, e.g. (?P<loss>[0-9.eE+-]+)"
        return None

    def line_format(self) -> LineFormat:
        groups = [g for g in re.compile(self.pattern).groupindex if g != "step"]
        has_step = "step" in re.compile(self.pattern).groupindex
        pattern = self.pattern

        def parse(lines: pl.DataFrame, cursor: Cursor, raw: bytes | None = None) -> tuple[pl.DataFrame, Cursor]:
            found = lines.select("line_no", pl.col("text").str.extract_groups(pattern).alias("g")).unnest("g")
            found = found.filter(pl.any_horizontal(pl.col(g).is_not_null() for g in groups))
            pairs = found.unpivot(index="line_no", on=groups + (["step"] if has_step else []), variable_name="key", value_name="value")
            pairs = pairs.sort("line_no", maintain_order=True).with_columns(
                pl.col("value").str.strip_chars().cast(pl.Float64, strict=False)
            ).filter(pl.col("value").is_not_null())
            rows, state = records_to_rows(pairs, cursor, step_keys=("step",) if has_step else ())
            return table.conform_raw(rows), state

        return LineFormat(self.name, parse, prefilter=None)


def _refused_by_polars(pattern: str) -> str | None:
    """Why polars cannot compile `pattern` (its message's own `error:` line), or None."""
    try:
        pl.Series([""], dtype=pl.String()).str.extract_groups(pattern)
    except pl.exceptions.PolarsError as exc:
        lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
        reasons = [line.removeprefix("error: ") for line in lines if line.startswith("error:")]
        return reasons[-1] if reasons else (lines[-1] if lines else type(exc).__name__)
    return None
