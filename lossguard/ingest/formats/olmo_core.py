"""OLMo-core's console log: a progress marker naming the step, then the step's metrics, one an
indented line, all one log record (olmo_core/train/callbacks/console_logger.py:
ConsoleLoggerCallback.log_metrics), behind the prefix of OLMo-core's plain handler or of its rich one
(olmo_core/utils.py: setup_logging, _RichHandler):

    2025-01-01 10:00:10.123	host:0	olmo_core.train.callbacks.console_logger:76	INFO	[step=10/5000,epoch=0,eta=1h2m3s]
        train/CE loss=9.812
        optim/LR (group 0)=2.00E-05
        optim/total grad norm=1.234
        throughput/total tokens=41,943,040

A step between metric steps prints its marker alone (post_step). An evaluation prints its metrics
the same way under `Finished <evaluator> evals in 12.3 seconds. Metrics:`
(train/callbacks/evaluator_callback.py: perform_eval), names without the `eval/<evaluator>/` the
trainer records them under: they are tagged so here (`eval/lm/c4_en-validation/CE loss`, never the
training's `CE loss`), at the step of the marker before them.

A metric line belongs to the marker (or the evaluation's header) right above it: a line of any
other log record between them closes the block, and what is indented after it is not a metric.
Numbers are as format_float (olmo_core/utils.py) writes them: `54,512`, `2.00E-05`, `nan`, `-inf`,
and from 1e9 on with a suffix (`4.194B`, T, P, E: 1e9 to 1e18).
"""

from __future__ import annotations

import re

import polars as pl

from .. import table
from ..cursor import Cursor
from .base import Format, LineFormat

MARKER = r"\[step=(?P<step>\d+)/(?:\d+|\?\?\?),epoch=\d+(?:,eta=[^\]\n]*)?\]\s*$"
EVALUATED = r"Finished (?P<evaluator>.+?) evals in \d+(?:\.\d+)? seconds\. Metrics:\s*$"
METRIC = r"^    (?P<key>[^\s=][^=\n]*?)=(?P<text>\S[^\n]*?)\s*$"
"""A metric line, whatever its value: one that is no number still goes on with its block."""
NUMBER = r"^(?P<number>[-+]?[\d,]*\.?\d+(?:[eE][-+]?\d+)?|nan|-?inf)(?P<suffix>[BTPE]?)$"
SUFFIXES = {"B": 1e9, "T": 1e12, "P": 1e15, "E": 1e18}
CLOSED = "\x00"
"""The block state of a line that closes a block (no tag prefix is a NUL)."""


def parse(lines: pl.DataFrame, cursor: Cursor, raw: bytes | None = None) -> tuple[pl.DataFrame, Cursor]:
    text = pl.col("text")
    marker = text.str.extract_groups(MARKER)
    evaluated = text.str.extract_groups(EVALUATED)
    metric = text.str.extract_groups(METRIC)
    marked = lines.select(
        "line_no",
        marker.struct.field("step").cast(pl.Int64, strict=False).alias("marker"),
        evaluated.struct.field("evaluator").alias("evaluator"),
        metric.struct.field("key").alias("key"),
        _number(metric.struct.field("text")).alias("value"),
    )
    # What each line says of the block it is in: a marker opens a training step's (no tag prefix),
    # an evaluation header an evaluation's, a metric line goes on with the one above it, any other
    # line closes it. Forward-filled, from the block the cursor left open.
    opened = (
        pl.when(pl.col("marker").is_not_null()).then(pl.lit(""))
        .when(pl.col("evaluator").is_not_null()).then(pl.lit("eval/") + pl.col("evaluator") + "/")
        .when(pl.col("key").is_not_null()).then(None)
        .otherwise(pl.lit(CLOSED))
    )
    marked = marked.with_columns(
        opened.forward_fill().fill_null(pl.lit(cursor.block if cursor.block is not None else CLOSED)).alias("block"),
        pl.col("marker").forward_fill().fill_null(pl.lit(cursor.last_step, dtype=pl.Int64)).alias("step"),
    )
    rows = marked.filter(
        pl.col("key").is_not_null() & pl.col("value").is_not_null() & pl.col("step").is_not_null() & (pl.col("block") != CLOSED)
    ).select("step", (pl.col("block") + pl.col("key")).alias("tag"), "value", pl.lit(None, dtype=pl.Float64).alias("wall_time"), "line_no")
    if not marked.height:
        return table.conform_raw(rows), cursor
    block, step = marked.select(pl.col("block").last(), pl.col("step").last()).row(0)
    return table.conform_raw(rows), cursor.advance(last_step=step, block=None if block == CLOSED else block)


def _number(text: pl.Expr) -> pl.Expr:
    """format_float's text as the number it stands for (null if it is none)."""
    parts = text.str.extract_groups(NUMBER)
    value = parts.struct.field("number").str.replace_all(",", "", literal=True).cast(pl.Float64, strict=False)
    return value * parts.struct.field("suffix").replace_strict(SUFFIXES, default=1.0, return_dtype=pl.Float64)


OLMO_CORE = LineFormat("olmo_core", parse)
"""No prefilter: the lines that are none of its own close a block, so every line counts."""
# Sniffed by its markers: the metric lines alone could be any indented `name=value`.
FORMAT = Format(reader=OLMO_CORE, line=re.compile(MARKER).search)
