"""Bad input: at most one clear problem per file, naming it (and the line or offset); the other files
are still read; nothing raises out of the reader."""

from __future__ import annotations

import json
import os

import polars as pl
import pytest

from hypothesis import given, settings
from hypothesis import strategies as st

from lossguard.ingest.cursor import Cursor
from lossguard.errors import UsageError
from lossguard.ingest.reader import ReadOptions, read, read_paths
from lossguard.ingest.formats import base
from lossguard.ingest.sources import textfile

from . import samples
from .conftest import assert_one_error_line, run_lossguard

GOOD = samples.JSONL


def _with_good(tmp_path):
    (tmp_path / "good.jsonl").write_text(GOOD)


def _good_rows(frame):
    return frame.filter(pl.col("source").str.ends_with("good.jsonl")).height


def test_empty_file_is_not_an_error(tmp_path):
    _with_good(tmp_path)
    (tmp_path / "empty.log").write_bytes(b"")
    frame, _, problems = read_paths([tmp_path])
    assert _good_rows(frame) == 13
    assert [str(p) for p in problems] == [f"{tmp_path / 'empty.log'}: empty file: no records"]


def test_an_empty_event_file_is_a_problem_not_a_run_of_no_steps(tmp_path):
    (tmp_path / "run1").mkdir()
    (tmp_path / "run1" / "events.out.tfevents.1700000000.host").write_bytes(b"")
    frame, results, problems = read_paths([tmp_path])
    assert frame.height == 0
    assert [str(p) for p in problems] == [f"{tmp_path / 'run1' / 'events.out.tfevents.1700000000.host'}: empty file: no records"]


def test_empty_files_are_neither_sniffed_nor_parsed_and_their_warnings_are_summarised(tmp_path, monkeypatch):
    _with_good(tmp_path)
    for i in range(50):
        (tmp_path / f"job{i:02d}.log").write_bytes(b"")
    (tmp_path / "notes.txt").write_bytes(b"")  # a name that promises no metrics: no warning

    real = ReadOptions.format_of

    def only_the_good_one(self, path):
        assert path.stat().st_size, f"{path} is empty: nothing to sniff"
        return real(self, path)

    monkeypatch.setattr(ReadOptions, "format_of", only_the_good_one)
    frame, _, problems = read_paths([tmp_path])
    assert _good_rows(frame) == 13
    assert [str(p) for p in problems] == [
        *(f"{tmp_path / f'job{i:02d}.log'}: empty file: no records" for i in range(3)),
        f"{tmp_path}: ... and 47 more file(s) in this folder: empty file: no records",
    ]


@pytest.mark.parametrize("command", ["scan", "read"])
@pytest.mark.parametrize("kind", ["fifo", "/dev/zero"])
def test_a_path_that_is_no_file_or_folder_is_refused_without_opening_it(tmp_path, command, kind):
    if kind == "fifo":
        path = tmp_path / "train.log"
        os.mkfifo(path)  # opening it for reading would block until a writer came: the timeout shows it
    else:
        path = kind
    res = run_lossguard(command, str(path), timeout=30)
    assert_one_error_line(res, f"{path}: not a regular file or folder")


def test_binary_garbage_with_a_log_name_gives_one_problem(tmp_path):
    _with_good(tmp_path)
    (tmp_path / "train.log").write_bytes(os.urandom(50_000) + b"\x00" * 10)
    frame, _, problems = read_paths([tmp_path])
    assert _good_rows(frame) == 13
    assert len(problems) == 1 and "train.log" in str(problems[0])


def _holed(text: str, hole_at: int) -> bytes:
    """A log as a crashed node's file system leaves it: a lost write's bytes read back as NULs, and
    the writer restarted after them (so the line after the hole is glued to it)."""
    lines = text.encode().splitlines(keepends=True)
    return b"".join(lines[:hole_at]) + b"\x00" * 6000 + b"".join(lines[hole_at:])


def test_nul_bytes_in_the_head_of_a_log_skip_their_line_not_the_file(tmp_path):
    # The first 8 KiB holds the hole: the file used to be unrecognised whole.
    path = tmp_path / "train.log"
    path.write_bytes(_holed(samples.FAIRSEQ_LEGACY, 6))
    frame, results, problems = read_paths([path])
    assert results[0].format == "fairseq"
    # The hole swallowed the start of line 7 (a running average printed mid-validation); the rest is read.
    assert [s for s, v in frame.filter(pl.col("metric") == "loss").select("step", "value").rows()] == [100, 200, 2000, 2100]
    assert [(p.line, p.message) for p in problems] == [
        (7, "NUL or other binary bytes in a text log; this line is skipped, the rest of the file is read")
    ]


@pytest.mark.parametrize("small_block", [True, False], ids=["lines cut in Python", "lines cut by polars"])
def test_binary_lines_are_counted_in_one_warning_naming_the_first(tmp_path, monkeypatch, small_block):
    if not small_block:
        monkeypatch.setattr(base, "SMALL_BLOCK", 0)
    lines = [f"step {i} | loss: {3 - i / 100:.2f} | lr 1e-4".encode() for i in range(1, 41)]
    lines[9] = b"\x00\x00\x00\x00" + lines[9]
    lines[19] = lines[19] + b"\x01\x7f\x02"
    path = tmp_path / "train.log"
    path.write_bytes(b"\n".join(lines) + b"\n")
    frame, results, problems = read_paths([path])
    assert results[0].format == "kv_lines"
    steps = frame.filter(pl.col("metric") == "loss").get_column("step").to_list()
    assert steps == [i for i in range(1, 41) if i not in (10, 20)]
    assert [(p.line, p.message) for p in problems] == [
        (10, "NUL or other binary bytes in a text log; this line is skipped (and 1 more line(s) like it), the rest of the file is read")
    ]


def test_a_binary_file_with_a_log_name_is_still_unrecognised(tmp_path):
    # A checkpoint, an archive: lines of binary, not a log with a few damaged lines.
    path = tmp_path / "train.log"
    path.write_bytes(bytes(range(256)) * 40 + b"\nstep 1 | loss: 2.0\n")
    _, results, problems = read_paths([path])
    assert results[0].format is None
    assert [p.message for p in problems] == ["no training metrics recognised in this file"]


def test_non_utf8_bytes_are_reported_with_their_line_and_the_rest_is_read(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(b'{"step": 1, "loss": 2.0}\n{"step": 2, "loss": 1.9, "x": "\xff\xfe"}\n{"step": 3, "loss": 1.8}\n')
    frame, _, problems = read_paths([path])
    assert frame.filter(pl.col("metric") == "loss").get_column("step").to_list() == [1, 2, 3]
    assert len(problems) == 1 and problems[0].line == 2 and "UTF-8" in problems[0].message


def test_overlong_line_is_skipped_with_one_problem(tmp_path, monkeypatch):
    monkeypatch.setattr(textfile, "MAX_LINE", 1000)
    monkeypatch.setattr(textfile, "BLOCK", 256)
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(b'{"step": 1, "loss": 2.0}\n' + b"x" * 5000 + b'\n{"step": 2, "loss": 1.9}\n')
    problems = []
    blocks = list(textfile.iter_blocks(path, Cursor(), final=True, problems=problems, block=256, max_line=1000))
    text = b"".join(b.data for b in blocks).decode()
    assert '"step": 1' in text and '"step": 2' in text and "xxx" not in text
    assert len(problems) == 1 and problems[0].line == 2
    assert blocks[-1].cursor.offset == path.stat().st_size


def test_fifty_megabyte_line_without_newline_is_not_buffered_forever(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(b'{"step": 1, "loss": 2.0}\n' + b"y" * (50 << 20))
    res = read(path, Cursor(), run="r", fmt="jsonl", final=False, options=ReadOptions())
    assert res.frame.height == 1
    assert len(res.problems) == 1 and "longer than" in res.problems[0].message
    assert res.cursor.skipping and res.cursor.offset == path.stat().st_size
    with open(path, "ab") as fh:
        fh.write(b'yyy\n{"step": 2, "loss": 1.5}\n')
    again = read(path, res.cursor, run="r", fmt="jsonl", final=False, options=ReadOptions())
    assert again.frame.select("step", "value").rows() == [(2, 1.5)]
    assert again.problems == ()


def test_vanished_file_is_one_problem(tmp_path):
    path = tmp_path / "gone.jsonl"
    res = read(path, Cursor(), run="r", fmt="jsonl", final=True, options=ReadOptions())
    assert res.frame.height == 0
    assert [p.message for p in res.problems] == ["file vanished before it could be read"]


def test_permission_denied_is_one_problem(tmp_path, monkeypatch):
    # Tests run as root in CI, where chmod 000 does not deny anything: make open() refuse instead.
    path = tmp_path / "locked.jsonl"
    path.write_text(GOOD)
    real_open = open

    def refusing_open(file, *args, **kwargs):
        if str(file) == str(path):
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr("builtins.open", refusing_open)
    res = read(path, Cursor(), run="r", fmt="jsonl", final=True, options=ReadOptions())
    assert [str(p) for p in res.problems] == [f"{path}: permission denied"]


def test_symlink_loop_under_the_root_ends_the_walk(tmp_path):
    run = tmp_path / "runs" / "a"
    run.mkdir(parents=True)
    (run / "metrics.jsonl").write_text(GOOD)
    (run / "loop").symlink_to(tmp_path / "runs", target_is_directory=True)
    frame, results, problems = read_paths([tmp_path / "runs"])
    assert len(results) == 1
    assert frame.height == 13
    assert len(problems) == 1 and "loop" in problems[0].message


def test_duplicate_and_backward_steps_are_all_kept_in_file_order(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(f'{{"step": {s}, "loss": {v}}}\n' for s, v in [(1, 3.0), (2, 2.9), (2, 2.9), (3, 2.8), (2, 2.95), (3, 2.85)]))
    frame, _, problems = read_paths([path])
    assert frame.select("step", "value").rows() == [(1, 3.0), (2, 2.9), (2, 2.9), (3, 2.8), (2, 2.95), (3, 2.85)]
    assert problems == []


def test_path_that_does_not_exist_is_a_usage_error(tmp_path):
    with pytest.raises(UsageError, match="no such file or folder"):
        read_paths([tmp_path / "nope"])


def test_a_rewritten_lightning_csv_is_read_again_without_repeating_rows(tmp_path):
    path = tmp_path / "metrics.csv"
    path.write_text("epoch,step,train_loss_step\n0,1,3.0\n0,2,2.9\n")
    first = read(path, Cursor(), run="r", fmt="csv", final=False, options=ReadOptions())
    assert first.frame.filter(pl.col("metric") == "loss").select("step", "value").rows() == [(1, 3.0), (2, 2.9)]
    # Lightning saw a new metric: it rewrites the file with a wider header.
    path.write_text("epoch,step,train_loss_step,val_loss\n0,1,3.0,\n0,2,2.9,\n0,3,2.8,\n0,3,,2.7\n")
    second = read(path, first.cursor, run="r", fmt="csv", final=False, options=ReadOptions())
    assert second.frame.filter(pl.col("metric") != "epoch").select("step", "metric", "value").rows() == [(3, "loss", 2.8), (3, "eval_loss", 2.7)]
    assert len(second.problems) == 1 and "rewritten" in second.problems[0].message


def test_half_written_trainer_state_waits_until_complete(tmp_path, corpus):
    src = (corpus / "hf_trainer/t5_summarization_trainer_state.json").read_bytes()
    path = tmp_path / "trainer_state.json"
    path.write_bytes(src[: len(src) // 2])
    res = read(path, Cursor(), run="r", fmt="hf_trainer_state", final=False, options=ReadOptions())
    assert res.frame.height == 0 and res.problems == () and res.cursor == Cursor()
    path.write_bytes(src)
    res = read(path, res.cursor, run="r", fmt="hf_trainer_state", final=False, options=ReadOptions())
    assert res.frame.filter(pl.col("metric") == "loss").height == 430
    again = read(path, res.cursor, run="r", fmt="hf_trainer_state", final=False, options=ReadOptions())
    assert again.frame.height == 0


def test_only_the_newest_hf_checkpoint_state_is_read(tmp_path, corpus):
    src = (corpus / "hf_trainer/t5_summarization_trainer_state.json").read_text()
    for n in (500, 1000, 1500):
        (tmp_path / "out" / f"checkpoint-{n}").mkdir(parents=True)
        (tmp_path / "out" / f"checkpoint-{n}" / "trainer_state.json").write_text(src)
    frame, results, _ = read_paths([tmp_path])
    assert [r.found.path.parent.name for r in results] == ["checkpoint-1500"]
    assert set(frame.get_column("run")) == {"out"}


def test_a_unit_separator_byte_in_a_line_neither_crashes_nor_cuts_the_line(tmp_path):
    # The CSV reader that cuts big blocks into lines splits on \x1f: a line holding one would have
    # lost its tail, or (first line) failed the whole read.
    path = tmp_path / "metrics.jsonl"
    good = b"".join(b'{"step": %d, "loss": 2.0}\n' % s for s in range(2, 20_000))
    path.write_bytes(b'{"step": 1, "loss": 2.0}\x1f junk\n' + good + b'{"step": 20000, "x": "\x1f", "loss": 3.0}\n')
    assert path.stat().st_size > base.SMALL_BLOCK
    frame, _, problems = read_paths([path])
    loss = frame.filter(pl.col("metric") == "loss")
    assert loss.get_column("step").to_list() == list(range(1, 20_001)) and loss.get_column("value")[-1] == 3.0
    assert problems == []


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(st.binary(max_size=12), st.sampled_from([b"\r", b"\n", b"\r\n", b"\xef\xbb\xbf", b"\xff", b"\xc3", b"\xf0\x9f\x98", b'"', b"\x00", b"\xe2\x82\xac"])), max_size=30))
def test_small_blocks_are_cut_into_the_lines_the_csv_reader_makes(pieces):
    data = b"".join(pieces).replace(b"\x1f", b"") + b"\n"
    small, small_problem = base.split_lines(data, 7, source="f")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(base, "SMALL_BLOCK", 0)
        big, big_problem = base.split_lines(data, 7, source="f")
    assert small.equals(big), (data, small.rows(), big.rows())
    assert small_problem == big_problem


def test_a_reader_failing_on_unforeseen_content_is_one_problem_and_the_other_files_are_read(tmp_path, monkeypatch):
    _with_good(tmp_path)
    bad = tmp_path / "other" / "train.log"
    bad.parent.mkdir()
    bad.write_text("iter 1 loss 2.0\n")
    split = base.split_lines

    def failing(data, first_line, *, source):  # noqa: ANN001, ANN202
        if source == str(bad):
            raise pl.exceptions.ComputeError("unforeseen\ndetails")
        return split(data, first_line, source=source)

    monkeypatch.setattr(base, "split_lines", failing)
    frame, _, problems = read_paths([tmp_path])
    assert _good_rows(frame) == 13
    assert len(problems) == 1 and str(bad) in str(problems[0]) and "unforeseen" in str(problems[0]) and "details" not in str(problems[0])


def test_a_csv_line_no_reader_can_parse_costs_that_line_only(tmp_path):
    # A quote then a carriage return inside a field: polars refuses the block and the stdlib reader
    # refused it whole too ("new-line character seen in unquoted field"), crashing the read.
    path = tmp_path / "metrics.csv"
    rows = ["step,train_loss,lr"] + [f"{s},{2.0 + s / 1000:.4f},0.001" for s in range(1, 50)]
    rows[20] = '20,2.0"\r,0.001'
    path.write_text("\n".join(rows) + "\n")
    frame, _, problems = read_paths([path])
    steps = frame.filter(pl.col("metric") == "loss").get_column("step").to_list()
    assert steps == [s for s in range(1, 50) if s != 20]
    assert len(problems) == 1 and problems[0].line == 21 and "metrics.csv" in str(problems[0])


def test_scan_reports_a_file_its_reader_fails_on_and_audits_the_other_runs(tmp_path, monkeypatch, capsys):
    from lossguard.cli import main
    from lossguard.ingest.formats import dictlines

    (tmp_path / "good").mkdir()
    (tmp_path / "good" / "train.log").write_text("".join(f"iter {s}: loss {9.0 if s == 30 else 2.0}\n" for s in range(1, 40)))
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "metrics.jsonl").write_text('{"step": 1, "loss": 2.0}\n')
    def failing(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202 - a reader bug nobody foresaw
        raise ValueError("unforeseen")

    monkeypatch.setattr(dictlines, "json_wide", failing)  # only the JSON lines reader calls it
    code = main(["scan", str(tmp_path), "--format", "json"])
    out = capsys.readouterr()
    report = json.loads(out.out)
    assert code == 1  # spikes found
    assert [r["run"] for r in report["runs"] if r["spikes"]] == ["good"]
    assert "unforeseen" in out.out + out.err and "metrics.jsonl" in out.out + out.err


@pytest.mark.parametrize("filler", [0, 3000], ids=["regex path", "fast path"])
def test_a_step_that_is_no_step_skips_that_line_with_one_summarised_problem(tmp_path, filler):
    # Each of these once took the step of the line before it: its loss was put where it never was.
    bad = ['{"step": true, "loss": 9.0}', '{"step": 9223372036854775808, "loss": 9.1}', '{"step": 1e400, "loss": 9.2}', '{"step": -5, "loss": 9.3}']
    good = [json.dumps({"step": s, "loss": 1.0 + s / 10_000}) for s in range(1, filler + 3)]
    path = tmp_path / "m.jsonl"
    path.write_text("\n".join([*good[:2], *bad, *good[2:], '{"loss": 1.5}']) + "\n")
    frame, _, problems = read_paths([path])
    loss = frame.filter(pl.col("metric") == "loss")
    assert loss.get_column("value").max() < 9.0
    assert loss.height == len(good) + 1  # the stepless last line still takes the step before it
    assert [str(p) for p in problems] == [
        f"{path}:3: step is not a whole number from 0 to 2^63-1; this line's values are skipped (and 3 more line(s) like it)"
    ]


def test_a_hundred_thousand_bad_steps_are_one_problem_with_the_count(tmp_path):
    path = tmp_path / "train.log"
    path.write_text("step 1 | loss: 2.0\n" + "step 99999999999999999999 | loss: 3.0\n" * 100_000)
    frame, _, problems = read_paths([path])
    assert frame.get_column("step").to_list() == [1]
    assert [str(p) for p in problems] == [f"{path}:2: step is not a whole number from 0 to 2^63-1; this line's values are skipped (and 99,999 more line(s) like it)"]


@pytest.mark.parametrize("start", [b"x^", b"x\x01", b"x\x9c", b"x\xda", b"\x1f\x8b", b"\x28\xb5\x2f\xfd"])
def test_a_big_block_that_starts_like_compressed_data_is_still_read_as_lines(start):
    # polars' CSV reader takes these starts for zlib/gzip/zstd and decompresses the block to nothing.
    data = start + b" first\n" + b"iter 1 loss 2.0\n" * (base.SMALL_BLOCK // 16 + 10)
    lines, _ = base.split_lines(data, 1, source="f")
    assert lines.height == data.count(b"\n") and lines.get_column("text")[1] == "iter 1 loss 2.0"


def test_a_trainer_state_nested_past_what_json_follows_is_one_warning_not_a_reader_failure(tmp_path, corpus):
    """Python's json raises RecursionError some 1,000 levels down, which the reader's boundary took
    for a bug of ours ('please report it') and read the file no more: it is JSON it cannot read, and
    a state rewritten whole at the next checkpoint is read then."""
    src = json.loads((corpus / "hf_trainer/t5_summarization_trainer_state.json").read_text())
    path = tmp_path / "trainer_state.json"
    path.write_text(json.dumps(src)[:-1] + ', "deep": ' + "[" * 5000 + "]" * 5000 + "}")
    assert read(path, Cursor(), run="r", fmt="hf_trainer_state", final=False, options=ReadOptions()).problems == ()
    res = read(path, Cursor(), run="r", fmt="hf_trainer_state", final=True, options=ReadOptions())
    assert [p.message for p in res.problems] == ["not a readable trainer_state.json: nested too deep"] and not res.dead
    path.write_text(json.dumps(src))
    assert read(path, res.cursor, run="r", fmt="hf_trainer_state", final=False, options=ReadOptions()).frame.filter(pl.col("metric") == "loss").height == 430


def test_a_trainer_state_over_the_document_bound_is_refused_reading_no_more_than_the_bound(tmp_path, monkeypatch):
    """A sparse file of 1 TiB named trainer_state.json: refused with one line after reading the bound
    and a byte (set to 1 MiB here; 256 MiB by default), and not read again."""
    from lossguard.ingest import bounds

    monkeypatch.setattr(bounds, "MAX_DOCUMENT", 1 << 20)
    path = tmp_path / "trainer_state.json"
    with open(path, "wb") as fh:
        fh.truncate(1 << 40)
    res = read(path, Cursor(), run="r", fmt="hf_trainer_state", final=False, options=ReadOptions())
    assert [p.message for p in res.problems] == ["a trainer_state.json over 1 MiB: not read"] and res.dead


def test_a_json_line_nested_a_million_deep_costs_no_other_line(tmp_path):
    """JSON lines are parsed by polars and lossguard's own patterns, not Python's json: a line of a
    value nested 1,000,000 deep is read for what it holds (its step and loss) and every other line
    is, in one read and in a daemon's read of the lines after the first."""
    lines = [json.dumps({"step": i, "loss": 2.0}) for i in range(60)]
    lines[40] = '{"step": 40, "loss": 3.0, "deep": ' + "[" * 1_000_000 + "]" * 1_000_000 + "}"
    path = tmp_path / "train.jsonl"
    path.write_text("\n".join(lines[:30]) + "\n")
    first = read(path, Cursor(), run="r", fmt="jsonl", final=False, options=ReadOptions())
    path.write_text("\n".join(lines) + "\n")
    for res in (read(path, Cursor(), run="r", fmt="jsonl", final=True, options=ReadOptions()), read(path, first.cursor, run="r", fmt="jsonl", final=False, options=ReadOptions())):
        assert res.problems == ()
        loss = res.frame.filter(pl.col("metric") == "loss")
        assert loss.get_column("step").to_list()[-30:] == list(range(30, 60)) and loss.filter(pl.col("step") == 40).get_column("value").to_list() == [3.0]


def test_a_metric_name_of_100000_characters_is_cut_on_every_row_and_said_once_a_read(tmp_path):
    """Names are data from any file (here a TensorBoard tag tensorboardX wrote): cut to 4,095
    characters and an ellipsis where the reader hands its rows on, whatever the format."""
    from tensorboardX import SummaryWriter

    writer = SummaryWriter(str(tmp_path / "run1"))
    for step in range(20):
        writer.add_scalar("loss", 2.0, step)
        writer.add_scalar("x" * 100_000, 1.0, step)
    writer.close()
    (path,) = (tmp_path / "run1").iterdir()
    res = read(path, Cursor(), run="r", fmt="tfevents", final=True, options=ReadOptions())
    assert sorted(res.frame.get_column("tag").unique().to_list()) == ["loss", "x" * 4095 + "…"]
    assert res.frame.height == 40
    assert [p.message for p in res.problems] == ["a metric name of 100,000 characters cut to its first 4,095 characters and an ellipsis"]
