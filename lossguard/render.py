"""Writing the canonical table for people (aligned text, names made printable) and programs (CSV,
JSON lines: names exact)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TextIO

import polars as pl

from . import table
from .escaping import printable
from .model import json_number

BLOCKWISE = ("csv", "json")
"""Output formats written a block at a time (BlockWriter): `lossguard read` streams them."""


SLICE = 200_000
"""Rows turned into text at a time."""


class BlockWriter:
    """CSV or JSON lines of the canonical table, written a block at a time as the blocks are read,
    byte for byte what writing the whole table at once writes (the CSV header once, at the top)."""

    def __init__(self, fmt: str, out: TextIO, *, metrics: Sequence[str] | None = None) -> None:
        self.fmt = fmt
        self.out = out
        self.metrics = list(metrics) if metrics else None
        self.rows = 0
        """Rows read (before the metric filter)."""
        self._header = fmt == "csv"

    def write(self, frame: pl.DataFrame) -> None:
        if not frame.height:
            return
        self.rows += frame.height
        if self.metrics is not None:
            frame = frame.filter(pl.col("metric").is_in(self.metrics) | pl.col("tag").is_in(self.metrics))
        # Bytes straight to the binary stream under `out` when it has one (polars writes them itself:
        # no text of the block is built in Python), in slices either way (the text of a whole block, a
        # few million rows, would be several times its table).
        binary = getattr(self.out, "buffer", None)
        if binary is not None:
            self.out.flush()
        for start in range(0, frame.height, SLICE):
            part = frame.slice(start, SLICE)
            if self.fmt == "json":
                part = part.select(json_line_expr(part).alias("line"))
            csv = {"include_header": self._header, "float_precision": None} if self.fmt == "csv" else {"include_header": False, "quote_style": "never"}
            if binary is not None:
                part.write_csv(binary, **csv)
            else:
                self.out.write(part.write_csv(**csv))
            self._header = False

    def close(self) -> None:
        """The header of a table with no rows, if no block wrote one."""
        if self._header:
            self.out.write(pl.DataFrame(schema=table.SCHEMA).write_csv())
            self._header = False


def json_line_expr(frame: pl.DataFrame) -> pl.Expr:
    """Each row as `json.dumps(row)` writes it, NaN and infinities as json_number's strings, built
    column-wise: a Python dict per row made JSON output 6x slower than the read. Names are encoded by
    json.dumps itself (the few distinct ones); numbers as Python's repr, which polars' shortest
    float form matches except below 1e-4, where Python switches to an exponent (those few by repr)."""
    parts: list[pl.Expr] = []
    for i, (name, dtype) in enumerate(frame.schema.items()):
        parts.append(pl.lit(("{" if i == 0 else ", ") + json.dumps(name) + ": "))
        col = pl.col(name)
        if dtype == pl.String or dtype == pl.Categorical:
            names = frame.get_column(name).cast(pl.String).unique().drop_nulls().to_list()
            parts.append(col.cast(pl.String).replace_strict(names, [json.dumps(n) for n in names], default=None).fill_null("null"))
        elif dtype.is_float():
            parts.append(_json_float(frame.get_column(name)))
        else:
            parts.append(col.cast(pl.String).fill_null("null"))
    parts.append(pl.lit("}"))
    return pl.concat_str(parts)


def _json_float(column: pl.Series) -> pl.Series:
    text = column.cast(pl.String)
    small = (column.abs() < 1e-4) & (column != 0)
    if small.any():
        text = text.scatter(small.arg_true(), [repr(v) for v in column.filter(small).to_list()])
    nonfinite = ~column.is_finite()
    if nonfinite.any():
        text = text.scatter(nonfinite.arg_true(), [json.dumps(json_number(v)) for v in column.filter(nonfinite).to_list()])
    return text.fill_null("null")


def write_mapping(frame: pl.DataFrame, out: TextIO) -> None:
    """Which tag each run's canonical metrics are read from, one line a run: the first thing to check
    when a cause looks wrong is whether the grad norm was found at all."""
    from .engine import tags_used

    for (run,), rows in frame.partition_by("run", as_dict=True, maintain_order=True).items():
        used = tags_used(rows)
        said = ", ".join(f"{metric} <- {printable(tag)}" for metric, tag in used.items()) or "none recognised"
        out.write(f"metrics ({printable(run)}): {said}\n")
    out.write("\n")


def write_table(frame: pl.DataFrame, fmt: str, out: TextIO) -> None:
    if fmt in BLOCKWISE:
        writer = BlockWriter(fmt, out)
        writer.write(frame)
        writer.close()
    else:
        cols = frame.columns
        rows = [[("" if v is None else (repr(v) if isinstance(v, float) else printable(str(v)))) for v in r] for r in frame.iter_rows()]
        widths = [max([len(c)] + [len(r[i]) for r in rows]) for i, c in enumerate(cols)]
        out.write("  ".join(c.ljust(w) for c, w in zip(cols, widths)).rstrip() + "\n")
        for r in rows:
            out.write("  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip() + "\n")
