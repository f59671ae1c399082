"""HF Trainer's console output: the dicts its ProgressCallback writes through tqdm
(transformers/trainer_callback.py: `self.training_bar.write(str(logs))`), among the progress bar:

      3%|▎         | 10/300 [00:03<01:30,  3.20it/s]\r{'loss': 2.3026, 'grad_norm': 1.25, 'learning_rate': 4.9e-05, 'epoch': 0.03}
    {'eval_loss': 2.05, 'eval_runtime': 1.2, 'eval_samples_per_second': 80.0, 'eval_steps_per_second': 10.0, 'epoch': 0.1}
    {'train_runtime': 100.1, 'train_samples_per_second': 29.9, 'train_steps_per_second': 3.0, 'train_loss': 2.0, 'epoch': 1.0}

A dict names no step. A training dict's step is, in order:

1. the count of the training progress bar written since the dict before it, on the dict's own line
   (tqdm redraws with \r, so the bar and the dict share a line) or on the lines before it. The
   training bar is the first bar of the file (the Trainer opens it before any evaluation bar);
   bars of another total (evaluation, prediction) are not its. A count of 0, or one no higher
   than the last step, is a bar not redrawn since (tqdm redraws at most every 0.1 s): not this
   dict's step; but the bar at 0 before the first dict (a first log within tqdm's 0.1 s,
   transformers 5's console at logging_steps=1) places it at step 1, the first past it.
2. else `epoch` x the steps per epoch, when the Trainer's banner said them (`Num update steps per
   epoch = N`, or `Total optimization steps = T` over `Num Epochs = E` in the same read); the
   console's epoch has 2 decimals, so this step is as close as that allows.
3. else the step before it; and in a file with neither bar nor banner, the dicts are numbered
   1, 2, 3... in file order, which a warning says (base.STEP_FALLBACKS).

An evaluation dict (every value `eval_...`) belongs to the step the training was at: the step of
the dict before it; before any, it is not read once steps come from the bar or the epoch (it would
be numbered). A dict behind a step it names (OpenRLHF's `✨ Global step 5: {...}` and `global_step 5,
eval_metrics: {...}`, openrlhf/trainer/ppo_trainer.py) is at that step, as one holding a step key.
The end-of-training summary is dropped. The bar, its total and the steps per epoch
are kept in the cursor, so the daemon's reads, one block at a time, place each dict as one read
of the whole file does.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import polars as pl

from ..cursor import Cursor
from .base import Format, LineFormat
from .. import table
from .dictlines import EVAL_KEY, STEP_KEYS, SUMMARY_KEYS, python_line, python_pairs_of, python_wide, rows_of, unreadable_steps
from .fastpath import Wide, long_rows

BAR = r"\d+%\|[^|\r\n]*\|\s*(\d+)/(\d+)\s*\["
"""tqdm's default bar: `{percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} [{elapsed}<...`."""
_NUMBER = r"\s*=\s*([\d,]+)"
PER_EPOCH = re.compile(r"Num update steps per epoch" + _NUMBER)
EPOCHS = re.compile(r"Num Epochs" + _NUMBER)
TOTAL = re.compile(r"Total optimization steps" + _NUMBER)
PREFILTER = r"\{|\d/\d+\s*\[|Num update steps per epoch|Num Epochs|Total optimization steps"
NAMED_STEP = r"(?i)\bglobal[ _]step[ :=]+(\d+)\b[^{}]*\{"
"""A step the line names before its dict."""


def parse(lines: pl.DataFrame, cursor: Cursor, raw: bytes | None = None) -> tuple[pl.DataFrame, Cursor]:
    wide, rest = python_wide(lines)
    named = _named_steps(lines)
    if not rest.height and named is None and (short := _placed_rows(lines, wide, cursor)) is not None:
        return short
    pairs = python_pairs_of(wide, rest)
    if named is not None:
        # As if the dict held it, after its own keys (a step key of its own comes first).
        pairs = pl.concat([pairs, named]).sort("line_no", maintain_order=True)
    line_steps, evals, state = _steps(lines, _records(pairs), cursor)
    # Once a bar or the epoch placed a dict, an evaluation with no step before it is at no step.
    unnumbered = evals if line_steps.height or cursor.last_step is not None else None
    rows, after = rows_of(lines, pairs, cursor, line_steps=line_steps, unnumbered=unnumbered)
    return rows, after.advance(**carried(state))


def _named_steps(lines: pl.DataFrame) -> pl.DataFrame | None:
    """(line_no, key `global_step`, value) of the dicts behind a step their line names, or None."""
    text = pl.col("text")
    named = lines.filter(text.str.contains(r"(?i)global[ _]step")).select("line_no", text.str.extract(NAMED_STEP, 1).cast(pl.Float64).alias("value"))
    named = named.filter(pl.col("value").is_not_null())
    if not named.height:
        return None
    return named.select("line_no", pl.lit("global_step").cast(pl.Categorical).alias("key"), "value")


def _placed_rows(lines: pl.DataFrame, wide: Wide, cursor: Cursor) -> tuple[pl.DataFrame, Cursor] | None:
    """The raw rows of a block whose lines all took the fast path (`wide`), straight from the wide
    pairs, when they are what the usual console writes: training dicts (no step, summary or
    evaluation key), each placed by a bar (or the loop in _steps), no step key holding no number.
    What rows_of makes of them, without laying the pairs out long and joining them back to their
    steps. None when that does not hold: the long way decides."""
    keys = wide.keys
    if not keys or any(k.lower() in STEP_KEYS or k.lower() in SUMMARY_KEYS or k.lower().endswith("_num_updates") or EVAL_KEY.match(k) for k in keys):
        return None
    columns = wide.values.columns
    train = [c for c, k in zip(columns, keys) if k.lower() != "epoch"]
    if not train:
        return None
    epoch = [c for c, k in zip(columns, keys) if k.lower() == "epoch"]
    held = wide.values.select(
        pl.lit(wide.line_no).alias("line_no"),
        pl.any_horizontal(pl.col(train).is_not_null()).alias("train"),
        pl.lit(False).alias("eval"),
        (pl.col(epoch[0]) if epoch else pl.lit(None, dtype=pl.Float64)).alias("epoch"),
        pl.any_horizontal(pl.all().is_not_null()).alias("held"),
    )
    line_steps, evals, state = _steps(lines, held.filter("held").drop("held"), cursor)
    n = int(held.get_column("held").sum())
    # Every line with a pair is a training dict placed at its step (else records_to_rows decides).
    if not n or evals.len() or line_steps.height != n or unreadable_steps(lines).len():
        return None
    steps = held.select("line_no").join(line_steps, on="line_no", how="left", maintain_order="left").get_column("step").fill_null(0)
    rows = long_rows(steps.to_numpy(), keys, wide.values, wide.line_no)
    after = cursor.advance(index=cursor.index + n, last_step=int(line_steps.get_column("step")[-1]))
    return table.conform_raw(rows), after.advance(**carried(state))


def _records(pairs: pl.DataFrame) -> pl.DataFrame:
    """Per dict line: is it a training dict without a step of its own, an evaluation dict, its epoch.
    (Keys classified once each: a handful of names over millions of pairs.)"""
    names = [k for k in pairs.get_column("key").unique().to_list() if k is not None]
    stepped = [k for k in names if k.lower() in STEP_KEYS]
    summary = [k for k in names if k.lower() in SUMMARY_KEYS]
    evals = [k for k in names if EVAL_KEY.match(k)]
    # Keys in any case: a script's own `{'Epoch': 3, 'Loss': 0.187}` is read as the Trainer's dicts are.
    epochs = [k for k in names if k.lower() == "epoch"]
    train = [k for k in names if k not in epochs and k not in stepped and k not in summary and k not in evals]
    key = pl.col("key")
    return pairs.group_by("line_no", maintain_order=True).agg(
        (key.is_in(train).any() & ~key.is_in(stepped + summary).any()).alias("train"),
        (key.is_in(evals).any() & ~key.is_in(train + stepped + summary).any()).alias("eval"),
        pl.col("value").filter(key.is_in(epochs)).first().alias("epoch"),
    )


def _steps(lines: pl.DataFrame, records: pl.DataFrame, cursor: Cursor) -> tuple[pl.DataFrame, pl.Series, Cursor]:
    """line_no -> step of the training dicts a bar or the epoch places, the evaluation dicts' lines,
    and the cursor's HF fields after these lines (`records`: _records' frame of the dict lines). A plain loop over the lines that hold a bar, a
    banner line or a dict: its state is a few numbers, and what it does per line is easier to
    check read as a loop than as a chain of window expressions."""
    marked = _marked(lines).join(records, on="line_no", how="left", maintain_order="left")
    placed = _placed_by_bars(marked, cursor)
    if placed is not None:
        return placed
    marked = _firsts(lines, marked)
    at = _Placing.of(cursor)
    epochs: int | None = None
    placed_lines: list[int] = []
    placed_steps: list[int] = []
    eval_lines: list[int] = []
    for line_no, head_n, head_total, tail_n, tail_total, banner, train, is_eval, epoch, hfirst_n, hfirst_total, tfirst_n, tfirst_total, head_k, tail_k in marked.iter_rows():
        if banner is not None:
            at.per_epoch, epochs = _banner(banner, at.per_epoch, epochs)
        at.drawn(head_n, head_total, hfirst_n, hfirst_total, head_k)
        if train:
            step = at.train(epoch)
            if step is not None:
                placed_lines.append(line_no)
                placed_steps.append(step)
        elif is_eval:
            eval_lines.append(line_no)
        at.drawn(tail_n, tail_total, tfirst_n, tfirst_total, tail_k)
    line_steps = pl.DataFrame({"line_no": placed_lines, "step": placed_steps}, schema={"line_no": pl.Int64, "step": pl.Int64})
    return line_steps, pl.Series("line_no", eval_lines, dtype=pl.Int64), at.cursor(cursor)


def _parts() -> tuple[pl.Expr, pl.Expr]:
    """A line's text before its dict and after it. Cut at the first `{` by characters: tqdm's `█`
    is three bytes, and a byte offset (str.find) taken as a character count (str.slice) ran the
    head into the dict and past the bar after it. (The dict's `{`, cut off, is left off: BAR's
    match starts at a digit.)"""
    cut = pl.col("text").str.splitn("{", 2)
    return cut.struct.field("field_0"), cut.struct.field("field_1")


def _marked(lines: pl.DataFrame) -> pl.DataFrame:
    """Per line: the last bar drawn before its dict and after it (`n/total` each: head_n, head_total,
    tail_n, tail_total), and the line itself when it may be a banner. The bars before the dict
    count for it; any after it, for the next. The last redraw of a line is all that counts (one bar
    redraws on one line; another's, with tqdm's position, on its own). Each a column computed once,
    in one query over every line, and only what _placed_by_bars reads: the loop's own columns
    (_firsts) made every read of the usual console 10-16% slower when they were computed here."""
    text = pl.col("text")
    head, tail = _parts()
    return (
        lines.lazy()
        .select(
            "line_no",
            _last_count(head).alias("head"),
            _last_count(tail).alias("tail"),
            pl.when(text.str.contains("=", literal=True)).then(text).alias("banner"),
        )
        .select("line_no", *_count_and_total("head"), *_count_and_total("tail"), "banner")
        .collect()
    )


def _firsts(lines: pl.DataFrame, marked: pl.DataFrame) -> pl.DataFrame:
    """`marked` (_marked's columns, in `lines`' order) with what the loop alone reads: the first bar
    drawn before each line's dict and after it (hfirst_n, hfirst_total, tfirst_n, tfirst_total) and
    how many bars each part holds (head_k, tail_k); the first bar of a part may be tqdm.write's
    refresh (_Placing.drawn). Only a line with two `%|` can hold two bars (each BAR match holds
    one): on the others the first bar is the last, so BAR is run again on the few that have two.
    (A part with no bar says 0 bars: the loop reads none of these columns for it.)"""
    head, tail = _parts()
    many = lines.lazy().filter(pl.col("text").str.count_matches("%|", literal=True) >= 2)
    exact = (
        many.select("line_no", head.str.extract_all(BAR).alias("head"), tail.str.extract_all(BAR).alias("tail"))
        .select(
            "line_no", _count(pl.col("head").list.first()).alias("hfirst"), _count(pl.col("tail").list.first()).alias("tfirst"),
            pl.col("head").list.len().alias("head_k"), pl.col("tail").list.len().alias("tail_k"),
        )
        .select("line_no", *_count_and_total("hfirst"), *_count_and_total("tfirst"), "head_k", "tail_k")
    )
    one = lambda part: pl.col(f"{part}_total").is_not_null().cast(pl.UInt32)  # noqa: E731 (no bar, or its only one)
    return (
        marked.lazy()
        .join(exact, on="line_no", how="left", maintain_order="left")
        .with_columns(
            pl.coalesce("hfirst_n", "head_n").alias("hfirst_n"), pl.coalesce("hfirst_total", "head_total").alias("hfirst_total"),
            pl.coalesce("tfirst_n", "tail_n").alias("tfirst_n"), pl.coalesce("tfirst_total", "tail_total").alias("tfirst_total"),
            pl.coalesce("head_k", one("head")).alias("head_k"), pl.coalesce("tail_k", one("tail")).alias("tail_k"),
        )
        .collect()
    )


CARRIED = ("steps", "bar", "bar_total", "per_epoch", "anchor", "since", "interval", "refresh", "by_bar", "by_interval", "by_epoch", "by_last")
"""The cursor's fields this format keeps across reads (what _Placing is made of)."""


def carried(state: Cursor | _Placing) -> dict[str, object]:
    """The HF fields of `state`, for the cursor a read of rows hands on."""
    return {name: getattr(state, name) for name in CARRIED}


@dataclass
class _Placing:
    """The loop's state while it places training dicts, line after line (the cursor's HF fields,
    `last` for its last_step). A dict's step is, in order:

    1. the training bar's count drawn since the dict before it, when it is past the last step: an
       anchor. The interval is then the steps since the anchor before over the dicts since it (for
       the first anchor, since step 0 over the dicts before it, if any: one dict alone might be
       the first of a resumed run).
    2. the anchor plus the interval for each dict since it (HF's `logging_steps`: the dicts between
       two redraws of the bar, tqdm drawing it at most every 0.1 s), past the last step; the
       refresh tqdm.write draws after such a dict says where it was (`drawn`): the next anchor.
    3. epoch x the steps per epoch, when a banner said them.
    4. none: the step before it (records_to_rows), or numbered when no dict had a step yet.
    Only what came before a dict places it, so a daemon's reads, a few lines each, place each dict
    as one read of the whole file does (the cursor carries these fields)."""

    steps: str | None
    bar: int | None
    bar_total: int | None
    per_epoch: float | None
    anchor: int | None
    since: int
    interval: float | None
    refresh: bool
    by_bar: int
    by_interval: int
    by_epoch: int
    by_last: int
    last: int | None

    @classmethod
    def of(cls, cursor: Cursor) -> _Placing:
        return cls(**carried(cursor), last=cursor.last_step)

    def cursor(self, cursor: Cursor) -> Cursor:
        """`cursor` with these HF fields (its last step is records_to_rows' to hand on)."""
        return cursor.advance(**carried(self))

    def drawn(self, n: int | None, total: int | None, first: int | None, first_total: int | None, k: int | None) -> None:
        """The bars drawn on part of a line (`k` of them; the last `n/total`, the first `first/first_total`):
        the training bar's (the first total seen) last count is the next dict's. After a dict no bar
        placed (`refresh`), the first is tqdm.write's refresh (it clears the bar, writes the dict,
        redraws the bar at the same count): that dict's own step, an anchor; only a bar drawn after
        it is the next dict's."""
        if total is None:
            return
        self.bar_total = self.bar_total if self.bar_total is not None else total
        if self.refresh and first_total == self.bar_total:
            self.refresh = False
            if first is not None and first >= 1 and (self.anchor is None or first > self.anchor):
                if self.anchor is not None:
                    self.interval = max(1.0, (first - self.anchor) / self.since)
                elif self.interval is None:
                    self.interval = max(1.0, first / self.since)
                self.anchor, self.since = first, 0
            if k == 1:
                return
        if total == self.bar_total:
            self.bar = n

    def train(self, epoch: float | None) -> int | None:
        """The step of a training dict (None: none found), the bar reset for the next."""
        bar, last, step = self.bar, self.last, None
        self.bar, self.refresh = None, False
        if bar is not None and bar >= 1 and (last is None or bar > last):
            self.interval = _implied(bar, self.anchor, self.since, self.interval)
            step, self.anchor, self.since = bar, bar, 0
            self.by_bar += 1
        elif self.interval is not None and self.anchor is not None and last is not None:
            self.since += 1
            step = max(last + 1, self.anchor + round(self.interval * self.since))
            self.by_interval += 1
        else:
            self.since += 1
            if epoch is not None and self.per_epoch:
                step = round(epoch * self.per_epoch)
                self.by_epoch += 1
            elif last is None and bar == 0:
                # The training bar drawn at 0 and not since: the Trainer logs after its step and
                # tqdm redraws at most every 0.1 s, so a first log that quick (transformers 5's
                # console at logging_steps=1) follows the bar's first draw. It is the first step
                # past it; tqdm.write's refresh after it says where it really was (`drawn`).
                step = 1
                self.by_bar += 1
            elif last is None:
                self.steps = "numbered"  # and stays so: the warning is said once, whatever follows
            else:
                self.by_last += 1
        if step is not None:
            self.last = step
        self.refresh = self.since > 0
        return step


def _placed_by_bars(marked: pl.DataFrame, cursor: Cursor) -> tuple[pl.DataFrame, pl.Series, Cursor] | None:
    """What the loop in _steps gives, in columns, when every training dict of these lines takes its
    step from the bar (the usual console: each dict after a redraw of a bar counting up); None
    when one would not (no bar since the dict before, a count not past the last step), which the
    loop then settles: only there do the epoch, the banners and the last step placed decide.

    The bar a dict reads is the last count of the training bar (its total) drawn since the dict
    before it, on the lines before or on its own line before the dict; the dict resets it. So after
    each line the bar is its tail's count, else nothing if it held a dict, else its head's count,
    else the bar after the line before (a forward fill, a dict's reset written as -1)."""
    if cursor.refresh:
        return None  # the first bar drawn is the last dict's refresh: the loop reads it
    total = cursor.bar_total
    if total is None:
        firsts = marked.select(pl.coalesce("head_total", "tail_total").drop_nulls().first()).item()
        total = firsts
    # No bar anywhere (total None): no count is the training bar's (a null comparison, said as one).
    this_bar = (lambda c: pl.col(c) == total) if total is not None else (lambda c: pl.lit(None, dtype=pl.Boolean))
    head = pl.when(this_bar("head_total")).then(pl.col("head_n"))
    tail = pl.when(this_bar("tail_total")).then(pl.col("tail_n"))
    train = pl.col("train").fill_null(False)
    after = pl.when(tail.is_not_null()).then(tail).when(train).then(-1).otherwise(head).forward_fill()
    before = after.shift(1).fill_null(-1 if cursor.bar is None else cursor.bar)
    bars = marked.select(
        "line_no",
        train.alias("train"),
        (pl.col("eval").fill_null(False) & ~train).alias("eval"),
        pl.coalesce(head, pl.when(before >= 0).then(before)).alias("bar"),
        pl.when(after >= 0).then(after).alias("after"),
        after.is_not_null().alias("drawn"),
    )
    dicts = bars.filter(pl.col("train")).select("line_no", pl.col("bar").alias("step"))
    counts = dicts.get_column("step")
    if counts.null_count() or (counts.len() and (counts.min() < 1 or (cursor.last_step is not None and counts[0] <= cursor.last_step))):
        return None
    if counts.len() > 1 and counts.diff().min() <= 0:
        return None
    per_epoch, epochs = cursor.per_epoch, None
    for banner in marked.get_column("banner").drop_nulls():
        per_epoch, epochs = _banner(banner, per_epoch, epochs)
    # The bar after the last line: a count, nothing after a dict, or the cursor's when no line drew one.
    drawn = bars.filter(pl.col("drawn"))
    bar = drawn.get_column("after")[-1] if drawn.height else cursor.bar
    evals = bars.filter(pl.col("eval")).get_column("line_no")
    state = cursor.advance(bar=bar, bar_total=total, per_epoch=per_epoch, **_anchored(counts, cursor))
    return dicts.cast({"line_no": pl.Int64, "step": pl.Int64}), evals, state


def _anchored(counts: pl.Series, cursor: Cursor) -> dict[str, object]:
    """_Placing's anchor and interval after dicts each placed at a bar's count (`counts`)."""
    if not counts.len():
        return {}
    last = int(counts[-1])
    if counts.len() > 1:
        interval = _implied(last, int(counts[-2]), 0, cursor.interval)
    else:
        interval = _implied(last, cursor.anchor, cursor.since, cursor.interval)
    return {"anchor": last, "since": 0, "interval": interval, "by_bar": cursor.by_bar + counts.len()}


def _implied(bar: int, anchor: int | None, since: int, interval: float | None) -> float | None:
    """The logging interval a bar's count `bar` implies as it places a dict, `since` dicts after
    the one placed at `anchor`: the steps between them over the dicts (for the first anchor, from
    step 0 over the dicts before it, if any: one dict alone might be a resumed run's first; else
    the interval known stays)."""
    if anchor is not None:
        return max(1.0, (bar - anchor) / (since + 1))
    if since:
        return max(1.0, bar / (since + 1))
    return interval


def _last_count(text: pl.Expr) -> pl.Expr:
    """`n/total` of the last bar drawn in `text`, or null."""
    return _count(text.str.extract_all(BAR).list.last())


def _count(bar: pl.Expr) -> pl.Expr:
    """`n/total` of one BAR match. Cut by hand rather than by BAR's groups (a capture costs twice
    the match): it holds two `|`, the count follows the last."""
    return bar.str.split("|").list.last().str.strip_chars_end("[").str.strip_chars()


def _count_and_total(name: str) -> tuple[pl.Expr, pl.Expr]:
    parts = pl.col(name).str.split_exact("/", 1)
    return parts.struct.field("field_0").cast(pl.Int64).alias(f"{name}_n"), parts.struct.field("field_1").cast(pl.Int64).alias(f"{name}_total")


def _banner(text: str, per_epoch: float | None, epochs: int | None) -> tuple[float | None, int | None]:
    if m := PER_EPOCH.search(text):
        return float(_int(m[1])), epochs
    if m := EPOCHS.search(text):
        return per_epoch, _int(m[1])
    if (m := TOTAL.search(text)) and epochs and per_epoch is None:
        return _int(m[1]) / epochs, epochs
    return per_epoch, epochs


def _int(text: str) -> int:
    return int(text.replace(",", ""))


HF_CONSOLE = LineFormat("hf_console", parse, prefilter=PREFILTER)
FORMAT = Format(reader=HF_CONSOLE, line=python_line)


def placement(cursor: Cursor) -> str | None:
    """How a read placed the training dicts (the cursor after it), for `read`'s metrics line: what a
    user checks first when a console log's curve looks too short or its spikes are missing."""
    interval = cursor.interval or 0
    said = [
        (cursor.by_bar, "at a progress bar's count"),
        (cursor.by_interval, f"at the logging interval after it ({interval:g} step{'s' if interval != 1 else ''})"),
        (cursor.by_epoch, f"at epoch x {cursor.per_epoch or 0:g} steps per epoch"),
        (cursor.by_last, "at the step before it"),
    ]
    parts = [f"{n:,} {how}" for n, how in said if n]
    return ", ".join(parts) or None
