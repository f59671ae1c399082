"""The fast path for line formats must give exactly what the regex path gives, line for line: it may
change speed, never results. Each sample is repeated past the fast path's threshold, with a few odd
lines mixed in that must fall back to the regex path."""

from __future__ import annotations

import json

import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lossguard.ingest import table
from lossguard.ingest.cursor import Cursor
from lossguard.ingest.formats import base, dictlines, fastpath
from lossguard.ingest.formats.dictlines import parse, parse_json
from lossguard.ingest.formats.kvlines import parse as parse_kv
from lossguard.ingest.formats.megatron import CELL
from lossguard.ingest.formats.megatron import parse as parse_megatron
from lossguard.ingest.reader import ReadOptions, read


ODD = {
    "jsonl": ['{"step": 7, "loss": 1.5, "note": "a, b", "lr": 0.1}', '{"step": 8, "nested": {"loss": 2.0}, "lr": 0.2}', '{"step": 9, "loss": null, "lr": NaN}'],
    "hf_console": [
        "{'eval_loss': 2.0, 'epoch': 0.5}", "{'loss': nan, 'grad_norm': np.float64(3.5), 'learning_rate': 1e-05, 'epoch': 0.6}",
        "{'loss': 1.5, 'grad_norm': 2.5, 'learning_rate': 4.9e-05, 'epoch': 3, 'extra': 4.0}",
    ],
    "kv": [
        "step 12 | loss: 9.1 | lr 9e-06 | norm: 3.1 | dt: 412.1ms | note", "step 13 | val loss: 8.8",
        "step 14 | loss: 9.0 | lr 9.2e-06 | norm: 1.0 | dt: 412.1ms | tok/sec: 1493812.55 | mfu: 40.1",
    ],
    "megatron": [" iteration      300/   1000 | lm loss: 5.0E+00 | grad norm: 1.5 | extra field: 3 |"],
}
BASE = {
    "jsonl": ('{"step": %d, "loss": %f, "lr": 1e-4, "grad_norm": %f, "tag": "x"}', parse_json),
    "hf_console": ("{'loss': %f, 'grad_norm': %f, 'learning_rate': 4.9e-05, 'epoch': %d}", parse),
    "kv": ("step %d | loss: %f | lr 9.2e-06 | norm: %f | dt: 412.1ms | tok/sec: 1493812.55", parse_kv),
    "megatron": (" iteration %8d/ 1000000 | learning rate: 1.000E-04 | lm loss: %E | loss scale: 4096.0 | grad norm: %f | number of skipped iterations:   0 |", parse_megatron),
}


def _lines(kind: str) -> pl.DataFrame:
    template, _ = BASE[kind]
    texts = []
    for i in range(3000):
        if kind in ("jsonl", "kv", "megatron"):
            texts.append(template % (i, 2.0 + i * 1e-4, 1.0 + (i % 7) * 0.1))
        else:
            texts.append(template % (2.0 + i * 1e-4, 1.0 + (i % 7) * 0.1, i))
        if i % 400 == 17:
            texts.extend(ODD[kind])
    return pl.DataFrame({"line_no": range(1, len(texts) + 1), "text": texts}, schema={"line_no": pl.Int64, "text": pl.String})


@pytest.mark.parametrize("kind", sorted(BASE))
def test_fast_path_gives_what_the_regex_path_gives(kind, monkeypatch):
    _, parse_fn = BASE[kind]
    lines = _lines(kind)
    raw = ("\n".join(lines.get_column("text")) + "\n").encode()
    fast_rows, fast_cursor = parse_fn(lines, Cursor(), raw)
    # The fast path really took the bulk of the lines (else this test would compare the slow path with itself).
    seen = []

    def spy(real):
        def counted(*args, **kwargs):
            pairs, rest = real(*args, **kwargs)
            seen.append(pairs.get_column("line_no").n_unique())
            return pairs, rest

        return counted

    for module in ("dictlines", "kvlines"):
        monkeypatch.setattr(f"lossguard.ingest.formats.{module}.fast_pairs", spy(fastpath.fast_pairs))

    def wide_spy(real):
        def counted(*args, **kwargs):
            wide, rest = real(*args, **kwargs)
            seen.append(len(wide.line_no))
            return wide, rest

        return counted

    monkeypatch.setattr("lossguard.ingest.formats.dictlines.json_wide", wide_spy(fastpath.json_wide))
    monkeypatch.setattr("lossguard.ingest.formats.megatron.fast_wide", wide_spy(fastpath.fast_wide))
    monkeypatch.setattr("lossguard.ingest.formats.dictlines.fast_wide", wide_spy(fastpath.fast_wide))
    parse_fn(lines, Cursor(), raw)
    assert max(seen) > 2900
    monkeypatch.setattr(fastpath, "MIN_LINES", 10**9)
    slow_rows, slow_cursor = parse_fn(lines, Cursor(), raw)
    assert slow_rows.height > 3000
    assert fast_rows.equals(slow_rows)
    assert fast_cursor == slow_cursor


CLEAN_JSONL = {
    "every line stepped": ['{"step": %d, "loss": %f, "lr": 1e-4, "grad_norm": %f, "tokens": 5}'],
    "a line with no metric": ['{"step": %d, "loss": %f, "grad_norm": %f}', '{"step": 5}'],
    "steps going back, quoted values": ['{"step": %d, "loss": "%f", "grad_norm": %f}', '{"step": 3, "loss": 9.0}'],
    "a step that is no step": ['{"step": %d, "loss": %f, "grad_norm": %f}', '{"step": -4, "loss": 1.0}'],
    "two step keys": ['{"step": %d, "global_step": 7, "loss": %f, "grad_norm": %f}'],
    "a summary line": ['{"step": %d, "loss": %f, "grad_norm": %f}', '{"step": 9, "train_runtime": 1.0, "loss": 2.0}'],
    "fairseq's update count": ['{"step": %d, "loss": %f, "grad_norm": %f}', '{"epoch": 1, "valid_loss": 5.0, "valid_num_updates": 40}'],
    "no step key": ['{"iter_time": %d, "loss": %f, "grad_norm": %f}'],
}


SHORT_WAY = {"every line stepped", "a line with no metric", "steps going back, quoted values"}
dictlines_stepped_rows = dictlines.stepped_rows


@pytest.mark.parametrize("case", sorted(CLEAN_JSONL))
def test_json_lines_that_all_parse_give_what_the_regex_path_gives(case, monkeypatch):
    """Blocks the NDJSON reader reads whole, where lines naming their step take the short way to rows."""
    template, *odd = CLEAN_JSONL[case]
    texts = []
    for i in range(3000):
        texts.append(template % (i, 2.0 + i * 1e-4, 1.0 + (i % 7) * 0.1))
        if i % 700 == 5:
            texts.extend(odd)
    lines = pl.DataFrame({"line_no": range(1, len(texts) + 1), "text": texts}, schema={"line_no": pl.Int64, "text": pl.String})
    raw = ("\n".join(texts) + "\n").encode()
    assert not fastpath.json_wide(lines, raw=raw)[1].height  # every line read by the NDJSON reader
    cursor = Cursor(index=4, last_step=2)
    direct = []
    monkeypatch.setattr(dictlines, "stepped_rows", lambda *a: direct.append(dictlines_stepped_rows(*a)) or direct[-1])
    fast_rows, fast_cursor = parse_json(lines, cursor, raw)
    # Blocks whose every line names one usable step take the short way; the others go through rows_of.
    assert (direct[0] is not None) == (case in SHORT_WAY)
    monkeypatch.setattr(fastpath, "MIN_LINES", 10**9)
    slow_rows, slow_cursor = parse_json(lines, cursor, raw)
    assert slow_rows.height > 3000
    assert fast_rows.equals(slow_rows)
    assert fast_cursor == slow_cursor


def test_split_lines_keeps_blank_lines_numbered():
    lines, problem = base.split_lines(b"a\n\nb\r\n", 5, source="x")
    assert lines.rows() == [(5, "a"), (6, ""), (7, "b")]
    assert problem is None


def wide_jsonl(path, *, lines: int = 2000, new_keys: int = 10) -> None:
    """A JSON-lines log whose every line brings keys no other line has (per-sample or per-layer
    metrics logged under fresh names): 2,000 lines hold 20,000 distinct keys."""
    with path.open("w") as fh:
        for i in range(lines):
            record = {"step": i + 1, "loss": 2.0 + (i % 13) / 100, **{f"m{i}_{j}": i + j / 10 for j in range(new_keys)}}
            fh.write(json.dumps(record) + "\n")


def test_a_log_whose_lines_each_bring_new_keys_reads_every_row(tmp_path):
    # Before the NDJSON path refused sparse frames this read took minutes (a column for each of the
    # 10,000 keys inferred, its schema rebuilt per column): the size is what would show it again.
    path = tmp_path / "wide.jsonl"
    wide_jsonl(path)
    result = read(path, run="r", fmt="jsonl", final=True, options=ReadOptions())
    assert not result.problems
    loss = result.frame.filter(pl.col("metric") == "loss")
    assert loss.get_column("step").to_list() == list(range(1, 2001))
    assert loss.get_column("value").to_list() == [2.0 + (i % 13) / 100 for i in range(2000)]
    others = result.frame.filter(pl.col("metric") != "loss")
    assert others.height == 20_000 and others.get_column("tag").n_unique() == 20_000
    last = others.filter(pl.col("step") == 2000).sort("tag")
    assert last.select("tag", "value").rows() == [(f"m1999_{j}", 1999 + j / 10) for j in range(10)]


# Cells as Megatron prints them, and the odd ones a real log holds: a unit after the number, nan,
# a field that is no pair, a name that changed, a missing or extra field.
MEGATRON_CELLS = st.lists(
    st.sampled_from([
        "lm loss: 2.5E+00", "lm loss: nan", "lm loss: 3.1E+00s", "lm loss: -", "learning rate: 1.0E-04", "learning rate: 7",
        "grad norm: 0.95", "grad norm: inf", "loss scale: 4096.0", "consumed samples: 512", "num zeros: 0.0",
        "elapsed time per iteration (ms): 812.3", "note", "lm loss 2.0", "lm loss: 1 | grad norm: 2",
    ]),
    min_size=0, max_size=5,
)
TYPICAL = ["consumed samples: 512", "learning rate: 1.0E-04", "lm loss: 2.5E+00", "loss scale: 4096.0", "grad norm: 0.95"]
# Lines of the typical shape whose numbers are odd or missing: they fit the shape, and a line whose
# kept fields hold no number is a record only through its other fields.
VALUES = st.sampled_from(["2.5E+00", "nan", "-inf", "3.1E+00s", "-", "", "1,000", "(7)", "0"])
TYPICAL_ODD = st.lists(VALUES, min_size=5, max_size=5).map(lambda vs: [c.split(": ")[0] + ": " + v for c, v in zip(TYPICAL, vs)])
# Lines of the typical shape whose cells are spaced otherwise (a field left out is first checked on
# its cell as cut, for the representative's spacing), or whose key runs on past the typical one.
TYPICAL_SPACED = st.lists(st.sampled_from(["", " ", "   ", "\t", "x"]), min_size=5, max_size=5).map(
    lambda pads: [(c.replace(":", p + ":") if p == "x" else p + c + p[:1]) for p, c in zip(pads, TYPICAL)]
)
# Lines of the typical shape where a field a projection leaves out holds a kept key instead: the
# regex path finds that pair too, so the line is not of the shape.
TYPICAL_SWAPPED = st.tuples(st.sampled_from([0, 1, 3]), st.sampled_from(["lm loss: 9.0", " grad norm: 1.5", "lm loss: x"])).map(
    lambda swap: [swap[1] if i == swap[0] else c for i, c in enumerate(TYPICAL)]
)


def _megatron_lines(odd: list[tuple[int, list[str]]], n: int) -> pl.DataFrame:
    texts = [" | ".join([f" iteration {i:8d}/ 1000", *TYPICAL]) + " |" for i in range(1, n + 1)]
    for at, cells in odd:
        texts[at % n] = " | ".join([f" iteration {at % n + 1:8d}/ 1000", *cells]) + " |"
    return pl.DataFrame({"line_no": range(1, n + 1), "text": texts}, schema={"line_no": pl.Int64, "text": pl.String})


KEEPS = {"all": None, "loss and grad norm": lambda k: k in ("lm loss", "grad norm"), "nothing": lambda k: False}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(odd=st.lists(st.tuples(st.integers(0, 10**6), MEGATRON_CELLS | TYPICAL_ODD | TYPICAL_SPACED | TYPICAL_SWAPPED), max_size=8), n=st.integers(1, 40), keep=st.sampled_from(sorted(KEEPS)))
def test_fast_pairs_with_a_projection_give_the_kept_pairs_of_the_regex_path_and_every_line_with_any(odd, n, keep):
    from lossguard.ingest.formats.megatron import CELL, PAIR
    from lossguard.ingest.formats.pairs import merged, pairs_frame

    lines = _megatron_lines(odd, n)
    kept = KEEPS[keep]
    fast, rest = fastpath.fast_pairs(lines, sep="|", cell_re=CELL, first_field_free=True, one_pair_per_field=True, keep=kept, min_lines=0)
    got = merged(fast, pairs_frame(rest, PAIR))
    want = pairs_frame(lines, PAIR)
    # Lines that hold pairs are the same lines (each is a record, kept or not)...
    assert got.get_column("line_no").unique().sort().to_list() == want.get_column("line_no").unique().sort().to_list()
    # ...and the kept keys' pairs are the same pairs, in the same order.
    wanted = [k for k in want.get_column("key").unique().to_list() if kept is None or kept(k)]
    pick = pl.col("key").cast(pl.String).is_in(wanted)
    assert got.filter(pick).with_columns(pl.col("key").cast(pl.String)).equals(want.filter(pick).with_columns(pl.col("key").cast(pl.String)))


def test_a_field_left_out_holding_a_kept_key_sends_its_line_to_the_regex_path():
    lines = _megatron_lines([(7, ["grad norm: 1.5", *TYPICAL[1:]]), (9, ["lm loss: 9.0", *TYPICAL[1:]])], 20)
    fast, rest = fastpath.fast_pairs(lines, sep="|", cell_re=CELL, first_field_free=True, one_pair_per_field=True, keep=KEEPS["loss and grad norm"], min_lines=0)
    assert rest.get_column("line_no").to_list() == [8, 10]
    assert fast.get_column("line_no").unique().sort().to_list() == [i for i in range(1, 21) if i not in (8, 10)]


def test_lines_spaced_otherwise_in_a_field_left_out_stay_on_the_fast_path():
    spaced = [[pad + c + pad for c in TYPICAL] for pad in ("", "   ")]
    lines = _megatron_lines([(3, spaced[0]), (5, spaced[1])], 20)
    fast, rest = fastpath.fast_pairs(lines, sep="|", cell_re=CELL, first_field_free=True, one_pair_per_field=True, keep=KEEPS["loss and grad norm"], min_lines=0)
    assert rest.height == 0
    assert fast.filter(pl.col("line_no").is_in([4, 6])).select(pl.col("key").cast(pl.String), "value").rows() == [("lm loss", 2.5), ("grad norm", 0.95)] * 2


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(odd=st.lists(st.tuples(st.integers(0, 10**6), MEGATRON_CELLS | TYPICAL_ODD | TYPICAL_SPACED | TYPICAL_SWAPPED), max_size=8), n=st.integers(200, 260), keep=st.sampled_from(sorted(KEEPS)))
def test_a_megatron_parse_told_what_is_kept_gives_the_kept_rows_of_a_full_parse(odd, n, keep):
    lines = _megatron_lines(odd, n)
    cursor = Cursor(index=3, last_step=0)
    kept = KEEPS[keep] or (lambda k: True)
    narrow_rows, narrow_cursor = parse_megatron(lines, cursor, None, keep=kept)
    full_rows, full_cursor = parse_megatron(lines, cursor, None)
    assert narrow_cursor == full_cursor
    assert table.span_of(narrow_rows) == table.span_of(full_rows)
    assert base.kept_rows(narrow_rows, kept).equals(base.kept_rows(full_rows, kept))


_ITERATION_PARTS = st.sampled_from([
    "iteration", " iteration", "[default7]: iteration", "xiteration", "é iteration", "iteration\t", "/", " / ", "/ ", "\t/", " ", "   ",
    "12", "0", "+3", "-4", "٣", "99999999999999999999", " | lm loss: 2.0 |", "validation loss at iteration 5", "a/b", "é",
])


@settings(max_examples=300, deadline=None)
@given(lines=st.lists(st.lists(_ITERATION_PARTS, max_size=9).map("".join), min_size=1, max_size=30))
def test_megatron_steps_read_without_the_regex_are_the_regex_steps_or_left_to_it(lines):
    """The quick read of an iteration line's step gives the ITERATION regex's step, or null (the
    regex then decides); on a log's usual lines, it gives them all."""
    from lossguard.ingest.formats.megatron import ITERATION, iteration_steps

    usual = [f" iteration {i:8d}/ 1000000 | lm loss: 2.0 |" for i in range(3)]
    frame = pl.DataFrame({"text": lines + usual})
    quick = iteration_steps(frame)
    regex = frame.select(pl.col("text").str.extract(ITERATION, 1).cast(pl.Int64, strict=False)).to_series()
    read = quick.is_not_null()
    assert quick.filter(read).to_list() == regex.filter(read).to_list()
    assert quick.tail(3).to_list() == [0, 1, 2]


_HF_LINES = st.sampled_from([
    "  3%|▎         | {n}/300 [00:03<01:30,  3.20it/s]",
    "  3%|▎         | {n}/300 [00:03<01:30,  3.20it/s]{{'loss': 2.3, 'grad_norm': 1.25, 'learning_rate': 4.9e-05, 'epoch': 0.{n}}}",
    "{{'loss': 2.{n}, 'learning_rate': 4.9e-05, 'epoch': 0.{n}}}",
    " 50%|█████     | {n}/20 [00:01<00:01,  9.00it/s]",
    "{{'eval_loss': 2.05, 'eval_runtime': 1.2, 'epoch': 0.{n}}}",
    "{{'loss': 2.1, 'epoch': 0.5}}  3%|▎         | {n}/300 [00:03<01:30,  3.20it/s]",
    "  Num update steps per epoch = 1{n}",
    "  Num Epochs = 3",
    "  Total optimization steps = 3{n}0",
    "{{'train_runtime': 100.1, 'train_loss': 2.0, 'epoch': 1.0}}",
    "  0%|          | 0/300 [00:00<?, ?it/s]{{'loss': 2.5, 'epoch': 0.0}}",
    # tqdm.write's refresh of the dict before, then a redraw: two bars before the dict.
    "  3%|▎         | {n}/300 [00:03<01:30,  3.20it/s]\r  4%|▍         | 1{n}/300 [00:04<01:30,  3.20it/s]\r    \r{{'loss': 2.2, 'epoch': 0.{n}}}",
])


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    lines=st.lists(st.tuples(_HF_LINES, st.integers(0, 400)), max_size=40),
    counting=st.booleans(),
    last=st.one_of(st.none(), st.integers(0, 50)),
    bar=st.one_of(st.none(), st.integers(0, 50)),
    total=st.sampled_from([None, 300, 20]),
    spread=st.sampled_from([(None, 0, None, False), (40, 2, 3.0, True), (None, 4, None, True), (60, 0, 1.0, False)]),
)
def test_hf_steps_read_in_columns_are_the_loops(monkeypatch, lines, counting, last, bar, total, spread):
    """The training dicts' steps from the bars, read in columns, are the loop's (which settles any
    block where one dict would not take the bar's count); `counting`: the usual console, each dict
    after a redraw counting up; `spread`: the anchor, the dicts since it, the interval and an
    awaited refresh a cursor carries (dicts spread between bars)."""
    from lossguard.ingest.formats import hf_console

    if counting:
        lines = [(template, 100 + 3 * i) for i, (template, _) in enumerate(lines)]
    frame = pl.DataFrame({"line_no": list(range(1, len(lines) + 1)), "text": [t.format(n=n) for t, n in lines]}, schema={"line_no": pl.Int64, "text": pl.String})
    anchor, since, interval, refresh = spread
    cursor = Cursor().advance(last_step=last, bar=bar, bar_total=total, anchor=anchor, since=since, interval=interval, refresh=refresh)
    pairs = dictlines.python_pairs(frame)
    steps, evals, state = hf_console._steps(frame, hf_console._records(pairs), cursor)
    with monkeypatch.context() as loop:
        loop.setattr(hf_console, "_placed_by_bars", lambda marked, cursor: None)
        want_steps, want_evals, want_state = hf_console._steps(frame, hf_console._records(pairs), cursor)
    assert steps.equals(want_steps) and evals.equals(want_evals) and state == want_state


_BAR_PARTS = st.sampled_from(["3%", "100%", "%", "|", "▎", "███", " ", "\t", "12", "/", "300", " [", "[", "00:03<01:30", "{'loss': 2.0}", "x", "\u2003"])


@settings(max_examples=300, deadline=None)
@given(texts=st.lists(st.lists(_BAR_PARTS, max_size=14).map("".join), min_size=1, max_size=20))
def test_hf_bar_counts_cut_by_hand_are_the_bar_regex_groups(texts):
    from lossguard.ingest.formats.hf_console import BAR, _count_and_total, _last_count

    frame = pl.DataFrame({"text": texts + ["  3%|▎         | 10/300 [00:03<01:30,  3.20it/s]"]})
    by_hand = frame.select(_last_count(pl.col("text")).alias("bar")).select(*_count_and_total("bar"))
    groups = frame.select(pl.col("text").str.extract_all(BAR).list.last().str.extract_groups(BAR).alias("g")).select(
        pl.col("g").struct.field("1").cast(pl.Int64).alias("bar_n"), pl.col("g").struct.field("2").cast(pl.Int64).alias("bar_total")
    )
    assert by_hand.equals(groups)
    assert by_hand.row(-1) == (10, 300)



@settings(max_examples=150, deadline=None)
@given(texts=st.lists(st.lists(_BAR_PARTS, max_size=14).map("".join), min_size=1, max_size=20))
def test_hf_first_bars_taken_from_the_last_on_lines_with_one_bar_are_every_line_s_own(texts):
    """The loop's first bars and bar counts (_firsts runs BAR again only on lines with two `%|`)
    are what BAR's matches on every line give, wherever the loop reads them."""
    from lossguard.ingest.formats.hf_console import BAR, _count, _count_and_total, _firsts, _marked, _parts

    bar = "  3%|▎         | 10/300 [00:03<01:30,  3.20it/s]"
    texts = texts + [bar + "\r" + bar.replace("10/", "11/"), "{'loss': 2.0}" + bar + bar]
    lines = pl.DataFrame({"line_no": range(len(texts)), "text": texts}, schema={"line_no": pl.Int64, "text": pl.Utf8})
    head, tail = _parts()
    every = lines.select(head.str.extract_all(BAR).alias("head"), tail.str.extract_all(BAR).alias("tail")).select(
        _count(pl.col("head").list.first()).alias("hfirst"), _count(pl.col("tail").list.first()).alias("tfirst"),
        pl.col("head").list.len().alias("head_k"), pl.col("tail").list.len().alias("tail_k"),
    ).select(*_count_and_total("hfirst"), *_count_and_total("tfirst"), "head_k", "tail_k")
    got = _firsts(lines, _marked(lines))
    # The loop reads a part's first bar and count only when the part drew a bar (its last's total).
    for part, first in (("head", "hfirst"), ("tail", "tfirst")):
        read = [f"{first}_n", f"{first}_total", f"{part}_k"]
        drawn = got.get_column(f"{part}_total").is_not_null()
        assert got.filter(drawn).select(read).equals(every.filter(drawn).select(read))
    assert got.select(every.columns).rows()[-2:] == [(10, 300, None, None, 2, 0), (None, None, 10, 300, 0, 2)]


# nanoGPT / build-nanogpt key-value cells, and odd ones: a unit that eats an `inf`'s word boundary,
# a bracket the regex allows no space after, spacing, two pairs in a cell, a number that carries on.
KV_TYPICAL = ["step {i:6d}", "loss: 2.5", "lr 3.0e-04", "norm: 1.05", "dt: 351.23ms", "tok/sec: 1493812.55", "ver: 1.2.3"]
KV_CELLS = st.sampled_from([
    "dt: infms", "dt: nanms", "dt: 12ms", "dt:351ms", "dt :  4.5ms", "dt: 1e3ms", "loss: inf", "loss:nan", "loss:  -2",
    "loss: [ 2", "loss: [2", "loss: [3", "loss: [  4", "lr  1e-3", "lr3", "lr: 5", "norm: 1 x: 2", "norm: 5 dt: 3ms", "norm: 1.5.5", "ver: 5.3",
    "ver: 7.2.3", "ver: 1.2.3.3", "tok/sec: +5", "tok/sec: Infinity", "tok/sec: 1,234", "loss: 2.5 ", "note", "",
    # Sentences (formats/sentences.py): a verb of being, a number counting its unit, a word no name ends with.
    "Loss is 2.5", "loss is 7", "Current learning rate is 0.01", "rate was 3", "Trained 128 records in 0.5 seconds",
    "Throughput is 256.0 records/second", "dt 3 seconds", "dt: 3 seconds", "loss 2.5 samples 1280", "records in 0.5",
])


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(odd=st.lists(st.tuples(st.integers(0, 10**6), st.integers(1, 6), KV_CELLS), max_size=12), n=st.integers(1, 40), version=st.booleans(),
       first=st.lists(st.tuples(st.integers(1, 6), KV_CELLS), max_size=2))
def test_kv_fast_pairs_give_the_regex_paths_pairs(odd, n, version, first):
    """(`version`: a field whose unit could carry a number on, which no quick read takes; `first`:
    odd cells on the first line, the one the shape is read from.)"""
    from lossguard.ingest.formats.kvlines import KEY_SEPARATOR, PAIR
    from lossguard.ingest.formats.pairs import merged, pairs_frame

    typical = KV_TYPICAL if version else KV_TYPICAL[:-1]
    rows = [[c.format(i=i) for c in typical] for i in range(1, n + 1)]
    for at, field, cell in [*odd, *((0, field, cell) for field, cell in first)]:
        rows[at % n][field % len(typical)] = cell
    lines = pl.DataFrame({"line_no": range(1, n + 1), "text": [" | ".join(r) for r in rows]}, schema={"line_no": pl.Int64, "text": pl.String})
    fast, rest = fastpath.fast_pairs(lines, sep="|", cell_re=PAIR, separator=KEY_SEPARATOR, min_lines=0)
    got = merged(fast, pairs_frame(rest, PAIR)).with_columns(pl.col("key").cast(pl.String))
    want = pairs_frame(lines, PAIR).with_columns(pl.col("key").cast(pl.String))
    assert got.equals(want)
    # What kv_lines reads of them: the sentences' rules applied to either path's pairs alike.
    from lossguard.ingest.formats.sentences import worded

    as_read = [worded(lines, p.with_columns(pl.col("key").cast(pl.Categorical()))).with_columns(pl.col("key").cast(pl.String)) for p in (got, want)]
    assert as_read[0].equals(as_read[1])


@pytest.mark.parametrize(
    "first, other",
    [
        pytest.param("loss: [2", "loss: [  4", id="a bracket allows no space after it"),
        pytest.param("ver: 1.2.3", "ver: 5.3", id="a unit that would carry the number on"),
        pytest.param("dt: 3ms", "dt: infms", id="inf before a unit has no word boundary"),
        pytest.param("lr 3", "lr  nan", id="spacing alone as the separator"),
    ],
)
def test_kv_fast_pairs_read_the_cells_the_regex_reads_differently_as_it_does(first, other):
    from lossguard.ingest.formats.kvlines import KEY_SEPARATOR, PAIR
    from lossguard.ingest.formats.pairs import merged, pairs_frame

    texts = [f"step {i} | loss: 2.5 | {first if i % 2 else other} | norm: 1.0" for i in range(1, 9)]
    lines = pl.DataFrame({"line_no": range(1, 9), "text": texts}, schema={"line_no": pl.Int64, "text": pl.String})
    fast, rest = fastpath.fast_pairs(lines, sep="|", cell_re=PAIR, separator=KEY_SEPARATOR, min_lines=0)
    assert fast.height  # the lines like the first took the fast path
    assert merged(fast, pairs_frame(rest, PAIR)).equals(pairs_frame(lines, PAIR))


# What may follow a cell's mark, as the lean read (fastpath._lean) meets it: spacing of every kind
# before and after the number, numbers the cast and the regex read alike or not, units, words
# that run on from `inf`, strip characters before and after the number.
_AFTER_MARK = st.lists(
    st.sampled_from([
        " ", "  ", "\t", "\u00a0", "\u2003", "2.5", "-3", "+4", "1E+05", "1.", ".5", "inf", "nan", "Infinity", "infinit", "x", "s", "ms",
        "_0", "0x1", "١", "1,000", "e", ".", ":", "=", "}", "{", ")", "'", "(7)", "--1", "|",
    ]),
    max_size=5,
).map("".join)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(odd=st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 4), _AFTER_MARK), max_size=10), n=st.integers(1, 30), keep=st.sampled_from(sorted(KEEPS)))
def test_megatron_cells_read_lean_give_the_regex_paths_pairs(odd, n, keep):
    """A needed field's number is read off its cell as cut, past the representative's key and mark:
    wherever it reads one, it is the regex's."""
    from lossguard.ingest.formats.megatron import PAIR
    from lossguard.ingest.formats.pairs import merged, pairs_frame

    rows = [list(TYPICAL) for _ in range(n)]
    for at, field, after in odd:
        rows[at % n][field] = rows[at % n][field].split(":")[0] + ":" + after
    lines = pl.DataFrame(
        {"line_no": range(1, n + 1), "text": [" | ".join([f" iteration {i:8d}/ 1000", *r]) + " |" for i, r in enumerate(rows, 1)]},
        schema={"line_no": pl.Int64, "text": pl.String},
    )
    kept = KEEPS[keep]
    fast, rest = fastpath.fast_pairs(lines, sep="|", cell_re=CELL, first_field_free=True, one_pair_per_field=True, keep=kept, min_lines=0)
    got = merged(fast, pairs_frame(rest, PAIR)).with_columns(pl.col("key").cast(pl.String))
    want = pairs_frame(lines, PAIR).with_columns(pl.col("key").cast(pl.String))
    assert got.get_column("line_no").unique().sort().equals(want.get_column("line_no").unique().sort())
    wanted = [k for k in want.get_column("key").unique().to_list() if kept is None or kept(k)]
    assert got.filter(pl.col("key").is_in(wanted)).equals(want.filter(pl.col("key").is_in(wanted)))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
# (A cell ending in `{`, which no dict writes, the dict path has always read as the cell regex reads
# it, stripped, where the line's regex finds no pair: not the lean read's to settle.)
@given(odd=st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 3), _AFTER_MARK.filter(lambda s: "{" not in s)), max_size=10), n=st.integers(1, 30))
def test_hf_dict_cells_read_lean_give_the_regex_paths_pairs(odd, n):
    """The same for HF's dicts, whose last cell ends in the dict's `}` (a strip character)."""
    from lossguard.ingest.formats.pairs import merged, pairs_frame

    keys = ["loss", "grad_norm", "learning_rate", "epoch"]
    rows = [[" 2.5", " 1.25", " 4.9e-05", " 0.01"] for _ in range(n)]
    for at, field, after in odd:
        rows[at % n][field] = after
    texts = ["{" + ", ".join(f"'{k}':{v}" for k, v in zip(keys, r)) + "}" for r in rows]
    lines = pl.DataFrame({"line_no": range(1, n + 1), "text": texts}, schema={"line_no": pl.Int64, "text": pl.String})
    fast, rest = fastpath.fast_pairs(lines, sep=",", cell_re=dictlines.CELL, strip=" {}", one_pair_per_field=True, min_lines=0)
    got = merged(fast, pairs_frame(rest, dictlines.PAIR)).with_columns(pl.col("key").cast(pl.String))
    want = pairs_frame(lines, dictlines.PAIR).with_columns(pl.col("key").cast(pl.String))
    assert got.equals(want)


@settings(max_examples=200, deadline=None)
@given(
    parts=st.lists(
        st.tuples(
            st.sampled_from(["", " ", "  ", "x", "\t", "é", "[default7]: "]),
            st.sampled_from([" ", "   ", "\t", "", "\u2003", " \u2003"]),
            st.sampled_from(["12", "0", "٣", "+3", "99999999999999999999", "", "1 2"]),
            st.sampled_from(["/", " /", "/ ", "/\t", ""]),
            st.sampled_from(["5", " 5", "x", "", " ", "\u20035", "٣", "  5"]),
            st.sampled_from(["", " | lm loss: 2.0 |", " iteration 7/ 8 |"]),
        ).map(lambda p: p[0] + "iteration" + "".join(p[1:])),
        min_size=1,
        max_size=30,
    )
)
def test_megatron_steps_of_lines_starting_with_the_word_are_the_regex_steps_or_left_to_it(parts):
    """The anchored read of a line that starts with `iteration` (megatron.USUAL_ITERATION) gives
    ITERATION's step wherever it gives one: every spacing, digit and prefix it must not take."""
    from lossguard.ingest.formats.megatron import ITERATION, iteration_steps

    frame = pl.DataFrame({"text": parts})
    quick = iteration_steps(frame)
    regex = frame.select(pl.col("text").str.extract(ITERATION, 1).cast(pl.Int64, strict=False)).to_series()
    read = quick.is_not_null()
    assert quick.filter(read).to_list() == regex.filter(read).to_list()


_BETWEEN = st.sampled_from([
    " validation loss at iteration 100 | lm loss value: 3.2E+00 | lm loss PPL: 2.4E+01 |",
    "[deepscale] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 1048576, reducing to 524288",
])


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(
    odd=st.lists(st.tuples(st.integers(0, 10**6), TYPICAL_ODD), max_size=8),
    between=st.lists(st.tuples(st.integers(0, 10**6), _BETWEEN), max_size=3),
    n=st.integers(200, 240),
    keep=st.sampled_from(sorted(KEEPS)),
    cursor=st.sampled_from([Cursor(), Cursor(index=3, last_step=0)]),
)
def test_megatron_iteration_lines_that_all_fit_give_the_regex_paths_rows(monkeypatch, odd, between, n, keep, cursor):
    """Blocks whose iteration lines all take the fast path, whose rows come straight from the
    wide pairs (megatron._iteration_rows), with odd numbers, lines whose kept fields hold none, and
    validation and OVERFLOW lines among them."""
    from lossguard.ingest.formats import megatron

    lines = _megatron_lines([(at % (n - 1) + 1, cells) for at, cells in odd], n)  # the first line, typical, says the shape
    texts = lines.get_column("text").to_list()
    for at, text in sorted(between, reverse=True):
        texts.insert(at % n + 1, text)
    lines = pl.DataFrame({"line_no": range(1, len(texts) + 1), "text": texts}, schema={"line_no": pl.Int64, "text": pl.String})
    kept = KEEPS[keep]
    short = []
    with monkeypatch.context() as spied:
        spied.setattr(megatron, "_iteration_rows", lambda *a: short.append(megatron_iteration_rows(*a)) or short[-1])
        fast_rows, fast_cursor = parse_megatron(lines, cursor, None, keep=kept)
    assert short and short[0] is not None
    with monkeypatch.context() as slow:
        slow.setattr(fastpath, "MIN_LINES", 10**9)
        slow_rows, slow_cursor = parse_megatron(lines, cursor, None, keep=kept)
    assert fast_cursor == slow_cursor
    kept = kept or (lambda k: True)
    assert base.kept_rows(fast_rows, kept).equals(base.kept_rows(slow_rows, kept))


from lossguard.ingest.formats.megatron import _iteration_rows as megatron_iteration_rows  # noqa: E402


_STEP_SPELLINGS = st.sampled_from(dictlines.STEP_KEYS).flatmap(
    lambda key: st.lists(st.booleans(), min_size=len(key), max_size=len(key)).map(lambda up: "".join(c.upper() if u else c for c, u in zip(key, up)))
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    items=st.lists(
        st.tuples(st.sampled_from(["'", '"']), _STEP_SPELLINGS | st.sampled_from(["loss", "stp", "it", "epoch"]), st.sampled_from(["true", "'abc'", "5", "None"])),
        min_size=1, max_size=3,
    ),
)
def test_step_keys_holding_no_number_are_found_in_the_lines_the_step_names_let_through(monkeypatch, items):
    """rows_of asks STEP_ITEM only of lines holding a step key's name (STEP_NAME), in any case: the
    lines it finds unplaceable are those the regex finds over every line."""
    text = "{" + ", ".join(f"{q}{k}{q}: {v}" for q, k, v in items) + ", 'loss': 2.5}"
    lines = pl.DataFrame({"line_no": [1, 2], "text": ["{'loss': 1.0}", text]}, schema={"line_no": pl.Int64, "text": pl.String})
    pairs = dictlines.python_pairs(lines)
    got = dictlines.rows_of(lines, pairs, Cursor())
    with monkeypatch.context() as every:
        every.setattr(dictlines, "STEP_NAME", "")  # every line searched
        want = dictlines.rows_of(lines, pairs, Cursor())
    assert got[0].equals(want[0]) and got[1] == want[1]


_HF_VALUES = st.sampled_from(["2.5", "nan", "np.float64(3.5)", "-", "1e-05", "'x'", "inf"])


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(
    n=st.integers(200, 230),
    odd=st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 3), _HF_VALUES), max_size=8),
    bars=st.lists(st.tuples(st.integers(0, 10**6), st.sampled_from(["none", "same", "zero", "back"])), max_size=3),
    cursor=st.sampled_from([
        Cursor(), Cursor(index=3, last_step=2, bar=2, bar_total=9000), Cursor(last_step=5000),
        Cursor(index=5, last_step=8, bar_total=9000, anchor=4, since=1, interval=4.0, refresh=True),
    ]),
    bare=st.tuples(st.integers(0, 10**6), st.sampled_from([None, "an epoch only", "no pair"])),
)
def test_hf_blocks_of_placed_training_dicts_give_the_long_ways_rows(monkeypatch, n, odd, bars, cursor, bare):
    """Blocks whose lines are all training dicts after their bar, whose rows come straight from the
    wide pairs (hf_console._placed_rows): odd numbers, values that are no pair, and bars that do not
    place a dict (none drawn, not redrawn, a count of 0 or going back), which the long way settles."""
    from lossguard.ingest.formats import hf_console

    counts = [10 + 3 * i for i in range(n)]
    values = [["2.5", "1.25", "4.9e-05", "0.01"] for _ in range(n)]
    drawn = [True] * n
    for at, field, value in odd:
        values[at % (n - 1) + 1][field] = value  # the first line, typical, says the shape
    if bare[1]:
        values[bare[0] % (n - 1) + 1] = ["-", "'x'", "-", "0.02" if bare[1] == "an epoch only" else "-"]
    for at, how in bars:
        i = at % n
        if how == "none":
            drawn[i] = False
        else:
            counts[i] = {"same": counts[i - 1], "zero": 0, "back": 1}[how]
    texts = [
        (f" 50%|█████     | {c}/9000 [00:10<01:30,  3.00it/s]\r" if d else "") + f"{{'loss': {v[0]}, 'grad_norm': {v[1]}, 'learning_rate': {v[2]}, 'epoch': {v[3]}}}"
        for c, v, d in zip(counts, values, drawn)
    ]
    lines = pl.DataFrame({"line_no": range(1, n + 1), "text": texts}, schema={"line_no": pl.Int64, "text": pl.String})
    short = []
    real = hf_console._placed_rows
    with monkeypatch.context() as spied:
        spied.setattr(hf_console, "_placed_rows", lambda *a: short.append(real(*a)) or short[-1])
        fast_rows, fast_cursor = hf_console.parse(lines, cursor)
    with monkeypatch.context() as slow:
        slow.setattr(fastpath, "MIN_LINES", 10**9)
        slow_rows, slow_cursor = hf_console.parse(lines, cursor)
    assert fast_cursor == slow_cursor
    assert fast_rows.equals(slow_rows)
    if not bars and not bare[1] and cursor.last_step is None:
        assert short and short[0] is not None  # the usual block took the short way
