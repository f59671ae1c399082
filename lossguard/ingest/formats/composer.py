"""MosaicML Composer's console log (llm-foundry's stdout): a progress header, then one metric a line.

    [batch=120/4800]:
    	 Train loss/train/total: 2.3456
    	 Train lr-DecoupledAdamW/group0: 0.0006
    	 Train l2_norm/grad_global: 0.8123
    [epoch=2][batch=16/100]:
    	 Train loss/train/total: 2.1000
    [Eval batch=10/10] Eval on eval data:
    	 Eval metrics/eval/LanguageCrossEntropy: 2.4000

The header names the step: `[batch=N/T]` (or another unit: token, sample, iteration), or within an
epoch `[epoch=E][batch=b/T]`, which is step (E - 1) x T + b. Train lines belong to the header above
them; evaluation runs at a training step, so Eval lines belong to the last train header. A block of
lines may start in the middle of a record: the cursor's last step is the header before it.
Composer prints floats with four decimals, so a learning rate under 5e-5 reads as 0.0000: that is
what the log holds.

Its FileLogger (composer/loggers/file_logger.py: log_metrics) writes a metric a line, each naming
its step (the batch count), among the lines of stdout and stderr it captures (`[stdout]: ...`, which
hold the console's lines again: not read twice):

    [metric][batch=120]: loss/train/total: 2.3456 
"""

from __future__ import annotations

import re

import polars as pl

from .. import table
from ..cursor import Cursor
from .base import Format, LineFormat
from .pairs import NUMBER

HEADER = r"^(?:\[epoch=(?P<epoch>\d+)\])?\[(?:batch|iteration|token|sample)=(?P<n>\d+)(?:/(?P<total>\d+))?\]:?\s*$"
DATA = r"^\t (?P<phase>Train|Eval) (?P<key>[^:\n]+?): (?P<value>" + NUMBER + r")\s*$"
FILE_METRIC = r"^\[metric\]\[batch=(?P<step>\d+)\]: (?P<key>[^\n]+?): (?P<value>" + NUMBER + r") ?$"
PREFILTER = r"^(?:\[epoch=\d+\])?\[(?:batch|iteration|token|sample)=\d+|^\t (?:Train|Eval) |^\[metric\]\[batch=\d"


def parse(lines: pl.DataFrame, cursor: Cursor, raw: bytes | None = None) -> tuple[pl.DataFrame, Cursor]:
    head = pl.col("text").str.extract_groups(HEADER)
    data = pl.col("text").str.extract_groups(DATA)
    # A FileLogger line is a header and its data at once.
    filed = pl.col("text").str.extract_groups(FILE_METRIC)
    marked = lines.select(
        "line_no",
        head.struct.field("epoch").cast(pl.Int64).alias("epoch"),
        head.struct.field("n").cast(pl.Int64).alias("n"),
        head.struct.field("total").cast(pl.Int64).alias("total"),
        filed.struct.field("step").cast(pl.Int64, strict=False).alias("filed"),
        pl.coalesce(data.struct.field("key"), filed.struct.field("key")).alias("key"),
        pl.coalesce(data.struct.field("value"), filed.struct.field("value")).cast(pl.Float64, strict=False).alias("value"),
    ).with_columns(
        pl.when(pl.col("epoch").is_not_null() & pl.col("total").is_not_null())
        .then((pl.col("epoch") - 1) * pl.col("total") + pl.col("n"))
        .otherwise(pl.coalesce("n", "filed"))
        .alias("header_step")
    )
    marked = marked.with_columns(
        pl.col("header_step").forward_fill().fill_null(pl.lit(cursor.last_step, dtype=pl.Int64)).alias("step")
    )
    rows = marked.filter(pl.col("key").is_not_null() & pl.col("value").is_not_null() & pl.col("step").is_not_null()).select(
        "step", pl.col("key").alias("tag"), "value", pl.lit(None, dtype=pl.Float64).alias("wall_time"), "line_no"
    )
    headers = marked.get_column("header_step").drop_nulls()
    last_step = int(headers[-1]) if headers.len() else cursor.last_step
    return table.conform_raw(rows), cursor.advance(last_step=last_step)


COMPOSER = LineFormat("composer", parse, prefilter=PREFILTER)
_METRIC_LINE = re.compile(DATA + "|" + FILE_METRIC.replace("?P<", "?P<f_"))


# Sniffed by its metric lines: a header alone (`[batch=1/200]:`) could be any progress print.
FORMAT = Format(reader=COMPOSER, line=_METRIC_LINE.match)
