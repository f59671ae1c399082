"""Writing the canonical table for people (aligned text, names made printable) and programs (CSV,
JSON lines: names exact)."""

from __future__ import annotations

import json
from typing import TextIO

import polars as pl

from .escaping import printable
from .model import json_number


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
    if fmt == "csv":
        out.write(frame.write_csv(float_precision=None))
    elif fmt == "json":
        for row in frame.iter_rows(named=True):
            row["value"] = json_number(row["value"])
            row["wall_time"] = json_number(row["wall_time"])
            out.write(json.dumps(row) + "\n")
    else:
        cols = frame.columns
        rows = [[("" if v is None else (repr(v) if isinstance(v, float) else printable(str(v)))) for v in r] for r in frame.iter_rows()]
        widths = [max([len(c)] + [len(r[i]) for r in rows]) for i, c in enumerate(cols)]
        out.write("  ".join(c.ljust(w) for c, w in zip(cols, widths)).rstrip() + "\n")
        for r in rows:
            out.write("  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip() + "\n")
