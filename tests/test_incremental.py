"""Reading a file in one go, and reading it in many arbitrary pieces as it grows, give the same table;
judging a stream whole, and judging it pass by pass as it grows, give the same incidents: the daemon
and the audit must never disagree about what a log says."""

from __future__ import annotations

from itertools import pairwise
from pathlib import Path

import polars as pl
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from lossguard.ingest.cursor import Cursor
from lossguard.detection.engine import SCAN_NEEDS
from lossguard.detection.spikes import find_incidents
from lossguard.ingest.formats.sniff import format_of
from lossguard.detection.kinds import Rule
from lossguard.model import Incident
from lossguard.ingest.needs import Needs
from lossguard.ingest.reader import ReadOptions, read
from lossguard.detection.rules import default_rules, rule_from
from lossguard.ingest.sources.textfile import iter_blocks
from lossguard.detection.streams import collapse
from lossguard.ingest.table import Span, joined

from . import samples, synth
from .conftest import CORPUS
from .writers import write_tb1

OPTIONS = ReadOptions()


def _corpus_head(rel: str, size: int) -> bytes:
    return (CORPUS / rel).read_bytes()[:size]


TEXTS = {name: (fname, text.encode()) for name, (fname, text) in samples.ALL.items()}
TEXTS["megatron_real"] = ("perf.log", _corpus_head("megatron/bigscience_meg_ds_3d_gpt2_perf_n16_ds_off.log", 100_058))
TEXTS["lightning_real"] = ("metrics.csv", _corpus_head("csv/slm_training_lightning_v0_metrics.csv", 20_000))
TEXTS["llamafactory_real"] = ("trainer_log.jsonl", _corpus_head("jsonl/luojiu_7b_llamafactory_pretrain_trainer_log.jsonl", 30_000))
TEXTS["buildnanogpt_real"] = ("run.out", _corpus_head("other/build_nanogpt_agndm_bigger_254M.log", 40_000))
TEXTS["aligned_table"] = ("train_log.txt", "".join([f"{'step':>6} {'loss':>10} {'lr':>9}\n", *(f"{i:>6d} {2 + (i % 7) / 10:>10.4f} {1e-3:>9.1e}\n" for i in range(1, 400))]).encode())
# A Trainer logging every step faster than tqdm redraws: dicts spread between bars, refreshes awaited.
TEXTS["hf_console_fast"] = ("train_stdout.txt", samples.hf_trainer_console(synth.curves("clean", steps=300)).encode())


def _grow_and_read(path: Path, data: bytes, cuts: list[int], fmt: str) -> tuple[pl.DataFrame, Cursor]:
    path.write_bytes(b"")
    cursor = Cursor()
    frames = []
    for cut in [*sorted(set(cuts)), len(data)]:
        with open(path, "ab") as fh:
            fh.write(data[path.stat().st_size : cut])
        res = read(path, cursor, run="r", fmt=fmt, final=False, options=OPTIONS)
        assert res.problems == ()
        frames.append(res.frame)
        cursor = res.cursor
    res = read(path, cursor, run="r", fmt=fmt, final=True, options=OPTIONS)
    frames.append(res.frame)
    return pl.concat(frames), res.cursor


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=st.sampled_from(sorted(TEXTS)), fractions=st.lists(st.floats(0, 1), max_size=12))
def test_text_read_in_pieces_equals_read_in_one_go(tmp_path, name, fractions):
    fname, data = TEXTS[name]
    whole_path = tmp_path / f"whole-{fname}"
    whole_path.write_bytes(data)
    fmt = format_of(whole_path)
    assert fmt is not None
    whole = read(whole_path, run="r", fmt=fmt, final=True, options=OPTIONS)
    grown, cursor = _grow_and_read(tmp_path / fname, data, [int(f * len(data)) for f in fractions], fmt)
    assert whole.frame.height > 0
    assert grown.drop("source").equals(whole.frame.drop("source"))
    assert cursor.offset == len(data)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(fractions=st.lists(st.floats(0, 1), max_size=10))
def test_event_file_read_in_pieces_equals_read_in_one_go(tmp_path_factory, fractions):
    folder = tmp_path_factory.mktemp("tb")
    src = write_tb1(folder / "src", [(s, t, 1.0 / (s + 1)) for s in range(300) for t in ("loss", "lr")])
    data = src.read_bytes()
    whole = read(src, run="r", fmt="tfevents", final=True, options=OPTIONS)
    grown, cursor = _grow_and_read(folder / src.name, data, [int(f * len(data)) for f in fractions], "tfevents")
    assert grown.drop("source").equals(whole.frame.drop("source"))
    assert cursor.offset == len(data)


def test_cursor_survives_json_round_trip():
    cursor = Cursor(offset=10, line=3, index=2, last_step=7, header="a,b", skipping=True)
    assert Cursor.from_json(cursor.to_json()) == cursor


def _read_with_limit(path: Path, fmt: str, limit: int, *, needs: Needs | None = None) -> tuple[pl.DataFrame, int, Span | None]:
    """The pieces' tables together, how many reads it took, and the steps all the pieces covered."""
    cursor, frames, reads, spans = Cursor(), [], 0, []
    while True:
        res = read(path, cursor, run="r", fmt=fmt, final=False, options=OPTIONS, limit=limit, needs=needs)
        assert res.problems == ()
        frames.append(res.frame)
        spans.append(res.span)
        reads += 1
        assert res.cursor.offset - cursor.offset <= 2 * limit + 4096  # a bounded piece of the file per read
        if res.cursor.offset == cursor.offset:
            return pl.concat(frames), reads, joined(spans)
        cursor = res.cursor


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=st.sampled_from(sorted(TEXTS)), limit=st.integers(256, 20_000))
def test_text_read_a_limited_piece_at_a_time_equals_read_in_one_go(tmp_path, name, limit):
    fname, data = TEXTS[name]
    limit = max(limit, len(data) // 64)  # (at most ~64 reads a file: a 100 KB log in 256-byte reads cost seconds, and says no more)
    path = tmp_path / fname
    path.write_bytes(data)
    fmt = format_of(path)
    whole = read(path, run="r", fmt=fmt, final=False, options=OPTIONS)
    pieces, reads, span = _read_with_limit(path, fmt, limit)
    assert pieces.equals(whole.frame)
    assert reads >= len(data) // (2 * limit + 4096)
    # With scan's projection: the rows of the tags it judges, and the steps every row covered.
    kept = SCAN_NEEDS.keeper(OPTIONS.aliases)
    projected, _, projected_span = _read_with_limit(path, fmt, limit, needs=SCAN_NEEDS)
    assert projected.equals(whole.frame.filter(pl.col("tag").map_elements(kept, return_dtype=pl.Boolean)))
    assert projected_span == span == whole.span


def test_event_file_read_a_limited_piece_at_a_time_equals_read_in_one_go(tmp_path):
    src = write_tb1(tmp_path / "src", [(s, t, 1.0 / (s + 1)) for s in range(2000) for t in ("loss", "lr")])
    whole = read(src, run="r", fmt="tfevents", final=True, options=OPTIONS)
    pieces, reads, _ = _read_with_limit(src, "tfevents", 4096)
    assert pieces.equals(whole.frame) and reads > src.stat().st_size // (2 * 4096 + 4096)


def test_text_read_stops_at_the_size_the_file_had_when_opened(tmp_path):
    # A writer appending while blocks are parsed must not be chased a few lines at a time (each
    # costing a parse): what comes after the open is the next read's.
    path = tmp_path / "train.log"
    first = b"".join(b'{"step": %d, "loss": 2.0}\n' % s for s in range(50))
    path.write_bytes(first)
    blocks = iter_blocks(path, Cursor(), final=False, problems=[], block=256)
    seen = [next(blocks)]
    with open(path, "ab") as fh:
        fh.write(b"".join(b'{"step": %d, "loss": 2.0}\n' % s for s in range(50, 80)))
    seen += list(blocks)
    assert b"".join(b.data for b in seen) == first and seen[-1].cursor.offset == len(first)
    later = list(iter_blocks(path, seen[-1].cursor, final=False, problems=[]))
    assert later[0].data.count(b"\n") == 30 and later[0].first_line == 51


def test_event_read_stops_at_the_size_the_file_had_when_opened(tmp_path, monkeypatch):
    import lossguard.ingest.formats.tfevents as tfevents

    src = write_tb1(tmp_path / "src", [(s, "loss", 1.0) for s in range(200)])
    more = write_tb1(tmp_path / "more", [(s, "loss", 2.0) for s in range(200, 260)]).read_bytes()
    size = src.stat().st_size
    decode, appended = tfevents.decode, []

    def decode_while_the_writer_appends(*args, **kwargs):  # noqa: ANN002, ANN003
        if not appended:
            with open(src, "ab") as fh:
                fh.write(more)
            appended.append(True)
        return decode(*args, **kwargs)

    monkeypatch.setattr(tfevents, "decode", decode_while_the_writer_appends)
    res = read(src, run="r", fmt="tfevents", final=False, options=OPTIONS, limit=None)
    assert appended and res.cursor.offset == size
    assert res.frame.get_column("step").to_list() == list(range(200))
    rest = read(src, res.cursor, run="r", fmt="tfevents", final=True, options=OPTIONS)
    assert rest.frame.get_column("value").to_list()[-60:] == [2.0] * 60


def _stream(values: list[float]) -> pl.DataFrame:
    return collapse(pl.DataFrame({"step": range(1, len(values) + 1), "value": values}, schema={"step": pl.Int64, "value": pl.Float64}))


def _judged_in_passes(values: list[float], cuts: list[int], rule: Rule, *, spare: bool = True) -> list[Incident]:
    """What the daemon raises, pass by pass (lossguard.watch.tails: windows_of and kept_tails): each pass judges
    the stream's kept tail plus what arrived with the scan's own find_incidents, raises what is new and
    updates what it knows, then keeps as tail the rule's lookback plus the span of the incidents still
    open. `spare`: keep what the daemon keeps (at least 16, and 8 more); without it, the lookback
    alone, which must be enough."""
    points = _stream(values)
    known: dict[int, Incident] = {}
    tail, seen = points.head(0).select("step", "value"), 0
    need = max(rule.lookback, 16) + 8 if spare else rule.lookback
    for lo, hi in pairwise([0, *sorted(set(cuts)), len(values)]):
        if lo == hi:
            continue
        new = points.slice(lo, hi - lo).select("step", "value")
        window = collapse(pl.concat([tail, new]))
        for inc in find_incidents(window, rule, run="r", seen_before=seen - tail.height):
            if inc.step in known or inc.last_flagged_step >= new.get_column("step")[0]:
                known[inc.step] = inc
        still_open = [i.step for i in known.values() if i.end_step is None]
        keep = need + (window.filter(pl.col("step") >= min(still_open)).height if still_open else 0)
        tail, seen = window.tail(keep).select("step", "value"), seen + new.height
    return sorted(known.values(), key=lambda i: i.step)


def _walk(deltas: list[int]) -> list[float]:
    # Whole numbers: every window sum is exact, whatever row it starts from, so the two ways of judging
    # differ only in which points each judgement sees, which is what this test is about.
    values, level = [], 400
    for d in deltas:
        level = max(1, level + d)
        values.append(float(level))
    return values


KINDS_JUDGED_IN_PASSES = [
    {"kind": "slope", "window": 8},
    {"kind": "slope", "window": 30, "rate": 0.005},
    {"kind": "slope", "window": 5, "rate": 0.02, "min_history": 12, "recovery": 2},
    {"kind": "ratio", "factor": 1.1, "window": 5},
    # min_history below the window: short windows at the stream's start, full ones from a cut tail.
    {"kind": "ratio", "factor": 1.1, "window": 12, "min_history": 2},
    {"kind": "zscore", "k": 1.5, "window": 12, "min_history": 3},
    {"kind": "sustained", "factor": 1.05, "window": 8, "patience": 3},
    {"kind": "divergence", "factor": 1.05, "window": 12, "patience": 3, "noise": 0.5},
    {"kind": "divergence", "factor": 1.02, "window": 6, "patience": 2, "noise": 0.0, "min_history": 5},
]


@settings(max_examples=40, deadline=None)
@given(
    params=st.sampled_from(KINDS_JUDGED_IN_PASSES),
    deltas=st.lists(st.integers(-12, 30), min_size=20, max_size=160),
    fractions=st.lists(st.floats(0, 1), max_size=12),
)
# polars' rolling_std rounds by where it started: the tail's threshold was 400.34967936855884, the
# whole stream's ...5589 (the spread now comes from rolling sums, exact for whole numbers).
@example(params={"kind": "zscore", "k": 1.5, "window": 12, "min_history": 3}, deltas=[0] * 12 + [-1, 2] + [0] * 6, fractions=[0.75])
def test_judging_a_stream_pass_by_pass_raises_what_judging_it_whole_raises(params, deltas, fractions):
    rule = rule_from({"name": "r", "metric": "loss", **params})
    values = _walk(deltas)
    whole = find_incidents(_stream(values), rule, run="r")
    cuts = [int(f * len(values)) for f in fractions]
    assert _judged_in_passes(values, cuts, rule) == whole
    assert _judged_in_passes(values, cuts, rule, spare=False) == whole


def test_a_slow_climb_judged_pass_by_pass_is_the_incident_a_scan_reports():
    values = [400.0 - k for k in range(100)] + [300.0 * 1.03**k for k in range(1, 41)] + [300.0 * 1.03**40] * 40
    rule = rule_from({"name": "creep", "metric": "loss", "kind": "slope", "window": 20})
    (whole,) = find_incidents(_stream(values), rule, run="r")
    assert whole.end_step is not None
    assert _judged_in_passes(values, list(range(7, len(values), 7)), rule) == [whole]
    assert _judged_in_passes(values, list(range(7, len(values), 7)), rule, spare=False) == [whole]


def test_a_divergence_judged_pass_by_pass_is_the_incident_a_scan_reports():
    values = [400.0 - k for k in range(100)] + [300.0 * 1.08**k for k in range(1, 41)] + [300.0 * 1.08**40] * 40
    rule = next(r for r in default_rules().rules if r.name == "loss-divergence")
    (whole,) = find_incidents(_stream(values), rule, run="r")
    assert whole.end_step is None and whole.points > 1
    assert _judged_in_passes(values, list(range(7, len(values), 7)), rule) == [whole]
    assert _judged_in_passes(values, list(range(7, len(values), 7)), rule, spare=False) == [whole]


def test_a_limited_read_stays_within_its_limit_unless_not_one_whole_record_fits(tmp_path):
    """What keeps history apart from what followed it (the daemon caps a read at the size a file
    had at its first start): `limit` is a bound, not a hint; only when not one whole line or event
    record fits does the one across it come whole (a read must always make progress)."""
    from lossguard.ingest.reader import ReadOptions, read

    from .writers import write_tb1

    log = tmp_path / "metrics.jsonl"
    lines = [f'{{"step": {s}, "loss": {2 + s / 1000:.3f}}}\n' for s in range(1, 200)]
    log.write_text("".join(lines))
    width = len(lines[0])
    event = write_tb1(tmp_path / "tb", [(s, "loss", 2.0) for s in range(1, 200)])
    for path, fmt in ((log, "jsonl"), (event, "tfevents")):
        cursor, seen = Cursor(), []
        for limit in (10 * width + 3, 5, 1, 40 * width, 10 ** 9):
            res = read(path, cursor, run="r", fmt=fmt, final=False, options=ReadOptions(), limit=limit)
            consumed = res.cursor.offset - cursor.offset
            assert 0 < consumed <= max(limit, 2 * width), (fmt, limit, consumed)
            seen += res.frame.filter(pl.col("metric") == "loss").get_column("step").to_list()
            cursor = res.cursor
        assert seen == list(range(1, 200)) and cursor.offset == path.stat().st_size, fmt
