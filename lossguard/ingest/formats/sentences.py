"""Metrics written as sentences rather than as `name value` pairs, as BigDL's DistriOptimizer logs
each iteration (bigdl/optim/DistriOptimizer.scala: `${header} Trained ${n} records in ${t} seconds.
Throughput is ${r} records/second. Loss is ${loss}. ${getHyperParameterLog(...)}`):

    [Epoch 1 1280/60000][Iteration 10][Wall Clock 5.000s] Trained 128 records in 0.5 seconds. Throughput is 256.0 records/second. Loss is 2.2900. Current learning rate is 0.01.

The pair regex (kvlines.PAIR) reads a name as the one or two words before a number, which in prose
are the words around it: `Loss is`, `rate is`, `Trained`, `records in`. Three rules set that right,
on the pairs of both the regex and the fast path (so they stay one result):

1. `X is 2.3` (`was`, `are`, `were`): the name is X, every word of it back to the sentence's start
   (the line's, or after `. `, `]`, `,`, `;`, `|`, `(` or a number), up to six words: `Current learning rate`.
2. A number followed by a unit word (`128 records`, `0.5 seconds`, `256.0 records/second`) counts
   that unit: it is no value of the word before it when only a space stands between them
   (`Trained 128`). With a `:`, `=` or a verb of being between them it is (`time: 12 ms`,
   `Throughput is 256.0 records/second`). A unit word followed by a number of its own is a name.
3. A name ending in a word no metric ends with (`in`, `of`, `per`, `is`...) is no name: the number
   is read by rule 1 or not at all.
"""

from __future__ import annotations

import polars as pl

from .pairs import NUMBER

BEING = r"(?:is|was|are|were)"
WORD = r"[A-Za-z_][\w./@-]*"
SAID_WORD = r"[A-Za-z_](?:[\w./@-]*[\w/@-])?"
"""A word of a sentence's name: a `.` may stand inside it, not at its end (that ends a sentence)."""
SAID = (
    r"(?:^|[.!?]\s|\]\s*|[,;|(]\s*|\d\s+)(?P<key>" + SAID_WORD + r"(?: " + SAID_WORD + r"){0,5}) " + BEING + r"\s+\[?(?P<value>" + NUMBER + ")"
)
"""A value said in a sentence: `Loss is 2.29`, `Current learning rate is 0.01`."""
SAID_HINT = r"\s" + BEING + r"\s+\[?[-+.\d]"
_TIME = r"(?:s|sec|secs|second|seconds|ms|min|mins|minute|minutes|h|hr|hour|hours|step|iter|it|batch)"
UNITS = (
    r"(?:records|samples|examples|tokens|images|imgs|sequences|sentences|words|batches|items|instances"
    r"|seconds|second|secs|sec|ms|milliseconds|minutes|mins|hours|bytes|KB|MB|GB|KiB|MiB|GiB"
    r"|[A-Za-z]+/" + _TIME + r")\b"
)
COUNTED = (
    r"(?:^|[\s|,;\[(])(?P<key>(?:" + WORD + r" )?" + WORD + r")\s+(?P<value>" + NUMBER + r")\s+" + UNITS
    + r"(?P<named>\s*[:=]?\s*[-+]?\.?\d)?"
)
"""`Trained 128 records`: a number counting its unit, not a value of the word before it; a unit word
followed by a number (`2.3 samples 1280`) is that number's name instead (`named`)."""
COUNTED_HINT = r"\d\s+" + UNITS
NO_NAME_END = {"in", "of", "for", "at", "to", "by", "per", "on", "from", "with", "after", "over", "into", "and", "or", "the", "a", "an", "is", "was", "are", "were"}
"""Words no metric's name ends with: a number after them is not that name's value."""


def worded(lines: pl.DataFrame, pairs: pl.DataFrame) -> pl.DataFrame:
    """`pairs` (line_no, key, value) with the three rules of the module's docstring applied. Only
    lines holding a verb of being before a number, or a unit word after one, are searched again."""
    keys = [k for k in pairs.get_column("key").unique().to_list() if k is not None]
    unnamed = [k for k in keys if k.split()[-1].lower() in NO_NAME_END]
    if unnamed:
        pairs = pairs.filter(~pl.col("key").is_in(unnamed))
    text = pl.col("text")
    counted = _found(lines.filter(text.str.contains(COUNTED_HINT)), COUNTED, extra=("named",))
    if counted.height:
        counted = counted.filter(pl.col("named").is_null()).drop("named")
        counted = counted.with_columns(pl.col("key").cast(pl.String))
        pairs = (
            pairs.with_columns(pl.col("key").cast(pl.String))
            .join(counted, on=["line_no", "key", "value"], how="anti", maintain_order="left", nulls_equal=True)
            .with_columns(pl.col("key").cast(pl.Categorical()))
        )
    said = _found(lines.filter(text.str.contains(SAID_HINT)), SAID)
    if said.height:
        pairs = pl.concat([pairs, said]).sort("line_no", maintain_order=True)
    return pairs


def _found(lines: pl.DataFrame, pattern: str, *, extra: tuple[str, ...] = ()) -> pl.DataFrame:
    """(line_no, key, value, *extra) of every match of `pattern` in `lines`."""
    schema = {"line_no": pl.Int64(), "key": pl.Categorical(), "value": pl.Float64(), **{e: pl.String() for e in extra}}
    if not lines.height:
        return pl.DataFrame(schema=schema)
    g = pl.col("g").struct
    return (
        lines.lazy()
        .select("line_no", pl.col("text").str.extract_all(pattern).alias("m"))
        .explode("m")
        .filter(pl.col("m").is_not_null())
        .select("line_no", pl.col("m").str.extract_groups(pattern).alias("g"))
        .select(
            pl.col("line_no").cast(pl.Int64),
            g.field("key").str.strip_chars().cast(pl.Categorical()).alias("key"),
            g.field("value").cast(pl.Float64, strict=False).alias("value"),
            *(g.field(e) for e in extra),
        )
        .filter(pl.col("value").is_not_null())
        .collect()
    )
