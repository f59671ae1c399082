"""Lines of a step, a split and a number, as karpathy/build-nanogpt's train_gpt2.py writes its
`log/log.txt` (and the scripts that copy it):

    0 val 10.9502
    0 hella 0.2500
    0 train 10.955029
    1 train 10.284193

(`f"{step} train {loss_accum.item():.6f}\\n"` every step, `f"{step} val {val_loss_accum.item():.4f}\\n"`
and `f"{step} hella {acc_norm:.4f}\\n"` every 250 steps.) `train` and `val` are the losses on those
splits (`train/loss`, `val/loss`: the loss and the eval loss); another word names its own series
(`hella`: the HellaSwag accuracy). A file is this format's by its `train` and `val` lines.
"""

from __future__ import annotations

import re

import polars as pl

from .. import table
from ..cursor import Cursor
from .base import Format, LineFormat
from .pairs import NUMBER, usable_step

LINE = r"^(?P<step>\d+) (?P<split>[A-Za-z_][\w-]*) (?P<value>" + NUMBER + r")\s*$"
LOSSES = {"train": "train/loss", "val": "val/loss"}


def parse(lines: pl.DataFrame, cursor: Cursor, raw: bytes | None = None) -> tuple[pl.DataFrame, Cursor]:
    found = lines.select("line_no", pl.col("text").str.extract_groups(LINE).alias("g")).unnest("g").filter(pl.col("split").is_not_null())
    rows = found.select(
        usable_step(pl.col("step").cast(pl.Float64, strict=False)).alias("step"),
        pl.col("split").replace(LOSSES).alias("tag"),
        pl.col("value").cast(pl.Float64, strict=False),
        pl.lit(None, dtype=pl.Float64).alias("wall_time"),
        "line_no",
    )
    if not rows.height:
        return table.conform_raw(rows), cursor
    last = rows.get_column("step").drop_nulls()
    return table.conform_raw(rows), cursor.advance(index=cursor.index + rows.height, last_step=int(last[-1]) if last.len() else cursor.last_step)


STEP_SPLIT = LineFormat("step_split", parse, prefilter=r"^\d+ [A-Za-z_]")
_LOSS_LINE = re.compile(r"^\d+ (?:train|val) (?:" + NUMBER + r")\s*$")
# Sniffed by its loss lines: `3 apples 0.5` could be anything's.
FORMAT = Format(reader=STEP_SPLIT, line=_LOSS_LINE.match)
