"""fairseq's text logs (`--log-format simple`, and tqdm's end-of-epoch lines), legacy (`| ` before
`epoch`, printed) or through `logging` (`<time> | INFO | train_inner | ` before it):

    | epoch 001:   1000 / 331737 loss=6.872, nll_loss=5.125, ppl=34.9, ..., num_updates=1000, lr=0.0005, gnorm=2.751, loss_scale=64.000
    | epoch 001 | loss 6.4 | nll_loss 5.1 | ppl 34.9 | num_updates 2100 | lr 0.0005 | gnorm 2.75 | ...
    | epoch 001 | valid on 'valid' subset | loss 5.9 | nll_loss 4.2 | ppl 18.4 | num_updates 2100 | best_loss 5.9
    | epoch 001 | valid on 'valid' subset | valid_loss 5.91 | valid_nll_loss 4.21 | valid_ppl 18.45 | num_updates 3000 | best 5.91

fairseq-py's first release (2017: fairseq/progress_bar.py simple_progress_bar, train.py) printed
its progress lines without the colon, the loss with its running average after it, and no update
count; its summaries name their values in two words:

    | epoch 001  1000 / 331737 loss=9.57 (10.94), wps=12345, wpb=4096, bsz=128, lr=0.25, clip=100%, gnorm=1.2345
    | epoch 001 | valid on 'valid' subset | valid loss 7.20 | valid ppl 147.03

The first is a progress line, every `--log-interval` batches; the second the epoch's summary (its
values are averages over the epoch); the third a validation summary. A validation value is tagged
with its subset as fairseq's own JSON log tags it (`valid_loss`, `valid_nll_loss`; fairseq <= 0.6
named them so itself, the last line above, and is not prefixed twice), so the same run
read from either log gives the same curves, and `valid_loss` is the eval loss, never the train loss.
Validation progress lines (some versions print them mid-validation) are running averages over part
of the subset, which its summary line then gives whole: they are not read.

The step is `num_updates`, the optimizer's update count, which every fairseq version prints. A
progress line without it (a trainer of fairseq's lineage that drops it) is put at
(epoch - 1) x total + N from its `N / total` batch counter, which restarts every epoch: a count of
batches, not updates (they differ under --update-freq), and monotonic because fairseq fixes an
epoch's batches once and only reshuffles them, so every epoch has the same total (were it to change,
steps would overlap or leave a gap at that epoch's start). A summary line without `num_updates` is
put at the step of the line before it (it closes what that line was part of); a line with no step
anywhere before it is not read, rather than put at a made-up step.
"""

from __future__ import annotations

import re

import polars as pl

from .. import table
from ..cursor import Cursor
from .base import Format, LineFormat
from .pairs import NUMBER, pairs_frame, records_to_rows

# `epoch {:03d}`, then a validation subset, then `:  N / total k=v, ...` or ` | k v | ...`.
HEADER = (
    r"(?:^|[\s|])epoch (?P<epoch>\d{3,})(?: \| valid on '(?P<subset>[^'\n]*)' subset)?"
    r"(?::?\s+(?P<n>\d+) / (?P<total>\d+) | \| )(?P<tail>.*)$"
)
# fairseq-py's first validation summary names its values `valid loss`, `valid ppl`: the subset says so.
PAIR = r"(?:^|[,|]\s*)(?:valid )?(?P<key>[A-Za-z_][\w./-]*)(?:=| )(?P<value>" + NUMBER + ")"
PREFILTER = r"epoch \d{3,}"
STEP_KEY = "num_updates"


def parse(lines: pl.DataFrame, cursor: Cursor, raw: bytes | None = None) -> tuple[pl.DataFrame, Cursor]:
    head = lines.select("line_no", pl.col("text").str.extract_groups(HEADER).alias("h")).unnest("h")
    # fairseq's lines, less the running averages printed mid-validation.
    head = head.filter(pl.col("tail").is_not_null() & ~(pl.col("subset").is_not_null() & pl.col("n").is_not_null()))
    pairs = pairs_frame(head.select("line_no", pl.col("tail").alias("text")), PAIR)
    # A validation value carries its subset, as fairseq's JSON log writes it. fairseq <= 0.6 named
    # them `valid_loss` itself whatever the subset: that prefix is replaced, not doubled.
    pairs = pairs.join(head.select("line_no", "subset"), on="line_no", how="left", maintain_order="left").select(
        "line_no",
        pl.when(pl.col("subset").is_not_null() & (pl.col("key") != STEP_KEY))
        .then(pl.col("subset") + "_" + pl.col("key").cast(pl.String()).str.strip_prefix("valid_"))
        .otherwise(pl.col("key").cast(pl.String()))
        .cast(pl.Categorical())
        .alias("key"),
        "value",
    )
    rows, state = records_to_rows(pairs, cursor, step_keys=(STEP_KEY,), line_steps=_line_steps(head, pairs, cursor), require_step=True)
    return table.conform_raw(rows), state


def _line_steps(head: pl.DataFrame, pairs: pl.DataFrame, cursor: Cursor) -> pl.DataFrame:
    """line_no -> step for every fairseq line: its num_updates, else its batch count over the run,
    else the step of the line before it (see the module's docstring)."""
    updates = (
        pairs.filter(pl.col("key") == STEP_KEY)
        .group_by("line_no", maintain_order=True)
        .agg(pl.col("value").first().cast(pl.Int64, strict=False).alias("updates"))
    )
    counted = (pl.col("epoch").cast(pl.Int64) - 1) * pl.col("total").cast(pl.Int64) + pl.col("n").cast(pl.Int64)
    return (
        head.select("line_no", counted.alias("counted"))
        .join(updates, on="line_no", how="left", maintain_order="left")
        .select(
            "line_no",
            pl.coalesce("updates", "counted").forward_fill().fill_null(pl.lit(cursor.last_step, dtype=pl.Int64)).alias("step"),
        )
    )


FAIRSEQ = LineFormat("fairseq", parse, prefilter=PREFILTER)

_HEADER = re.compile(HEADER)
_LOSS = re.compile(r"(?:^|[,|]\s*)loss[= ]")


def _fairseq_line(line: str) -> bool:
    """A progress line with a loss, or a summary line with a loss and num_updates: an `epoch 001 |`
    alone could be anyone's zero-padded epoch."""
    if "epoch " not in line:
        return False  # what nearly every other line fails on, some 30x cheaper than the regex
    m = _HEADER.search(line)
    if m is None or not _LOSS.search(m["tail"]):
        return False
    return m["n"] is not None or STEP_KEY in m["tail"]


FORMAT = Format(reader=FAIRSEQ, line=_fairseq_line)
