"""Key/value pairs pulled out of lines with one vectorised regex, then laid out as long rows.

Shared by every line format that writes `name <sep> number` pairs (JSON lines, HF console dicts,
nanoGPT/fairseq/llm.c key-value lines, Megatron): only the pair regex, the step keys and a few
format-specific lines differ, so the hot path (regex over all lines in Rust) is written once.
"""

from __future__ import annotations

from collections.abc import Sequence

import polars as pl

from .. import table
from ..cursor import Cursor

NUMBER = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|[-+]?(?i:nan|inf(?:inity)?)\b"


def pairs_frame(lines: pl.DataFrame, pair_re: str, *, thousands: bool = False) -> pl.DataFrame:
    """(line_no, key, value) for every pair in every line, in line order. `pair_re` has the named
    groups `key` and `value`; `thousands`: the value may hold separators (`1,234`).
    One lazy query rather than ten eager steps: the daemon calls this for every few hundred new
    lines, where polars' cost per call is what counts."""
    if not lines.height:
        return EMPTY_PAIRS
    value = pl.col("g").struct.field("value").str.strip_chars()
    if thousands:
        value = value.str.replace_all(",", "", literal=True)
    return (
        lines.lazy()
        .select("line_no", pl.col("text").str.extract_all(pair_re).alias("pair"))
        .filter(pl.col("pair").list.len() > 0)
        .explode("pair")
        .select("line_no", pl.col("pair").str.extract_groups(pair_re).alias("g"))
        .select(
            "line_no",
            pl.col("g").struct.field("key").str.strip_chars().cast(pl.Categorical()).alias("key"),
            value.cast(pl.Float64, strict=False).alias("value"),
        )
        .filter(pl.col("value").is_not_null())
        .collect()
    )


EMPTY_PAIRS = pl.DataFrame(schema={"line_no": pl.Int64(), "key": pl.Categorical(), "value": pl.Float64()})


def merged(fast: pl.DataFrame, slow: pl.DataFrame) -> pl.DataFrame:
    """The pairs of a fast path and those of the regex path (its leftover lines) as one frame, in
    line order. Only one of them, in the usual case, is already in order (and says so: polars then
    groups and joins on line_no without hashing)."""
    if not slow.height:
        return fast.with_columns(pl.col("line_no").set_sorted())
    if not fast.height:
        return slow
    return pl.concat([fast, slow]).sort("line_no", maintain_order=True)


STEP_LIMIT = 2.0**63
"""Steps are Int64: a step key's value at or past this is no step (nor is a negative one)."""


def usable_step(value: pl.Expr) -> pl.Expr:
    """A step key's number as a step: a whole number from 0 to 2^63 - 1, else null (1e400, -5, NaN)."""
    return pl.when(value.is_finite() & (value >= 0) & (value < STEP_LIMIT)).then(value.cast(pl.Int64, strict=False))


def records_to_rows(
    pairs: pl.DataFrame,
    cursor: Cursor,
    *,
    step_keys: Sequence[str] = (),
    line_steps: pl.DataFrame | None = None,
    drop_record_keys: Sequence[str] = (),
    require_step: bool = False,
    unreadable_steps: pl.Series | None = None,
    unnumbered: pl.Series | None = None,
) -> tuple[pl.DataFrame, Cursor]:
    """Lay pairs out as raw rows (plus the `line_no` each came from), one record per line.

    A record's step is, in order: its own step key (or `line_steps`, a frame line_no -> step from a
    format-specific regex); the last step seen before it; else its ordinal number, counting on from
    `cursor.index`, for formats that carry no step at all (HF console dicts). Records holding any of
    `drop_record_keys` are summaries, not points of the curve, and are dropped whole.

    A record whose step key holds no usable step (usable_step; `unreadable_steps`: lines whose step
    key holds no number at all, `"step": true`) keeps its rows with a null step: taking the step
    before it would put its values at a step they do not belong to. The reader drops them and says so.

    Records in `unnumbered` (line numbers) are never numbered: with no step of their own and none
    before them, they are not read (fairseq's validation lines belong to the update they ran at).
    """
    # Keys compared on the few distinct names, not on every row (tens of millions in a big log).
    names = [k for k in pairs.get_column("key").unique().to_list() if k is not None]
    pairs = _without_records(pairs, [k for k in names if k.lower() in drop_record_keys])
    step_names = [k for k in names if k.lower() in step_keys]
    is_step = pl.col("key").is_in(step_names) if step_names else pl.lit(False)
    # One plan, collected once on the in-memory engine (the daemon runs this for every few hundred
    # new lines, where each separate query costs more than its work; eager steps run there too).
    lazy = pairs.lazy()
    steps = _record_steps(lazy.filter(is_step), line_steps=line_steps, unreadable_steps=unreadable_steps)
    metrics = lazy.filter(~is_step)
    records = metrics.select("line_no").unique(maintain_order=True).join(steps, on="line_no", how="left", maintain_order="left")
    records = _placed(records, cursor, require_step=require_step, unnumbered=unnumbered)
    # Joins keep the pairs' order (line, then position in the line) only when asked to.
    rows = metrics.join(records.select("line_no", pl.col("filled").alias("step")), on="line_no", how="inner", maintain_order="left").select(
        "step", pl.col("key").alias("tag"), "value", pl.lit(None, dtype=pl.Float64).alias("wall_time"), "line_no"
    )
    summary = records.select(pl.len().alias("n"), pl.col("step").drop_nulls().last().alias("last_step"))
    rows, summary = pl.collect_all([rows, summary], engine="in-memory")
    n, own_last = summary.row(0)
    if n == 0:
        return table.empty_raw().with_columns(pl.lit(None, dtype=pl.Int64).alias("line_no")), cursor
    return rows, cursor.advance(index=cursor.index + n, last_step=own_last if own_last is not None else cursor.last_step)


def _without_records(pairs: pl.DataFrame, drop: list[str]) -> pl.DataFrame:
    """The pairs less every record (line) holding any of the keys `drop` (a summary, not a point)."""
    if not drop:
        return pairs
    bad = pairs.filter(pl.col("key").is_in(drop)).get_column("line_no").unique()
    return pairs.filter(~pl.col("line_no").is_in(bad.implode()))


def _record_steps(keyed: pl.LazyFrame, *, line_steps: pl.DataFrame | None, unreadable_steps: pl.Series | None) -> pl.LazyFrame:
    """(line_no, step, keyed) of every record with a step of its own: its step key's (`keyed`: its
    pairs of step keys), else its line's (`line_steps`); null where the key holds no step."""
    steps = (
        keyed.group_by("line_no", maintain_order=True)
        .agg(pl.col("value").first())
        .select("line_no", usable_step(pl.col("value")).alias("step"), pl.lit(True).alias("keyed"))
    )
    if line_steps is not None:
        # A format's own line steps are null where it chose to read no step (fairseq's lines before the
        # first one that has any): not a step key gone wrong.
        own = line_steps.lazy().select("line_no", pl.col("step").cast(pl.Int64), pl.col("step").is_not_null().alias("keyed"))
        steps = pl.concat([own, steps]).unique(
            "line_no", keep="first", maintain_order=True
        )
    if unreadable_steps is not None and unreadable_steps.len():
        unreadable = pl.LazyFrame({"line_no": unreadable_steps.cast(pl.Int64)}).select("line_no", pl.lit(None, dtype=pl.Int64).alias("step"), pl.lit(True).alias("keyed"))
        steps = pl.concat([steps, unreadable]).unique("line_no", keep="first", maintain_order=True)
    return steps


def _placed(records: pl.LazyFrame, cursor: Cursor, *, require_step: bool, unnumbered: pl.Series | None) -> pl.LazyFrame:
    """The records (line_no, step, keyed) with the step each is placed at (`filled`): its own, the
    last one before it, the cursor's, or its number; null where its step key holds no step."""
    # A step key that is there but holds no step: the record is unplaceable, whatever came before.
    bad = pl.col("keyed").fill_null(False) & pl.col("step").is_null()
    if require_step:
        records = records.filter(pl.col("step").is_not_null() | bad)
    numbered = pl.int_range(0, pl.len(), dtype=pl.Int64) + (cursor.index + 1)
    if unnumbered is not None and unnumbered.len():
        numbered = pl.when(pl.col("line_no").is_in(unnumbered.cast(pl.Int64).implode())).then(None).otherwise(numbered)
    records = records.with_columns(
        pl.when(bad).then(None).otherwise(
            pl.coalesce(
                pl.col("step"),
                pl.col("step").forward_fill(),
                pl.lit(cursor.last_step, dtype=pl.Int64),
                numbered,
            )
        ).alias("filled")
    )
    if unnumbered is not None and unnumbered.len():
        records = records.filter(pl.col("filled").is_not_null() | bad)
    return records
