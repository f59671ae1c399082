"""Megatron-LM / Megatron-DeepSpeed console lines, with or without a launcher prefix (`[default7]:`):

    iteration     3200/  100000 | ... | learning rate: 1.5E-04 | lm loss: 2.2E+00 | loss scale: 4096.0 |
    grad norm: 0.95 | number of skipped iterations: 0 | number of nan iterations: 0 |
    validation loss at iteration 1000 | lm loss value: 3.2E+00 | lm loss PPL: 2.4E+01 |
    [deepscale] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 1048576, reducing to 524288

OVERFLOW lines are printed while the next iteration runs, before its line: they are put at the step
after the last iteration line seen, and carry the new (halved) scale as a loss_scale value.
"""

from __future__ import annotations

import re

import polars as pl

from .. import table
from ..cursor import Cursor
from .base import Format, Keep, LineFormat, Together
from .fastpath import Wide, fast_wide, long_rows
from .pairs import NUMBER, merged, pairs_frame, records_to_rows

PAIR = r"\|\s*(?P<key>[A-Za-z][^|:]*?)\s*:\s*(?P<value>" + NUMBER + ")"
CELL = r"(?P<key>[A-Za-z][^|:]*?)\s*:\s*(?P<value>" + NUMBER + ")"
ITERATION = r"\biteration\s+(\d+)\s*/\s*\d+"
VALIDATION = r"validation loss at iteration\s+(\d+)"
OVERFLOW = r"OVERFLOW!.*?Attempted loss scale:\s*(" + NUMBER + r"),\s*reducing to\s*(" + NUMBER + ")"
USUAL_ITERATION = r"^ ?iteration +([0-9]+)/ *[0-9]"
"""ITERATION as a line that starts with it (after one space at most) reads: its match is the line's
first, and ASCII digits and spaces are among what `\\d` and `\\s` take."""
PREFILTER = r"iteration\s+\d+\s*/|OVERFLOW!|validation loss at iteration"


def overflow_rows(lines: pl.DataFrame, steps: pl.DataFrame, cursor: Cursor) -> pl.DataFrame:
    """Raw rows for the OVERFLOW lines among `lines`: each at one past the step of the last step line
    before it (`steps`: line_no -> step, sorted by line_no; else the cursor's last step), valued at
    the reduced scale. Shared by every format whose logs DeepSpeed's loss scaler writes into."""
    scaled = lines.select("line_no", pl.col("text").str.extract(OVERFLOW, 2).cast(pl.Float64, strict=False).alias("value"))
    before = scaled.drop_nulls("value").join_asof(
        steps.select("line_no", pl.col("step").cast(pl.Int64)), on="line_no", strategy="backward", allow_exact_matches=False
    )
    return before.select(
        (pl.col("step").fill_null(pl.lit(cursor.last_step, dtype=pl.Int64)).fill_null(0) + 1).alias("step"),
        pl.lit("OVERFLOW loss scale", dtype=pl.Categorical()).alias("tag"),
        "value",
        "line_no",
    )


def iteration_steps(lines: pl.DataFrame) -> pl.Series:
    """The step ITERATION's capture reads, or null where this read can not tell (then the regex
    decides): a line whose first `iteration` starts it or follows a space, with only ASCII before,
    spaces and digits after it up to the line's first `/`, then spaces and a digit. Found with
    literal searches and short slices, each a column computed once: a capture regex over every
    line cost a quarter of a parse. (`find` counts bytes and `slice` characters: the ASCII prefix
    makes them agree up to the word.)"""
    text, word = pl.col("text"), len("iteration")
    at, slash = pl.col("at"), pl.col("slash")
    head, digits, number, after = pl.col("head"), pl.col("digits"), pl.col("number"), pl.col("after")
    fits = (
        (slash > at + word)
        & (head.str.len_bytes() == at + word)
        & head.str.ends_with("iteration")
        & ((at == 0) | head.str.ends_with(" iteration"))
        & digits.str.starts_with(" ")
        & ~number.str.starts_with("+")
        & ~number.str.starts_with("-")
        & after.is_in(list("0123456789"))
    )
    # A line that starts with the word (most logs' lines) is read by one regex anchored at its start,
    # which stops at the `/`; only the others take the literal searches and slices.
    quick = text.str.extract(USUAL_ITERATION, 1).cast(pl.Int64, strict=False)
    return (
        lines.lazy()
        .select(quick.alias("quick"), text)
        .select("quick", pl.when(pl.col("quick").is_null()).then(text).alias("text"))
        .select("quick", text, text.str.find("iteration", literal=True).alias("at"), text.str.find("/", literal=True).alias("slash"))
        .select(
            "quick",
            "at",
            "slash",
            text.str.slice(0, at + word).alias("head"),
            text.str.slice(at + word, slash - at - word).alias("digits"),
            text.str.slice(slash + 1, 32).str.strip_chars_start(" ").str.slice(0, 1).alias("after"),
        )
        .with_columns(digits.str.strip_chars(" ").alias("number"))
        .select(pl.coalesce("quick", pl.when(fits).then(number.cast(pl.Int64, strict=False))).alias("it"))
        .collect()
        .to_series()
    )


def _marked(lines: pl.DataFrame) -> pl.DataFrame:
    """The lines with what each is: `it`, its iteration step (ITERATION's capture), `val`, the
    validation's step of a line that is no iteration line, and `overflow`, whether it holds the word
    (as they come when a batch's marks found them already: _together)."""
    if {"it", "val", "overflow"} <= set(lines.columns):
        return lines
    text = pl.col("text")
    marked = lines.with_columns(
        iteration_steps(lines),
        # The OVERFLOW regex only runs on lines holding its word (most logs hold none).
        text.str.contains("OVERFLOW!", literal=True).alias("overflow"),
    )
    # The regexes decide the lines the quick read could not (an iteration line's step is never null
    # there, and a validation line counts only when it is no iteration line).
    odd = marked.get_column("it").is_null()
    regexed = marked.filter(odd).select(
        text.str.extract(ITERATION, 1).cast(pl.Int64, strict=False).alias("it"),
        text.str.extract(VALIDATION, 1).cast(pl.Int64, strict=False).alias("val"),
    )
    where = odd.arg_true()
    marked = marked.with_columns(
        marked.get_column("it").scatter(where, regexed.get_column("it")),
        pl.repeat(None, marked.height, dtype=pl.Int64, eager=True).alias("val").scatter(where, regexed.get_column("val")),
    )
    return marked


def _together(lines: pl.DataFrame) -> pl.DataFrame:
    """How a batch of many files' lines may be parsed in one call (base.Together.marks): iteration
    and validation lines carry their steps; an OVERFLOW line takes the step after the iteration line
    before it, which must then be in its own file (not the cursor's, nor the previous file's).
    Iteration lines are the records and leave the cursor at their step."""
    marked = _marked(lines.select("line_no", "text", "file"))
    stepped = pl.col("it").is_not_null().cast(pl.UInt32)
    return marked.select(
        (pl.col("overflow") & ((stepped.cum_sum() - stepped).over("file") == 0)).alias("alone"),
        pl.col("it").is_not_null().alias("record"),
        pl.col("it").alias("last_step"),
        "it", "val", "overflow",  # the parse's own marks (_marked), found once
    )


def _iteration_rows(wide: Wide, steps: pl.Series, cursor: Cursor) -> tuple[pl.DataFrame, Cursor] | None:
    """The raw rows of iteration lines that all took the fast path (`wide`, a row per line, at
    `steps`), straight from the wide pairs: what records_to_rows makes of them (each line with a
    pair a record at its own step, its pairs in line order), without laying the pairs out long and
    joining them back to their steps. None when no line holds a pair."""
    values = wide.values
    n = int(values.select(pl.any_horizontal(pl.all().is_not_null()).sum()).item()) if wide.keys else 0
    if not n:
        return None
    return long_rows(steps.to_numpy(), wide.keys, values, wide.line_no), cursor.advance(index=cursor.index + n)


def parse(lines: pl.DataFrame, cursor: Cursor, raw: bytes | None = None, *, keep: Keep | None = None) -> tuple[pl.DataFrame, Cursor]:
    marked = _marked(lines)
    iterations = marked.filter(pl.col("it").is_not_null())
    wide, rest = fast_wide(iterations.select("line_no", "text"), sep="|", cell_re=CELL, first_field_free=True, one_pair_per_field=True, keep=keep)
    line_steps = iterations.select("line_no", pl.col("it").alias("step"))
    short = None if rest.height else _iteration_rows(wide, iterations.get_column("it"), cursor)
    if short is not None:
        rows, state = short
    else:
        rows, state = records_to_rows(merged(wide.pairs(), pairs_frame(rest, PAIR)), cursor, line_steps=line_steps, require_step=True)
    extra = []
    validations = marked.filter(pl.col("val").is_not_null() & pl.col("it").is_null())
    if validations.height:
        extra.append(
            pairs_frame(validations, PAIR)
            .join(validations.select("line_no", "val"), on="line_no")
            .select(
                pl.col("val").alias("step"),
                (pl.lit("validation ") + pl.col("key").cast(pl.String())).cast(pl.Categorical()).alias("tag"),
                "value",
                "line_no",
            )
        )
    overflows = marked.filter(pl.col("overflow"))
    if overflows.height:
        extra.append(overflow_rows(overflows, line_steps, cursor))
    if any(frame.height for frame in extra):
        rows = pl.concat([rows, *extra], how="diagonal_relaxed").sort("line_no", maintain_order=True)
    last = iterations.get_column("it")
    return table.conform_raw(rows), state.advance(last_step=last[-1] if last.len() else cursor.last_step)


MEGATRON = LineFormat("megatron", parse, prefilter=PREFILTER, narrows=True, together=Together(_together))

_ITERATION_ANY_CASE = re.compile(ITERATION, re.IGNORECASE)
_LOSS_ANY_CASE = re.compile("loss", re.IGNORECASE)


def _megatron_line(line: str) -> bool:
    """`ITERATION.*\\|.*loss`, case-blind, without the regex's backtracking (3.5 us a line, most of
    sniffing a Megatron log; now ~0.5 us): after the first iteration match, its first bar, then `loss`. A later
    iteration match could only start after the first one's end, and after its shortest end only
    digits could differ, so the first match and the first bar after it decide."""
    # A line without the word is most of what sniffing shows this test (any log's lines come to it
    # before JSON lines' and key-value lines' own tests), and the case-blind regex takes 2-3 us to
    # fail on one: "terat" holds no letter case-blind matching folds oddly (i and s do).
    if "terat" not in line.lower():
        return False
    found = _ITERATION_ANY_CASE.search(line)
    if found is None:
        return False
    bar = line.find("|", found.end())
    # The literal first: a case-blind regex scans a long line ten times slower.
    return bar >= 0 and (line.find("loss", bar + 1) >= 0 or _LOSS_ANY_CASE.search(line, bar + 1) is not None)


FORMAT = Format(reader=MEGATRON, line=_megatron_line)
