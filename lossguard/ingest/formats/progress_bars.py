"""Progress bars in a console log: Keras' `model.fit` bar and Lightning's tqdm bar, as a file that
stdout was sent to holds them. Both redraw one line with a carriage return (Keras backspaces over
it first), so a line of the file is every state the bar went through, and each state is a record:

    Epoch 2/3
    \r 1/40 ━━━━━━━━━━━━━━━━━━━━ 2s 61ms/step - loss: 3.0703 - mae: 1.3790\b\b...\r 2/40 ━━━...
    40/40 - 2s - 61ms/step - loss: 12.1661 - mae: 2.7050 - val_loss: 3.2634        (verbose=2)
     11/100 [==>...........................] - ETA: 1s - loss: 0.6890 - accuracy: 0.5275 (tf.keras 2)

    \rEpoch 0:  25%|██▌       | 1/4 [00:00<00:00, 48.26it/s, v_num=0, train_loss=0.512]\rEpoch 0:...

Keras (keras/src/utils/progbar.py: Progbar.update; keras/src/callbacks/progbar_logger.py prints
`Epoch E/M`, only when fitting more than one epoch): batch i of N in epoch E (from 1) is step
(E - 1) x N + i, the metrics are ` - name: value`, and the epoch's validation values come with its
last state. What the bar shows is the epoch's running mean (a spike is seen damped, and the curve
starts again at each epoch), which is what the log holds.

Keras 1 (keras/utils/generic_utils.py: Progbar; keras/callbacks.py: ProgbarLogger, 1.2.2) and
Keras 2 fitting arrays (`fit(x, y)`, before 2.3) count samples, not batches: the bar's total is
the sample count (`9595/9595 [=====] - 3s - loss: 0.5 - acc: 0.8`), its counts go up by the batch
size (the first state drawn is the first batch's, at its size), and `Train on 9595 samples,
validate on 1000 samples` comes before the first epoch. There no batch count is known: the step
is the epoch (from 1), its value the epoch's last state (the epoch's mean), and a read says so once
(base.STEP_FALLBACKS, `samples`). A bar counts samples where its total is the count of a `Train on
N samples` line, or where its epoch's first state is drawn past 1 and before its end (a bar
counting batches draws its first at 1: Keras draws the first update whatever its interval).

Lightning (lightning/pytorch/callbacks/progress/tqdm_progress.py): the bar described `Epoch E`
(from 0) at i of N is step E x N + i; its postfix holds the values logged with prog_bar=True
(`v_num` is the logger's version, no metric). The bar is drawn twice a batch, first with the
batch count and the previous batch's values, then with the new ones: a step's value is the last
drawn at it. The postfix keeps what was logged last until it is logged again: a validation's
values (and an epoch's aggregates) stay there for the batches after it. So a metric is read at
every batch once it has been seen logged by a batch (its value changed between a batch's two
draws); until then only where it changes, and at the bar's first state after a validation bar
(the validation's values are set then, equal to the last ones or not). Validation and
sanity-check bars hold no metrics of their own.

NeMo 2's bar (nemo/lightning/pytorch/callbacks/progress_bar.py: MegatronProgressBar, a Lightning
one) draws a step's count, then sets the step's values without drawing them: each state shows the
values of the step before, the trainer's `global_step` among them, which is where they go.

A bar's line ends only when its loop does (Lightning's, at a validation or at the end of training),
so a carriage return ends a record here too (LineFormat.carriage): a daemon reads each state as it
is drawn (both flush each redraw), and a line of a whole run's redraws is never too long to read.
"""

from __future__ import annotations

import json
import re

import polars as pl

from .. import table
from ..cursor import Cursor
from .base import Format, LineFormat
from .pairs import NUMBER, pairs_frame, usable_step

EPOCH_LINE = r"^\s*Epoch (?P<e>\d+)/\d+\s*$"
TRAIN_ON = r"^\s*Train on (\d+) samples"
"""Keras 1 and 2's line before fitting arrays (keras/engine/training.py, _fit_loop): the sample
count a bar of that total counts."""
SAMPLES = "samples"
"""Cursor.steps of a file whose Keras bar counts samples: its epochs are its steps."""
KERAS_BAR = (
    r"^\s*(?P<i>\d+)/(?P<n>\d+|Unknown) (?:\[[=>.]*\] |━+ |.*?(?:ETA: |\d+(?:s|ms|us)/step| - \d+s - )).*?- [A-Za-z_][\w./@-]*: "
)
"""A Keras bar's state: its count (`i/Unknown` in a first epoch of unknown length), its bar, or its
time a step, ETA or time (verbose=2 draws no bar), then ` - name: value` pairs."""
COUNTLESS = r"^\s*- (\d+s - [A-Za-z_])"
"""Keras 2.0-2.2's verbose=2 epoch line, which counts no batch (`Epoch 3/10` then ` - 3s - loss: 0.4948
- acc: 0.9100`, keras/callbacks.py ProgbarLogger with verbose=2): read as the epoch's one full bar
(`1/1 [=] - 3s - ...`), so the epoch is its step, as a bar counting samples makes it."""
KERAS_PAIR = r"- (?P<key>[A-Za-z_][\w./@-]*): (?P<value>" + NUMBER + r")(?:\s|$)"
TQDM_BAR = r"^Epoch (?P<e>\d+):(?: :)? +(?:\d+%)?\|[^|]*\| *(?P<i>\d+)/(?P<n>\d+|\?) \[(?P<inside>[^\]]*)\]"
"""Lightning's training bar: `i/N`, or `i/?` with no percentage for a loader of unknown length;
NeMo's (nemo/lightning/pytorch/callbacks/progress_bar.py: MegatronProgressBar, whose bar_format
writes `{desc}: ` after the desc tqdm already closes with one: `Epoch 0: :  1%|...`)."""
TQDM_PAIR = r"(?:^|\s)(?P<key>[A-Za-z_][^=,\]]*?)=(?P<value>" + NUMBER + r")(?:\.0*)?(?:,|$)"
"""A postfix item, as Lightning's Tqdm.format_num writes numbers: tqdm's `.3g`, padded to five
characters (`0.500`, and a NaN `nan.0`); a name may hold spaces (NeMo's `train_step_timing in s`)."""
OWN_STEP = "global_step"
"""A postfix item that is the state's step (NeMo logs the trainer's global_step to the bar with
its values: they go at it, whatever the bar's count)."""
NOT_METRICS = ("v_num",)
VALIDATION_BAR = r"^Validation(?: DataLoader \d+)?: "
"""Lightning's validation bar (init_validation_tqdm: `Validation DataLoader {i}`, or `Validation`)."""
PREFILTER = r"Epoch \d|\d/(?:\d+ (?:\[|━|- )|Unknown )|Train on \d|^\s*- \d+s - "


def parse(lines: pl.DataFrame, cursor: Cursor, raw: bytes | None = None) -> tuple[pl.DataFrame, Cursor]:
    text = pl.col("text")
    states = (
        lines.lazy()
        .select("line_no", text.str.replace_all("\x08", "", literal=True).str.split("\r").alias("text"))
        .explode("text")
        .with_row_index("state")
        .select("state", "line_no", text.str.strip_chars_end().str.replace(COUNTLESS, "1/1 [=] - ${1}"))
        .filter(text.str.contains(PREFILTER))
        .with_columns(
            text.str.extract(EPOCH_LINE, 1).cast(pl.Int64, strict=False).alias("epoch"),
            text.str.extract(TRAIN_ON, 1).cast(pl.Int64, strict=False).alias("train_on"),
            text.str.extract_groups(KERAS_BAR).alias("keras"),
            text.str.extract_groups(TQDM_BAR).alias("tqdm"),
        )
        .collect()
    )
    if not states.height:
        return _no_rows(), cursor
    keras, tqdm = pl.col("keras").struct, pl.col("tqdm").struct
    kn, ki = (keras.field("n").cast(pl.Int64, strict=False), keras.field("i").cast(pl.Int64, strict=False))
    tn, ti, te = (tqdm.field(f).cast(pl.Int64, strict=False) for f in ("n", "i", "e"))
    drawn = json.loads(cursor.drawn) if cursor.drawn else {}  # (Cursor.drawn: what the bars drew before this block)
    states = _unknown_lengths(states, drawn)
    states = states.with_columns(kn.alias("kn"), ki.alias("ki"), (keras.field("n") == "Unknown").alias("unknown"))
    epochs, cursor = _keras_epochs(states, cursor, drawn)
    states = states.join(epochs, on="line_no", how="left", maintain_order="left")
    keras_step = pl.when(pl.col("unknown") & (pl.col("keras_epoch") == 1)).then(pl.col("ki")).otherwise((pl.col("keras_epoch") - 1) * pl.col("kn") + pl.col("ki"))
    if cursor.steps == SAMPLES:
        # (Only the epoch's last state: its count is the samples', no batch's step to place the others at.)
        keras_step = pl.when(pl.col("ki") == pl.col("kn")).then(pl.col("keras_epoch")).otherwise(None)
    states = states.with_columns(
        pl.when(tqdm.field("n") == "?").then(pl.col("before") + ti).when(tqdm.field("i").is_not_null()).then(te * tn + ti).otherwise(keras_step).alias("step"),
        pl.when(tqdm.field("i").is_not_null()).then(tqdm.field("inside")).otherwise(text).alias("pairs_text"),
        tqdm.field("i").is_not_null().alias("drawn"),
        text.str.contains(VALIDATION_BAR).alias("validation"),
    )
    # A bar at 0 has drawn no batch of its epoch yet: its values are the batch's before (Lightning
    # resets the bar, still described with the epoch before, then describes it anew).
    bars = states.filter(pl.col("step").is_not_null() & (pl.coalesce(ti, ki) > 0))
    keras_rows = _rows(bars.filter(~pl.col("drawn")), KERAS_PAIR).drop("at", "exact")
    if keras_rows.height:
        keras_rows = _drawn_again(keras_rows, drawn)
    tqdm_rows = _own_steps(_rows(bars.filter(pl.col("drawn")), TQDM_PAIR, step_key=OWN_STEP), drawn)
    if tqdm_rows.height or states.get_column("validation").any():
        tqdm_rows = _redrawn(tqdm_rows, _validated(states, bars), drawn, cursor.last_step)
    tqdm_rows = tqdm_rows.drop("own")
    cursor = cursor.advance(drawn=json.dumps(drawn, sort_keys=True)) if drawn else cursor
    rows = pl.concat([keras_rows, tqdm_rows]).sort("state", maintain_order=True)
    # One value a step and metric, the last drawn (Keras draws its epoch's last state again with
    # the validation's values; Lightning draws each batch twice).
    rows = rows.unique(["step", "tag"], keep="last", maintain_order=True)
    if not rows.height:
        return _no_rows(), cursor
    last = int(rows.get_column("step").max())
    out = rows.select("step", "tag", "value", pl.lit(None, dtype=pl.Float64).alias("wall_time"), "line_no")
    return table.conform_raw(out), cursor.advance(last_step=last, index=cursor.index + bars.height)


def _unknown_lengths(states: pl.DataFrame, drawn: dict) -> pl.DataFrame:
    """The states, with `before`: for a tqdm bar of unknown length (`i/?`: an iterable loader), the
    batches of the epochs before the state's, each epoch as long as its last count. `drawn`
    (Cursor.drawn, `lengths`): the counts epochs reached, the blocks' before and these."""
    tqdm = pl.col("tqdm").struct
    lengths = {int(e): n for e, n in drawn.get("lengths", {}).items()}
    found = states.filter(tqdm.field("n") == "?").select(tqdm.field("e").cast(pl.Int64).alias("e"), tqdm.field("i").cast(pl.Int64).alias("i"))
    if not found.height:
        return states.with_columns(pl.lit(None, dtype=pl.Int64).alias("before"))
    for e, n in found.group_by("e").agg(pl.col("i").max()).iter_rows():
        lengths[e] = max(n, lengths.get(e, 0))
    epochs = sorted(lengths)
    before = dict(zip(epochs, [sum(lengths[k] for k in epochs if k < e) for e in epochs]))
    offsets = pl.DataFrame({"e": list(before), "before": list(before.values())}, schema={"e": pl.Int64(), "before": pl.Int64()})
    states = states.with_columns(tqdm.field("e").cast(pl.Int64, strict=False).alias("e")).join(offsets, on="e", how="left", maintain_order="left").drop("e")
    drawn["lengths"] = {str(e): n for e, n in lengths.items()}
    return states


def _keras_epochs(states: pl.DataFrame, cursor: Cursor, drawn: dict) -> tuple[pl.DataFrame, Cursor]:
    """(line_no, keras_epoch) of the lines of Keras bar states that are the training's, and the
    cursor after them. Keras ends a bar's line when its loop ends: an epoch's bar follows its
    `Epoch E/M` line (a fit of one epoch prints none, so a file's first bar is epoch 1's), and a bar
    after it with no such line between is another loop's, `model.evaluate`'s or `predict`'s (its
    count starts again), unless its count goes on: the same bar's line cut by something printed
    during the epoch (a warning sent to the same file). Cursor.epoch: the epoch of a header not yet
    followed by its bar, or minus the epoch of the bar drawn last; Cursor.bar, bar_total: that bar's
    last count and its total; Cursor.steps: SAMPLES once a training bar is seen counting samples
    (the module's docstring), `drawn`'s `samples`: the count of the `Train on N samples` line."""
    lines = (
        states.filter(pl.col("epoch").is_not_null() | pl.col("ki").is_not_null() | pl.col("train_on").is_not_null())
        .group_by("line_no", maintain_order=True)
        .agg(
            pl.col("epoch").last(), pl.col("ki").drop_nulls().first().alias("first"), pl.col("ki").drop_nulls().last().alias("last"),
            pl.col("kn").drop_nulls().first().alias("n"), pl.col("train_on").drop_nulls().last(),
        )
    )
    state, last, total, steps = cursor.epoch, cursor.bar, cursor.bar_total, cursor.steps
    found: list[tuple[int, int]] = []
    for line_no, header, first, final, n, train_on in lines.iter_rows():
        if train_on is not None:
            drawn["samples"] = train_on
        if first is None:  # (a header line alone, or the samples line)
            if header is not None:
                state, last, total = header, None, None
            continue
        if state is None or state > 0:
            epoch = state or 1
            if n is not None and (n == drawn.get("samples") or 1 < first < n):
                steps = SAMPLES
        elif last is not None and n == total and first >= last:
            epoch = -state  # (the epoch's bar, its line cut: a read may end between two states)
        else:
            continue  # another loop's bar
        found.append((line_no, epoch))
        state, last, total = -epoch, final, n
        if header is not None:  # (a header after the bar on the same line)
            state, last, total = header, None, None
    frame = pl.DataFrame(found, schema={"line_no": pl.Int64(), "keras_epoch": pl.Int64()}, orient="row")
    return frame, cursor.advance(epoch=state, bar=last, bar_total=total, steps=steps)


def _rows(bars: pl.DataFrame, pair: str, *, step_key: str | None = None) -> pl.DataFrame:
    """(state, line_no, step, tag, value, at, exact) of the bars' metric pairs, in drawing order;
    `at`: the value of `step_key` in the state, if it holds one (the pair is no metric), `exact`:
    whether it was written whole (tqdm writes a number in `.3g` when that is shorter: 1004 as 1e+3)."""
    schema = {
        "state": pl.UInt32(), "line_no": pl.Int64(), "step": pl.Int64(), "tag": pl.String(), "value": pl.Float64(), "at": pl.Int64(), "exact": pl.Boolean(),
    }
    if not bars.height:
        return pl.DataFrame(schema=schema)
    found = pairs_frame(bars.select(pl.col("state").cast(pl.Int64).alias("line_no"), pl.col("pairs_text").alias("text")), pair)
    found = found.filter(~pl.col("key").cast(pl.String).is_in(NOT_METRICS))
    at = bars.select(pl.col("state").cast(pl.Int64), "line_no", "step", pl.lit(None, dtype=pl.Int64).alias("at"), pl.lit(False).alias("exact"))
    if step_key is not None:
        key = pl.col("key").cast(pl.String)
        own = found.filter(key == step_key).select(pl.col("line_no").alias("state"), usable_step(pl.col("value")).alias("own"))
        found = found.filter(key != step_key)
        if own.height:
            written = bars.select(pl.col("state").cast(pl.Int64), pl.col("pairs_text").str.extract(re.escape(step_key) + r"=([^,\]]*)", 1).alias("written"))
            at = at.drop("at", "exact").join(own, on="state", how="left", maintain_order="left").join(written, on="state", how="left", maintain_order="left").select(
                "state", "line_no", "step", pl.col("own").alias("at"), (pl.col("own").is_not_null() & ~pl.col("written").str.contains("e", literal=True)).alias("exact")
            )
    return found.join(at, left_on="line_no", right_on="state", how="inner", maintain_order="left").select(
        pl.col("line_no").cast(pl.UInt32).alias("state"), pl.col("line_no_right").alias("line_no"), "step", pl.col("key").cast(pl.String).alias("tag"), "value", "at", "exact"
    )


def _own_steps(rows: pl.DataFrame, drawn: dict) -> pl.DataFrame:
    """Rows at the step their state holds (`at`, NeMo's global_step), `own` where it does. Where
    tqdm wrote it rounded (`1e+3` for 1000-1005; past 100000 always), the step is the bar's count
    and the distance between the two at the last exact one (`drawn`'s `offset`), or, before
    any, at the first one read (within the rounding of the step); a rounded state at the step of
    the one before it is the step after it (the bar drawn at its close: the count stays, the values
    are the last step's). Other rows stay at the count."""
    distance = pl.col("at") - pl.col("step")
    first = pl.when(pl.col("at").is_not_null()).then(distance).drop_nulls().first()
    offset = pl.when(pl.col("exact")).then(distance).forward_fill().fill_null(pl.lit(drawn.get("offset"), dtype=pl.Int64)).fill_null(first)
    rows = rows.with_columns(offset.alias("offset"))
    step = pl.when(pl.col("exact")).then(pl.col("at")).when(pl.col("at").is_not_null()).then(pl.coalesce(pl.col("step") + pl.col("offset"), "at")).otherwise("step")
    rows = rows.with_columns(step.alias("step"))
    states = rows.select("state", "step", "at", "exact").unique("state", keep="first", maintain_order=True)
    before = (drawn.get("last") or [None])[0]
    prior = pl.col("step").shift(1).fill_null(pl.lit(before, dtype=pl.Int64))
    bumped = states.select("state", (pl.col("step") + (pl.col("at").is_not_null() & ~pl.col("exact") & (pl.col("step") == prior)).fill_null(False).cast(pl.Int64)).alias("bumped"))
    rows = rows.join(bumped, on="state", how="left", maintain_order="left").with_columns(pl.col("bumped").alias("step")).drop("bumped")
    known = rows.get_column("offset").drop_nulls()
    if known.len():
        drawn["offset"] = int(known[-1])
    return rows.with_columns(pl.col("at").is_not_null().alias("own")).drop("at", "exact", "offset")


def _drawn_again(rows: pl.DataFrame, drawn: dict) -> pl.DataFrame:
    """Keras' rows less those a read before took already: an epoch's last state is drawn again with
    the validation's values, and a read may end between the two. `drawn`'s `keras`: the step of
    the last state read and its values."""
    step, values = drawn.get("keras", [None, {}])
    if step is not None:
        before = pl.DataFrame({"tag": list(values), "value": list(values.values())}, schema={"tag": pl.String(), "value": pl.Float64()})
        hit = rows.join(before.with_columns(pl.lit(True).alias("hit")), on=["tag", "value"], how="left", maintain_order="left").get_column("hit")
        rows = rows.filter(~((rows.get_column("step") == step) & hit.fill_null(False)))
    if rows.height:
        last = int(rows.get_column("step").max())
        at = rows.filter(pl.col("step") == last).unique("tag", keep="last", maintain_order=True)
        drawn["keras"] = [last, dict(zip(at.get_column("tag").to_list(), at.get_column("value").to_list()))]
    return rows


def _validated(states: pl.DataFrame, bars: pl.DataFrame) -> pl.DataFrame:
    """(state, after) of the training bar's states: `after`, the first state after a validation
    bar; and a last row (state null) saying whether the block ends after one."""
    seq = pl.concat([
        bars.filter(pl.col("drawn")).select("state", pl.lit(False).alias("validation")),
        states.filter(pl.col("validation")).select("state", pl.lit(True).alias("validation")),
    ]).sort("state")
    after = seq.select("state", pl.col("validation").shift(1).alias("after"), "validation")
    last = seq.get_column("validation").tail(1).to_list()
    tail = pl.DataFrame({"state": [None], "after": [bool(last and last[0])]}, schema={"state": pl.UInt32(), "after": pl.Boolean()})
    return pl.concat([after.filter(~pl.col("validation")).select("state", "after"), tail])


def _redrawn(rows: pl.DataFrame, validated: pl.DataFrame, drawn: dict, last_step: int | None) -> pl.DataFrame:
    """The tqdm postfix's values that are reports (see the module's docstring): none of a count's
    update (_count_updates); of a metric seen logged by a batch, all but a redraw of what was read
    at that count already; of the others, where they changed and after a validation. `drawn`
    (Cursor.drawn), read and then set for these rows: the last values drawn, at the last state's
    step, and whether that state was a count's update; the metrics seen logged by a batch; whether
    a validation bar was drawn last; the last state's step and values."""
    before = dict(drawn)
    values, batched = before.get("values", {}), before.get("batched", [])
    updates, drawn_last = _count_updates(rows, before.get("last"))
    # (At the last state drawn: a read may end after a count's update, which no row is read of.)
    at = before["last"][0] if before.get("last") else last_step
    seen = pl.DataFrame(
        {"tag": list(values), "value": [float(v) for v in values.values()], "step": [at] * len(values)},
        schema={"tag": pl.String(), "value": pl.Float64(), "step": pl.Int64()},
    )
    after = rows.join(validated.drop_nulls("state"), on="state", how="left", maintain_order="left").get_column("after").fill_null(False)
    if rows.height:
        after = after | ((rows.get_column("state") == rows.get_column("state").min()) & before.get("validated", False))
    shown = pl.concat([
        seen.with_columns(pl.lit(False).alias("new"), pl.lit(False).alias("after"), pl.lit(bool(before.get("update"))).alias("update")),
        rows.select("tag", "value", "step", pl.lit(True).alias("new")).with_columns(after.alias("after"), rows.get_column("state").is_in(updates.implode()).alias("update")),
    ])
    previous, prior_step = pl.col("value").shift(1).over("tag"), pl.col("step").shift(1).over("tag")
    changed = previous.is_null() | (pl.col("value") != previous).fill_null(True)
    # (A change between two draws at one count, but for the validation's: the batch logged it.)
    in_a_batch = (changed & (pl.col("step") == prior_step)).fill_null(False) & previous.is_not_null() & ~pl.col("after")
    # (Read at its count already: drawn again after a validation, on the next line.)
    again = (~changed & (pl.col("step") == prior_step) & ~pl.col("update").shift(1).over("tag")).fill_null(False)
    marked = shown.with_columns(
        changed.alias("changed"), again.alias("again"), (in_a_batch | pl.col("tag").is_in(batched)).cum_max().over("tag").alias("batched"),
    ).filter(pl.col("new"))
    batched_now = marked.get_column("batched")
    # (A state holding its own step is a report of all its values: the step is new with them.)
    again_now, own = marked.get_column("again"), rows.get_column("own")
    take = ((batched_now | own) & ~again_now) | (~batched_now & (marked.get_column("changed") | after))
    take &= ~marked.get_column("update")
    last = rows.group_by("tag", maintain_order=True).agg(pl.col("value").last())
    final = rows.get_column("state").tail(1)
    drawn.update({
        "values": {**values, **dict(zip(last.get_column("tag").to_list(), last.get_column("value").to_list()))},
        "update": bool(final.is_in(updates.implode()).any()) if rows.height else bool(before.get("update")),
        "batched": sorted(set(batched) | set(marked.filter(pl.col("batched")).get_column("tag").to_list())),
        "validated": bool(validated.filter(pl.col("state").is_null()).get_column("after").item()),
        "last": drawn_last,
    })
    return rows.filter(take)


def _count_updates(rows: pl.DataFrame, before: list | None) -> tuple[pl.Series, list | None]:
    """The states drawn at a new count with the values of the state before them (`before`: the
    last state's step and values, from a block before): Lightning's first draw of a batch, which
    shows the batch before's values, the batch's own coming with its next draw at that count (a
    redraw of equal values at that count is the batch's too). And the last state's, for the cursor."""
    drawn = rows.group_by("state", maintain_order=True).agg(
        pl.col("step").first(), pl.concat_str("tag", pl.lit("="), pl.col("value").cast(pl.String)).str.join(",").alias("shows"), pl.col("own").first()
    )
    seed = pl.DataFrame({"state": [None], "step": [before[0] if before else None], "shows": [before[1] if before else None], "own": [False]}, schema=drawn.schema)
    both = pl.concat([seed, drawn])
    # (A state naming its own step is no count's update: its values go at that step.)
    update = (pl.col("step") != pl.col("step").shift(1)) & (pl.col("shows") == pl.col("shows").shift(1)) & ~pl.col("own")
    updates = both.filter(update.fill_null(False) & pl.col("state").is_not_null()).get_column("state")
    last = both.tail(1).row(0)
    return updates, [last[1], last[2]] if last[0] is not None else before


def _no_rows() -> pl.DataFrame:
    return table.empty_raw().with_columns(pl.lit(None, dtype=pl.Int64).alias("line_no"))


PROGRESS_BARS = LineFormat("progress_bars", parse, prefilter=PREFILTER, carriage=True)

_KERAS = re.compile(KERAS_BAR)
_COUNTLESS = re.compile(COUNTLESS)
_TQDM = re.compile(TQDM_BAR)


def _bar_line(line: str) -> bool:
    """A bar's state (sniffing cuts lines at carriage returns: one state a line)."""
    line = _COUNTLESS.sub(r"1/1 [=] - \1", line.replace("\b", ""))
    return bool(_TQDM.search(line) and "=" in line) or bool(_KERAS.search(line))


FORMAT = Format(reader=PROGRESS_BARS, line=_bar_line)
