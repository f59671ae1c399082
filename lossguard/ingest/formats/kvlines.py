"""Step lines of `name value` pairs, as nanoGPT, build-nanogpt, llm.c and modded-nanogpt print them
(fairseq's look alike, but its validation lines need a reader of their own: fairseq.py):

    iter 100: loss 4.2345, time 12.3ms
    step    10 | loss: 9.44 | lr 9.2e-06 | norm: 3.56 | dt: 412.1ms
    step:1/20344 train_loss:22.62 train_time:123ms
    step:  10  loss:  8.1234  memory: 30.12GiB(31.72%)  tps: 1,234  mfu: 12.3%        (torchtitan)
    [Rank 0] step=10, skipped=0, lr=[9.9e-05, 9.9e-05], mom=[(0.9, 0.95)]          (DeepSpeed)
    epoch:        1 | nupdates:         1000 | lr: 0.100000 | ... | loss:   42.51234 | dev-clean-loss: ...
                                                                       (flashlight / wav2letter)

A line is a record only if it names its step: banners, config dumps and `validation loss: 3.2`
lines without a step are noise here, and taking them would put numbers on made-up steps.
The step keys are `step`, `iter`, `iteration`, `it`, `update`, `nupdates`, `num_updates`,
`global_step`; `epoch` is the step only in a file that has shown none of those (wav2letter before
it printed `nupdates`), and a warning says so: the first finer key seen makes `epoch` a plain value
again, and lines with nothing finer are then not records.
Numbers may carry thousands separators (`1,234`); a bracketed list counts as its first element
(DeepSpeed prints one learning rate per parameter group); `file.py:96` in a log prefix is where the
line was printed, and `[Rank 0]` who printed it: neither is a metric (nor glog's `I0312 10:01:12.3 Train.cpp:580]`). DeepSpeed's `OVERFLOW! ... reducing to Y` lines, printed during the
step after the last one logged, become `OVERFLOW loss scale` values at that step, as in Megatron logs.
"""

from __future__ import annotations

import re

import polars as pl

from .. import table
from ..cursor import Cursor
from .base import Format, LineFormat, Together
from .dictlines import METRIC_ITEM
from .fastpath import fast_pairs
from .megatron import overflow_rows
from .pairs import NUMBER, pairs_frame, records_to_rows

GROUPED = r"\d{1,3}(?:,\d{3})+(?:\.\d+)?\b"
# A name is one word, or two (`train loss`, `val loss`): the qualifier decides which curve it is.
KEY_SEPARATOR = r"\s*[:=]\s*|\s+"
"""What stands between a name and its number (then maybe a `[`)."""
PAIR = (
    r"(?:^|[\s|,;\[(])(?P<key>(?:[A-Za-z_][\w./-]* )?[A-Za-z_][\w./-]*)(?:" + KEY_SEPARATOR + r")\[?(?P<value>"
    + GROUPED + "|" + NUMBER + ")"
)
STEP_KEYS = ("step", "iter", "iteration", "num_updates", "global_step", "_step", "steps", "it", "nupdates", "update")
EPOCH = "epoch"
PREFILTER = r"(?i)\b(?:step|iter|iteration|num_updates|global_step|it|nupdates|update|epoch)\b|OVERFLOW!"


def _pipe_separated(lines: pl.DataFrame) -> bool:
    head = lines.get_column("text").head(200).drop_nulls()
    return head.len() > 0 and float((head.str.count_matches("|", literal=True) >= 2).mean()) >= 0.9


def parse(lines: pl.DataFrame, cursor: Cursor, raw: bytes | None = None) -> tuple[pl.DataFrame, Cursor]:
    overflow = lines.filter(pl.col("text").str.contains("OVERFLOW!", literal=True))
    if overflow.height:
        lines = lines.filter(~pl.col("text").str.contains("OVERFLOW!", literal=True))
    fast, rest = fast_pairs(lines, sep="|", cell_re=PAIR, separator=KEY_SEPARATOR) if _pipe_separated(lines) else (None, lines)
    pairs = pairs_frame(rest, PAIR, thousands=True)
    if fast is not None and fast.height:
        pairs = pl.concat([fast, pairs]).sort("line_no", maintain_order=True)
    # `at step 20`, `global step 20`: a step key keeps its meaning whatever word stands before it.
    # (Decided once per distinct key: there are a handful, and millions of pairs.)
    keys = pairs.get_column("key").unique().to_list()
    renamed = {k: k.split()[-1] for k in keys if " " in k and k.split()[-1].lower() in (*STEP_KEYS, EPOCH)}
    if renamed:
        pairs = pairs.with_columns(pl.col("key").replace(renamed))
    located = [k for k in keys if _PRINTED_BY.match(k)]
    if located:
        pairs = pairs.filter(~pl.col("key").is_in(located))
    step_keys, steps = _step_keys([renamed.get(k, k) for k in keys], cursor)
    rows, state = records_to_rows(pairs, cursor, step_keys=step_keys, require_step=True)
    state = state.advance(steps=steps)
    if overflow.height:
        steps = rows.select("line_no", "step").unique("line_no", keep="last", maintain_order=True)
        rows = pl.concat([rows, overflow_rows(overflow, steps, cursor)], how="diagonal_relaxed").sort("line_no", maintain_order=True)
    return table.conform_raw(rows), state


# Who printed a line and where, not a metric: `file.py:96`, glog's `I0312 10:01:12.3 123 Train.cpp:580]`
# (its severity and date, then the source file), `[Rank 0]`.
_PRINTED_BY = re.compile(r"(?i)^(?:[\w./-]+\.(?:py|c|cc|cpp|cxx|cu|h|hpp)|rank)$|^[IWEF]\d{4}$")


def _step_keys(keys: list[str], cursor: Cursor) -> tuple[tuple[str, ...], str | None]:
    """The keys naming a line's step in this block, and what the cursor keeps of the choice:
    `fine` once a finer key than the epoch was seen, `epoch` while the epoch is all there is."""
    if cursor.steps == "fine" or any(k.lower() in STEP_KEYS for k in keys):
        return STEP_KEYS, "fine"
    if any(k.lower() == EPOCH for k in keys):
        return (EPOCH,), "epoch"
    return STEP_KEYS, cursor.steps


def _settles(before: Cursor, batch: Cursor, rows: bool) -> dict[str, object] | None:
    """A file read with others (readmany) reads as alone when both read its `step` keys as steps: the
    batch did (some file had such a key), and so does the file alone, having shown one before
    (its cursor says so) or now (it got rows, which only a step key gives then)."""
    if batch.steps != "fine" or not (rows or before.steps == "fine"):
        return None
    return {"steps": "fine"}


KV_LINES = LineFormat(
    "kv_lines", parse, prefilter=PREFILTER,
    # A line's rows are its own (a record names its step), but for DeepSpeed's OVERFLOW lines, which
    # take the step of the record before them: a file holding one is read alone.
    together=Together(lambda lines: lines.select(pl.col("text").str.contains("OVERFLOW!", literal=True).alias("alone")), settles=_settles),
)

# `epoch` only with an explicit separator (`epoch: 1`, `epoch=1`): fairseq's `epoch 001 |` is fairseq's.
_STEP = re.compile(
    r"(?i)(?:^|[\s|,;\[(])(?:(?:step|iter|iteration|num_updates|global_step|nupdates|update)(?:\s*[:=]\s*|\s+)|epoch\s*[:=]\s*)\d"
)
_LOSS = re.compile(r"(?i)(?:^|[\s|,;\[(])[\w./-]*loss[\w./-]*(?:\s*[:=]\s*|\s+)[-+\d.nNiI]")


def _kv_line(line: str) -> bool:
    """A step and a loss, as `name value` pairs. A quoted metric name makes the line a dict's, which
    this reader would not read anyway (a name here is bare)."""
    return bool(_STEP.search(line) and _LOSS.search(line)) and not METRIC_ITEM.search(line)


FORMAT = Format(reader=KV_LINES, line=_kv_line)
