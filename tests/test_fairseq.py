"""fairseq's text logs as its progress bars print them: progress lines, epoch summaries, validation
summaries, legacy and through `logging`, whole and as they grow."""

from __future__ import annotations

import math

import polars as pl

from lossguard.ingest.cursor import Cursor
from lossguard.ingest.reader import ReadOptions, read
from lossguard.detection.streams import stream

from . import samples
from .test_text_formats import points, read_text


def test_fairseq_progress_lines_take_their_step_from_num_updates(tmp_path):
    frame, results, problems = read_text(tmp_path, "train.log", samples.FAIRSEQ_LEGACY)
    assert results[0].format == "fairseq" and problems == []
    # Batch counters say 400, 800, then 400 again in epoch 2: num_updates says 100, 200, 2100.
    assert [s for s, _ in points(frame, "loss")] == [100, 200, 2000, 2100]
    assert points(frame, "grad_norm")[0] == (100, 2.751)
    assert points(frame, "lr")[-1] == (2100, 0.0005)
    assert points(frame, "loss_scale") == [(100, 64.0), (200, 32.0), (2000, 32.0), (2100, 32.0)]
    tags = set(frame.get_column("tag").to_list())
    assert not tags & {"num_updates", "epoch", "valid_num_updates"}


def test_fairseq_validation_summary_is_eval_loss_never_train_loss(tmp_path):
    frame, _, _ = read_text(tmp_path, "train.log", samples.FAIRSEQ_LEGACY)
    assert points(frame, "eval_loss") == [(2000, 7.2)]
    # Tagged as fairseq's JSON log tags the same values.
    valid = frame.filter(pl.col("tag").str.starts_with("valid_")).select("tag", "value").rows()
    assert valid == [("valid_loss", 7.2), ("valid_nll_loss", 7.2), ("valid_ppl", 147.03)]
    # The running average printed mid-validation (7.3) is not a point of either curve.
    assert 7.3 not in frame.get_column("value").to_list()
    assert 7.2 not in [v for _, v in points(frame, "loss")]


def test_fairseq_nan_and_inf_values_are_kept(tmp_path):
    frame, _, _ = read_text(tmp_path, "train.log", samples.FAIRSEQ_LEGACY)
    step, loss = points(frame, "loss")[1]
    assert step == 200 and math.isnan(loss)
    assert points(frame, "grad_norm")[1] == (200, math.inf)
    assert points(frame, "ppl")[1] == (200, math.inf)


def test_fairseq_lines_without_num_updates_count_batches_across_epochs(tmp_path):
    frame, results, _ = read_text(tmp_path, "train.out", samples.FAIRSEQ_NO_UPDATES)
    assert results[0].format == "fairseq"
    # (epoch - 1) x 1500 + N; the epoch summary and the validation at the step of the line before.
    assert points(frame, "loss") == [(500, 9.1), (1000, 8.6), (1000, 8.9), (2000, 8.1)]
    assert points(frame, "eval_loss") == [(1000, 8.4)]


def test_a_fairseq_line_with_no_step_before_it_is_not_read(tmp_path):
    frame, _, problems = read_text(tmp_path, "train.out", samples.FAIRSEQ_NO_UPDATES)
    assert problems == []
    assert 9.9 not in frame.get_column("value").to_list()  # the first line: no step anywhere yet
    assert frame.get_column("step").min() == 500


def test_a_fairseq_summary_read_later_takes_the_step_the_last_read_ended_on(tmp_path):
    path = tmp_path / "train.log"
    path.write_text("| epoch 003:    250 / 1000 loss=5.5, lr=0.0001\n")
    first = read(path, Cursor(), run="r", fmt="fairseq", final=False, options=ReadOptions())
    with open(path, "a") as fh:
        fh.write("| epoch 003 | loss 5.6 | lr 0.0001\n")
    later = read(path, first.cursor, run="r", fmt="fairseq", final=False, options=ReadOptions())
    assert first.frame.filter(pl.col("metric") == "loss").select("step", "value").rows() == [(2250, 5.5)]
    assert later.frame.filter(pl.col("metric") == "loss").select("step", "value").rows() == [(2250, 5.6)]


def test_a_half_written_fairseq_line_is_left_for_the_next_read(tmp_path):
    lines = samples.FAIRSEQ_LEGACY.encode().splitlines(keepends=True)
    complete = b"".join(lines[:4])
    half = lines[4][: len(lines[4]) // 2]  # cut inside `loss=nan, ...`
    path = tmp_path / "train.log"
    path.write_bytes(complete + half)
    first = read(path, Cursor(), run="r", fmt="fairseq", final=False, options=ReadOptions())
    assert first.cursor.offset == len(complete) and first.problems == ()
    assert first.frame.get_column("step").unique().to_list() == [100]
    path.write_bytes(samples.FAIRSEQ_LEGACY.encode())
    rest = read(path, first.cursor, run="r", fmt="fairseq", final=False, options=ReadOptions())
    whole = read(path, Cursor(), run="r", fmt="fairseq", final=True, options=ReadOptions())
    assert pl.concat([first.frame, rest.frame]).equals(whole.frame)
    assert rest.frame.get_column("step").min() == 200


def test_fairseq_06_validation_values_named_valid_loss_are_not_prefixed_twice(tmp_path):
    test_subset = "| epoch 001 | valid on 'test' subset | valid_loss 6.02 | valid_nll_loss 4.33 | valid_ppl 20.11 | num_updates 2500\n"
    frame, results, problems = read_text(tmp_path, "train.log", samples.FAIRSEQ_06 + test_subset)
    assert results[0].format == "fairseq" and problems == []
    assert points(frame, "loss") == [(1000, 6.872), (2000, 6.101), (2500, 6.87)]
    assert points(frame, "clip") == [(1000, 100.0), (2000, 62.0), (2500, 100.0)]  # `clip=100%`
    # fairseq 0.6 named them valid_loss whatever the subset: tagged by subset, as the JSON log does.
    valid = frame.filter(pl.col("tag").str.contains("^(valid|test)_.*loss$"))
    assert valid.select("tag", "value").rows() == [
        ("valid_loss", 5.91), ("valid_nll_loss", 4.21), ("test_loss", 6.02), ("test_nll_loss", 4.33)
    ]
    # Both mean the eval loss; its stream is read from the validation set, which outranks a test set.
    assert sorted(points(frame, "eval_loss")) == [(2500, 5.91), (2500, 6.02)]
    assert stream(frame, "eval_loss").select("step", "value").rows() == [(2500, 5.91)]


def test_a_fairseq_json_valid_line_without_num_updates_is_not_step_1(tmp_path):
    frame, results, problems = read_text(tmp_path, "train.log", samples.FAIRSEQ_JSON)
    assert results[0].format == "jsonl" and problems == []
    # The first validation names no update and none came before it: not read, rather than put at
    # step 1 ahead of the training it followed. The last one takes the update before it.
    assert points(frame, "eval_loss") == [(320, 7.2), (320, 7.1)]
    assert 9.71 not in frame.get_column("value").to_list()
    assert frame.get_column("step").min() == 300


def test_fairseq_json_valid_num_updates_is_the_step_not_a_metric(tmp_path):
    frame, _, _ = read_text(tmp_path, "train.log", samples.FAIRSEQ_JSON)
    assert points(frame, "loss") == [(300, 8.5), (310, 8.4)]
    assert "valid_num_updates" not in frame.get_column("tag").to_list()
    assert frame.filter(pl.col("tag") == "valid_best_loss").select("step", "value").rows() == [(320, 7.2)]


def test_a_fairseq_json_valid_line_read_alone_first_waits_for_no_step(tmp_path):
    # The daemon's first pass may see nothing but the validation: it must not number it either.
    path = tmp_path / "train.log"
    lines = samples.FAIRSEQ_JSON.splitlines(keepends=True)
    path.write_text(lines[0])
    first = read(path, Cursor(), run="r", fmt="jsonl", final=False, options=ReadOptions())
    assert first.frame.height == 0 and first.problems == () and first.cursor.offset == len(lines[0].encode())
    path.write_text("".join(lines))
    rest = read(path, first.cursor, run="r", fmt="jsonl", final=False, options=ReadOptions())
    whole = read(path, Cursor(), run="r", fmt="jsonl", final=True, options=ReadOptions())
    assert rest.frame.equals(whole.frame)
