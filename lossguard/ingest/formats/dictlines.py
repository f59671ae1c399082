"""JSON lines and the dicts of HF Trainer console output (whose steps hf_console.py finds): one flat
dict per line, JSON (`"k": v`) or Python repr (`'k': v`), often behind a timestamp or a tqdm bar.
Values may be NaN/Infinity, quoted numbers ("7.21" in fairseq's JSON log) or wrapped
(`np.float64(1.5)`, `tensor(1.5)`)."""

from __future__ import annotations

import json
import re

import polars as pl

from .. import table
from ..cursor import Cursor
from .base import Format, LineFormat, Together
from .fastpath import Wide, fast_pairs, fast_wide, json_wide, long_rows
from .pairs import NUMBER, merged, pairs_frame, records_to_rows, usable_step

PAIR = (
    r"""["'](?P<key>[^"'\n]{1,200})["']\s*:\s*(?:[A-Za-z_][\w.]*\()?["']?(?P<value>"""
    + NUMBER
    + r""")["']?\s*(?:,|\}|\))"""
)
STEP_KEYS = (
    "step", "global_step", "iter", "iteration", "current_steps", "_step", "num_updates",
    "train/global_step", "trainer/global_step", "steps", "training_iteration",
)
# HF Trainer's end-of-training summary ({'train_runtime': ..., 'train_loss': ...}) is not a step.
SUMMARY_KEYS = ("train_runtime", "train_samples_per_second", "total_flos")


# The same pair, as one field of a line cut at its commas.
CELL = PAIR.replace(r"""(?:,|\}|\))""", r"""(?:\}|\)|$)""")


def parse(lines: pl.DataFrame, cursor: Cursor, raw: bytes | None = None) -> tuple[pl.DataFrame, Cursor]:
    return rows_of(lines, python_pairs(lines), cursor)


def python_pairs(lines: pl.DataFrame) -> pl.DataFrame:
    """(line_no, key, value) of Python-repr dicts (`{'loss': 2.3, ...}`), in line order."""
    wide, rest = python_wide(lines)
    return python_pairs_of(wide, rest)


def python_wide(lines: pl.DataFrame) -> tuple[Wide, pl.DataFrame]:
    """The fast path's pairs of Python-repr dicts, a row per line (fast_wide), and the lines left."""
    return fast_wide(lines, sep=",", cell_re=CELL, strip=" {}", one_pair_per_field=True)


def python_pairs_of(wide: Wide, rest: pl.DataFrame) -> pl.DataFrame:
    """python_pairs of what python_wide gave."""
    return merged(wide.pairs(), pairs_frame(rest, PAIR))


def unreadable_steps(lines: pl.DataFrame) -> pl.Series:
    """The lines holding a step key whose value is no number (STEP_ITEM).
    (STEP_ITEM only searched in lines holding a step key's name, which its every match holds.)"""
    text = pl.col("text")
    return lines.filter(pl.when(text.str.contains(STEP_NAME)).then(text).str.contains(STEP_ITEM).fill_null(False)).get_column("line_no")


def parse_json(lines: pl.DataFrame, cursor: Cursor, raw: bytes | None = None) -> tuple[pl.DataFrame, Cursor]:
    wide, rest = json_wide(lines, raw=raw)
    if not rest.height and (direct := stepped_rows(wide, cursor)) is not None:
        return direct
    fast = wide.pairs()
    if not fast.height:
        fast, rest = fast_pairs(lines, sep=",", cell_re=CELL, strip=" {}", one_pair_per_field=True)
        fast = _as_json_keys(fast)
    pairs = merged(fast, _as_json_keys(pairs_frame(rest, PAIR)))
    return rows_of(lines, pairs, cursor, unnumbered=_epoch_evals(pairs))


def _as_json_keys(pairs: pl.DataFrame) -> pl.DataFrame:
    """Keys as JSON means them (`"train\\/loss"` is `train/loss`): the regex paths see a key's text as
    written, escapes and all, where polars' NDJSON reader decodes it, and a log must name its tags
    the same whichever path a read takes (a daemon's few new lines go the regex way, the scan of the
    whole file the NDJSON way). Decoded on the few distinct names."""
    decoded = {}
    for key in pairs.get_column("key").unique().to_list():
        if key is not None and "\\" in key:
            try:
                decoded[key] = json.loads(f'"{key}"')
            except ValueError:
                pass  # not a JSON string's text: kept as written
    if not decoded:
        return pairs
    return pairs.with_columns(pl.col("key").cast(pl.String).replace(decoded).cast(pl.Categorical))


def stepped_rows(wide: Wide, cursor: Cursor) -> tuple[pl.DataFrame, Cursor] | None:
    """The raw rows of lines that each name their step, straight from the wide pairs: what rows_of
    makes of them when every line has one usable step key and no key that makes a line special (a
    summary, fairseq's `*_num_updates`), without laying every pair out long and joining it back to
    its line's step. None when that does not hold: rows_of decides."""
    lowered = [k.lower() for k in wide.keys]
    at = [i for i, k in enumerate(lowered) if k in STEP_KEYS]
    if len(at) != 1 or any(k in SUMMARY_KEYS or k.endswith("_num_updates") for k in lowered):
        return None
    step_key = wide.keys[at[0]]
    steps = wide.values.select(usable_step(pl.col(step_key)).alias("step")).to_series()
    if steps.null_count():
        return None
    metrics = [k for k in wide.keys if k != step_key]
    values = wide.values.select(metrics)
    # A line with no metric is no record: no rows, not counted.
    record = values.select(pl.any_horizontal(pl.all().is_not_null()).alias("r")).to_series() if metrics else pl.Series([False] * steps.len())
    n = int(record.sum())
    if not n:
        return None
    rows = long_rows(steps.to_numpy(), metrics, values, wide.line_no)
    last = int(steps.filter(record)[-1])
    return rows, cursor.advance(index=cursor.index + n, last_step=last)


EVAL_KEY = re.compile(r"(?i)^(?:valid|val|eval|test|dev)[_/]")


def _epoch_evals(pairs: pl.DataFrame) -> pl.Series:
    """Lines that are a validation's summary, as fairseq's JSON log prints one (`{"epoch": 1,
    "valid_loss": "5.91", ...}`): an epoch and only eval values. Without an update count of its own
    it belongs to the update before it, and before any it is at no step: numbering it would put it
    at step 1, ahead of the training it followed. (Decided on the few distinct keys.)"""
    keys = [k for k in pairs.get_column("key").unique().to_list() if k is not None]
    if "epoch" not in keys:
        return pl.Series("line_no", [], dtype=pl.Int64)
    other = [k for k in keys if k != "epoch" and k.lower() not in STEP_KEYS and not EVAL_KEY.match(k)]
    per_line = pairs.group_by("line_no").agg(
        (pl.col("key") == "epoch").any().alias("epoch"),
        pl.col("key").is_in(other).any().alias("other") if other else pl.lit(False).alias("other"),
    )
    return per_line.filter(pl.col("epoch") & ~pl.col("other")).get_column("line_no")


STEP_ITEM = r"""(?i)["'](?:""" + "|".join(re.escape(k) for k in STEP_KEYS) + r""")["']\s*:"""
STEP_NAME = r"(?i)(?:" + "|".join(re.escape(k) for k in STEP_KEYS) + ")"
"""What every STEP_ITEM match holds: the literal search, twice as fast, settles most lines."""


def rows_of(
    lines: pl.DataFrame, pairs: pl.DataFrame, cursor: Cursor, *, unnumbered: pl.Series | None = None, line_steps: pl.DataFrame | None = None
) -> tuple[pl.DataFrame, Cursor]:
    """Dict pairs as raw rows (records_to_rows), with what dict lines share: `*_num_updates` is a
    step, a step key holding no number leaves its line unplaced, the end-of-training summary is no
    point of the curve."""
    # fairseq's JSON log prefixes every value of a validation or epoch summary with its tag, the
    # update count too (`valid_num_updates`): that is the line's step, not a metric.
    counts = {k: "num_updates" for k in pairs.get_column("key").unique().to_list() if k is not None and k.lower().endswith("_num_updates")}
    if counts:
        pairs = pairs.with_columns(pl.col("key").cast(pl.String).replace(counts).cast(pl.Categorical))
    # A step key whose value is no number (`"step": true`, `"step": "abc"`) gives no pair: find those
    # lines among the ones with metrics but no step pair (a log that writes its steps has few).
    # (Keys compared on the few distinct names; the sets only built when some line lacks a step.)
    step_names = [k for k in pairs.get_column("key").unique().to_list() if k is not None and k.lower() in STEP_KEYS]
    keyed = pairs.filter(pl.col("key").is_in(step_names)).get_column("line_no").unique() if step_names else None
    unreadable = None
    if keyed is None or keyed.len() < pairs.get_column("line_no").n_unique():
        stepless = pairs.get_column("line_no").unique()
        if keyed is not None:
            stepless = stepless.filter(~stepless.is_in(keyed.implode()))
        unreadable = unreadable_steps(lines.filter(pl.col("line_no").is_in(stepless.implode())))
    rows, state = records_to_rows(
        pairs, cursor, step_keys=STEP_KEYS, drop_record_keys=SUMMARY_KEYS, unreadable_steps=unreadable, unnumbered=unnumbered, line_steps=line_steps
    )
    return table.conform_raw(rows), state


JSON_OPENING = r"""\{\s*"(?:[^"\\\n]|\\.)*"\s*:"""
"""Where a line's JSON object opens: a brace and its first key. (A bare `{` opens a dict printed over
several lines, and `{'` a Python repr, neither a JSON line.)"""
_JSON_OPENING = re.compile(JSON_OPENING)
_DECODER = json.JSONDecoder()


def refused_json(lines: pl.DataFrame, rows: pl.DataFrame) -> list[tuple[int, str]]:
    """The lines opening a JSON object that gave no placed row and that JSON refuses (a line cut
    short, a missing comma or value), with JSON's reason: dropped without a word, they were a
    training step missing from the curve. A line the regex read values from (a tensor's repr
    printed into a JSON-looking line) is read, not refused; an object that is JSON but holds no
    number (an event, a config) is no error. (JSON parsed only on the lines that gave no row.)"""
    placed = rows.filter(pl.col("step").is_not_null()).get_column("line_no") if rows.height else pl.Series([], dtype=pl.Int64)
    suspects = lines.filter(~pl.col("line_no").is_in(placed.implode()) & pl.col("text").str.contains(JSON_OPENING))
    refused = []
    for line_no, text in suspects.select("line_no", "text").iter_rows():
        at = _JSON_OPENING.search(text)
        assert at is not None
        try:
            _DECODER.raw_decode(text, at.start())  # (text after the object is a console's, not JSON's)
        except ValueError as exc:
            why = f"{exc.msg} at column {exc.colno}" if isinstance(exc, json.JSONDecodeError) else str(exc)
            refused.append((int(line_no), f"not valid JSON ({why})"))
    return refused


JSONL = LineFormat(
    "jsonl", parse_json, prefilter=r"\{", refused=refused_json,
    # A line's rows depend on the lines before it (and the cursor) only when it names no step: it then
    # takes the last step before it, or the next record number.
    together=Together(lambda lines: lines.select((~pl.col("text").str.contains(STEP_ITEM)).alias("alone"))),
)

METRIC_ITEM = re.compile(r"""(?i)["'](?:[^"'\n]*loss[^"'\n]*|learning_rate|lr|grad_norm)["']\s*:\s*[-+\d.'"nNiI]""")
"""A dict item naming a metric. A line holding one is a dict's, even without the brace that opens
the dict (one printed over several lines): JSON if a `{"key":` opens it, Python repr if `{'key':`."""
_JSON_OPEN = re.compile(r"""\{\s*"[^"\n]+"\s*:""")
_PY_OPEN = re.compile(r"""\{\s*'[^'\n]+'\s*:""")


def _json_line(line: str) -> bool:
    return bool(_JSON_OPEN.search(line) and METRIC_ITEM.search(line))


def python_line(line: str) -> bool:
    return bool(_PY_OPEN.search(line) and METRIC_ITEM.search(line))


# A line with both openings is JSON's: JSONL comes first in formats.FORMATS.
JSONL_FORMAT = Format(reader=JSONL, line=_json_line)
