"""Step lines of `name value` pairs, as nanoGPT, build-nanogpt, llm.c and modded-nanogpt print them
(fairseq's look alike, but its validation lines need a reader of their own: fairseq.py):

    iter 100: loss 4.2345, time 12.3ms
    step    10 | loss: 9.44 | lr 9.2e-06 | norm: 3.56 | dt: 412.1ms
    step:1/20344 train_loss:22.62 train_time:123ms
    step:  10  loss:  8.1234  memory: 30.12GiB(31.72%)  tps: 1,234  mfu: 12.3%        (torchtitan)
    [Rank 0] step=10, skipped=0, lr=[9.9e-05, 9.9e-05], mom=[(0.9, 0.95)]          (DeepSpeed)
    epoch:        1 | nupdates:         1000 | lr: 0.100000 | ... | loss:   42.51234 | dev-clean-loss: ...
                                                                       (flashlight / wav2letter)

    s:120 trl:3.4012 lr:0.000600 norm:0.31                                   (llm.c's main.log)
    step:120 - actor/pg_loss:0.012 - actor/grad_norm:0.4 - critic/vf_loss:0.3            (verl)
    Steps 100, Rank 0, File 3, Epoch: [1/10][200/1000], Beta: 0.5, Loss: 8.43, kl_Loss: 1.2
    Epoch(train)  [1][ 200/735]  lr: 1.9870e-04  eta: 0:12:34  ...  grad_norm: 3.06  loss: 2.75
    Iter(train) [  200/80000]  lr: 1.0000e-02  ...  loss: 2.7522  decode.loss_ce: 2.7522    (mmengine)
    I0312 10:00:00.123456 140000 logging_writer.py:48] [120] learning_rate=0.001, loss=3.2 (clu)

A line is a record only if it names its step: banners, config dumps and `validation loss: 3.2`
lines without a step are noise here, and taking them would put numbers on made-up steps.
The step keys are `step`, `steps`, `iter`, `iteration`, `it`, `update`, `nupdates`, `num_updates`,
`global_step`; `epoch` is the step only in a file that has shown none of those (wav2letter before
it printed `nupdates`), and a warning says so: the first finer key seen makes `epoch` a plain value
again, and lines with nothing finer are then not records.
A line may instead name its step by a header (HEADER), where a step key on the same line wins:
llm.c's `s:N` opening the line; clu's `[N]` before `name=value` pairs; mmengine's loop
position, `Iter(train) [i/N]` (step i) or `Epoch(train) [E][i/N]`, whose i counts the batches of
epoch E, N of them an epoch, so the step is (E - 1) x N + i (mmengine/runner/log_processor.py:
get_log_after_iter). mmengine's `Epoch(val)`, `Iter(val)` and `(test)` lines count the batches of
the evaluation, not the training: their values are the evaluation's (tagged `val/...`, `test/...`,
so that a validation `loss` is an eval loss) at the step of the training line before them, and
before any they are not read.
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
from .sentences import BEING, worded

GROUPED = r"\d{1,3}(?:,\d{3})+(?:\.\d+)?\b"
CLOCK = r"(?:\d+ days?, )?\d+:\d\d:\d\d(?:\.\d+)?"
"""A duration or a time of day (mmengine's `eta: 1 day, 2:03:04`, flashlight's `runtime: 00:10:23`):
taken whole as a value no number is read from, where its first digits would be a made-up one."""
WRAPPED = r"(?:np\.\w+\(|numpy\.\w+\(|tensor\(|array\()?"
"""A number as repr() writes NumPy's and torch's (verl prints pprint.pformat(v): `np.float64(0.0123)`;
a 0-d array, `array(2.31, dtype=float32)`; a tensor, `tensor(2.31, device='cuda:0', grad_fn=...)`)."""
# A name is one word, or two (`train loss`, `val loss`): the qualifier decides which curve it is.
KEY_SEPARATOR = r"\s*[:=]\s*|\s+"
"""What stands between a name and its number (then maybe a `[`)."""
PAIR = (
    r"(?:^|[\s|,;\[(])(?P<key>(?:[A-Za-z_][\w./@-]* )?[A-Za-z_][\w./@-]*)(?:" + KEY_SEPARATOR + r")\[?" + WRAPPED + r"(?P<value>"
    + CLOCK + "|" + GROUPED + "|" + NUMBER + ")"
)
STEP_KEYS = ("step", "iter", "iteration", "num_updates", "global_step", "_step", "steps", "it", "nupdates", "update")
EPOCH = "epoch"
HEADER = (
    r"(?P<loop>Epoch|Iter)\((?P<mode>train|val|test)\)\s*(?:\[\s*(?P<epoch>\d+)\])?\[\s*(?P<i>\d+)/(?P<n>\d+)\]"
    r"|(?:^|[\s\]])\[(?P<bracket>\d+)\](?: collection=\S+)? [A-Za-z_][\w./-]*="
    r"|^s:(?P<s>\d+) "
    r"|(?:^|\s)(?P<timm>Train|Test): (?:(?P<t_epoch>\d+) )?\[\s*(?P<t_i>\d+)/(?P<t_n>\d+)[\] ]"
)
"""A step named by the line's head rather than by a key (see the module's docstring)."""
HEADER_HINT = r"\((?:train|val|test)\)|\[\d+\] |(?:Train|Test): (?:\d+ )?\[\s*\d"
"""What every HEADER match holds, but llm.c's (a line starting `s:`): lines without it (nearly all, in
most logs) skip the extraction. (`^s:` in the regex would cost more than the rest of it.)"""
EVALUATION = r"(?:Epoch|Iter)\((?:val|test)\)"
AT_STEP_BEFORE = EVALUATION + r"|(?:^|\s)Test: \[\s*\d"
"""Lines at the step of the training line before them (mmengine's and timm's evaluations): a file
holding one is read alone, where lines of many files are parsed together."""
# `steps` only as a record's own count (`Steps 100, ...`): a banner's `accumulation steps: 4` is none.
PREFILTER = r"(?i)\b(?:step|iter|iteration|num_updates|global_step|it|nupdates|update|epoch)\b|\bsteps\s+\d+,|OVERFLOW!|\[\d+\] |^s:\d|(?:Train|Test): (?:\d+ )?\[\s*\d"


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
    pairs = worded(lines, pairs)
    # `at step 20`, `global step 20`: a step key keeps its meaning whatever word stands before it.
    # (Decided once per distinct key: there are a handful, and millions of pairs.)
    keys = pairs.get_column("key").unique().to_list()
    renamed = {k: k.split()[-1] for k in keys if " " in k and k.split()[-1].lower() in (*STEP_KEYS, EPOCH)}
    if renamed:
        pairs = pairs.with_columns(pl.col("key").replace(renamed))
    located = [k for k in keys if _PRINTED_BY.match(k)]
    if located:
        pairs = pairs.filter(~pl.col("key").is_in(located))
    pairs = _evaluating(lines, pairs)
    headed, pairs = header_steps(lines, pairs, cursor)
    step_keys, steps = _step_keys([renamed.get(k, k) for k in keys], cursor, headed=headed is not None)
    if headed is not None:
        headed = _unkeyed(headed, pairs, step_keys)
    rows, state = records_to_rows(pairs, cursor, step_keys=step_keys, require_step=True, line_steps=headed)
    state = state.advance(steps=steps)
    if overflow.height:
        steps = rows.select("line_no", "step").unique("line_no", keep="last", maintain_order=True)
        rows = pl.concat([rows, overflow_rows(overflow, steps, cursor)], how="diagonal_relaxed").sort("line_no", maintain_order=True)
    return table.conform_raw(rows), state


# Who printed a line and where, not a metric: `file.py:96`, glog's `I0312 10:01:12.3 123 Train.cpp:580]`
# (its severity and date, then the source file), `[Rank 0]`, Ray's `(TaskRunner pid=123, ip=10.0.0.1)`.
_PRINTED_BY = re.compile(r"(?i)^(?:[\w./-]+\.(?:py|c|cc|cpp|cxx|cu|h|hpp)|rank|(?:\w+ )?pid|ip)$|^[IWEF]\d{4}$")


def header_steps(lines: pl.DataFrame, pairs: pl.DataFrame, cursor: Cursor) -> tuple[pl.DataFrame | None, pl.DataFrame]:
    """(line_no -> step of the lines a HEADER names the step of, or None when no line has one; the
    pairs, an evaluation line's tagged with its loop: `val/loss`). Only lines holding HEADER_HINT
    are looked at, and only the pairs of evaluation lines are touched."""
    text = pl.col("text")
    head = lines.filter(text.str.contains(HEADER_HINT) | text.str.starts_with("s:"))
    if not head.height:
        return None, pairs
    head = head.select("line_no", text.str.extract_groups(HEADER).alias("h")).unnest("h").filter(
        pl.col("mode").is_not_null() | pl.col("bracket").is_not_null() | pl.col("s").is_not_null() | pl.col("timm").is_not_null()
    )
    if not head.height:
        return None, pairs
    number = {c: pl.col(c).cast(pl.Int64, strict=False) for c in ("epoch", "i", "n", "bracket", "s", "t_epoch", "t_i", "t_n")}
    # timm's train.py: `Train: {epoch} [{update_idx}/{updates_per_epoch} (..%)]`, both counted from
    # 0, so the step is epoch x N + i; its `Test: [{batch_idx}/{last_idx}]` lines are the validation's.
    head = head.with_columns(pl.coalesce("mode", pl.when(pl.col("timm") == "Test").then(pl.lit("val")).when(pl.col("timm") == "Train").then(pl.lit("train"))).alias("mode"))
    timm = number["t_epoch"] * number["t_n"] + number["t_i"]
    trained = pl.when(pl.col("timm").is_not_null()).then(timm).when(number["epoch"].is_not_null()).then((number["epoch"] - 1) * number["n"] + number["i"]).otherwise(number["i"])
    own = pl.when(pl.col("mode") == "train").then(trained).otherwise(pl.coalesce(number["bracket"], number["s"]))
    evaluation = pl.col("mode").is_in(["val", "test"])
    named = head.filter(pl.col("s").is_not_null()).get_column("line_no")
    head_lines = head
    head = head.select(
        "line_no",
        # An evaluation line is at the training's step: the last one before it (or the cursor's).
        pl.when(evaluation).then(None).otherwise(own).forward_fill().fill_null(pl.lit(cursor.last_step, dtype=pl.Int64))
        .alias("step"),
        pl.when(evaluation).then(pl.col("mode")).alias("loop"),
    )
    loops = head.filter(pl.col("loop").is_not_null())
    if loops.height:
        pairs = _tag_evaluation(pairs, loops)
    if named.len():
        # llm.c's `s:N` is the header, not a metric.
        pairs = pairs.filter(~((pl.col("key") == "s") & pl.col("line_no").is_in(named.implode())))
    timm = head_lines.filter(pl.col("timm").is_not_null()).get_column("line_no")
    if timm.len():  # (timm's `Train: 3 [` and `Test: [1000/...]` are its header, not metrics)
        pairs = pairs.filter(~(pl.col("key").cast(pl.String).is_in(["Train", "Test"]) & pl.col("line_no").is_in(timm.implode())))
    return head.select("line_no", "step"), pairs


def _tag_evaluation(pairs: pl.DataFrame, loops: pl.DataFrame, *, steps: tuple[str, ...] = ()) -> pl.DataFrame:
    """An evaluation line's keys under its loop's name (`loss` -> `val/loss`), unless already so
    (mmengine prints a validation loss as `val/loss` in some versions), but for its `steps` keys."""
    tagged = pairs.join(loops, on="line_no", how="left", maintain_order="left")
    key = pl.col("key").cast(pl.String)
    return tagged.select(
        "line_no",
        pl.when(pl.col("loop").is_null() | key.str.starts_with(pl.col("loop") + "/") | key.str.to_lowercase().is_in(list(steps))).then(key)
        .otherwise(pl.col("loop") + "/" + key).cast(pl.Categorical).alias("key"),
        "value",
    )


EVALUATING = r"(?i)\b(?:eval|evaluation|evaluating|validation|validate|validating|val|test|testing)(?: [A-Za-z]+){0,3} (?:step|steps|iter|iteration|update)\b"
"""A line saying it reports an evaluation before it names its step: torchtitan's `validate step: 10
loss: 2.31` (torchtitan/components/metrics.py: log_validation), MaxText's `Completed eval after
train step 20, loss=2.5` (metric_logger.py: _log_eval_metrics). Its values are the evaluation's
(`val/loss`): taken for the training's, every eval loss above the training loss was a spike."""


def _evaluating(lines: pl.DataFrame, pairs: pl.DataFrame) -> pl.DataFrame:
    """The pairs, an evaluation line's (EVALUATING) tagged `val/...`, its step key left as it is."""
    found = lines.filter(pl.col("text").str.contains(EVALUATING)).get_column("line_no")
    if not found.len():
        return pairs
    loops = pl.DataFrame({"line_no": found, "loop": pl.repeat("val", found.len(), eager=True, dtype=pl.String())})
    return _tag_evaluation(pairs, loops, steps=(*STEP_KEYS, EPOCH))


def _unkeyed(headed: pl.DataFrame, pairs: pl.DataFrame, step_keys: tuple[str, ...]) -> pl.DataFrame:
    """The header steps of lines that name no step by a key: a key says it more plainly (clu's
    `[N]` could be anyone's counter)."""
    names = [k for k in pairs.get_column("key").unique().to_list() if k is not None and k.lower() in step_keys]
    if not names:
        return headed
    keyed = pairs.filter(pl.col("key").is_in(names)).get_column("line_no").unique()
    return headed.filter(~pl.col("line_no").is_in(keyed.implode()))


def _step_keys(keys: list[str], cursor: Cursor, *, headed: bool = False) -> tuple[tuple[str, ...], str | None]:
    """The keys naming a line's step in this block, and what the cursor keeps of the choice:
    `fine` once a finer key than the epoch (or a header's step) was seen, `epoch` while the epoch
    is all there is."""
    if headed or cursor.steps == "fine" or any(k.lower() in STEP_KEYS for k in keys):
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
    # A line's rows are its own (a record names its step), but for DeepSpeed's OVERFLOW lines and
    # mmengine's evaluation lines, which take the step of the record before them: a file holding
    # one is read alone.
    together=Together(
        lambda lines: lines.select((pl.col("text").str.contains("OVERFLOW!", literal=True) | pl.col("text").str.contains(AT_STEP_BEFORE)).alias("alone")),
        settles=_settles,
    ),
)

# `epoch` only with an explicit separator (`epoch: 1`, `epoch=1`): fairseq's `epoch 001 |` is fairseq's.
# mmengine's training lines only: its evaluation lines alone hold no training curve.
_STEP = re.compile(
    r"(?i:(?:^|[\s|,;\[(])(?:(?:step|iter|iteration|num_updates|global_step|nupdates|update)(?:\s*[:=]\s*|\s+)|epoch\s*[:=]\s*)\d"
    r"|\bsteps\s+\d+,)|(?:Epoch|Iter)\(train\)\s*\[|(?:^|[\s\]])\[\d+\](?: collection=\S+)? [A-Za-z_][\w./-]*=|^s:\d+ |(?:^|\s)Train: \d+ \[\s*\d+/\d+"
)
# A loss by any name the vocabulary knows for one: llm.c's `trl` (train loss) and `tel` (eval loss).
_LOSS = re.compile(r"(?i)(?:^|[\s|,;\[(])(?:[\w./-]*loss[\w./-]*|trl|tel)(?:\s*[:=]\s*|\s+(?:" + BEING + r"\s+)?)\[?" + WRAPPED + r"[-+\d.nNiI]")


def _kv_line(line: str) -> bool:
    """A step and a loss, as `name value` pairs. A quoted metric name makes the line a dict's, which
    this reader would not read anyway (a name here is bare)."""
    return bool(_STEP.search(line) and _LOSS.search(line)) and not METRIC_ITEM.search(line)


FORMAT = Format(reader=KV_LINES, line=_kv_line)
