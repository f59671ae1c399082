"""Today's console logs, each as its framework's own logging code prints it
(tests/console_samples.py names the file and function): read back at the right steps with the
right metrics, a spike in a whole run found by `lossguard scan`, and read in pieces as one read."""

from __future__ import annotations

import json
import math

import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lossguard.cli import main
from lossguard.ingest.cursor import Cursor
from lossguard.ingest.formats.sniff import format_of
from lossguard.ingest.reader import ReadOptions, read, read_paths

from . import console_samples, synth
from .test_incremental import _grow_and_read


def read_sample(tmp_path, name):
    fname, text = console_samples.ALL[name]
    path = tmp_path / fname
    path.write_text(text)
    frame, results, problems = read_paths([path], ReadOptions())
    return frame, results[0].format, [p.message for p in problems]


def points(frame, metric):
    return frame.filter(pl.col("metric") == metric).select("step", "value").rows()


def same(got, expected):
    """Points equal, NaN equal to NaN."""
    return len(got) == len(expected) and all(
        s == t and (v == w or (math.isnan(v) and math.isnan(w))) for (s, v), (t, w) in zip(got, expected)
    )


def tags(frame):
    return set(frame.get_column("tag").to_list())


def test_mmengine_epoch_lines_are_at_epoch_times_its_batches_plus_the_batch_and_validation_is_evaluation(tmp_path):
    frame, fmt, problems = read_sample(tmp_path, "mmengine_epochs")
    assert fmt == "kv_lines" and problems == []
    # Two batches an epoch: Epoch(train) [2][1/2] is step 3.
    assert same(points(frame, "loss"), [(1, 2.7522), (2, 2.6), (3, math.nan)])
    assert points(frame, "grad_norm") == [(1, 3.0608), (2, 3.0), (3, 2.9)]
    assert points(frame, "lr") == [(1, 2e-4), (2, 2e-4), (3, 2e-4)]
    # The validation's `loss` is its own (the eval loss), at the training step before it.
    assert points(frame, "eval_loss") == [(2, 9.9)]
    assert frame.filter(pl.col("tag") == "val/coco/bbox_mAP").select("step", "value").rows() == [(2, 0.367)]
    # `eta: 1 day, 1:02:02` is a duration, no number; base_lr is not the learning rate's only tag.
    assert not {t for t in tags(frame) if t.endswith("eta")}
    assert "loss_cls" in tags(frame) and "base_lr" in tags(frame)


def test_mmengine_iteration_lines_are_at_their_iteration(tmp_path):
    frame, fmt, problems = read_sample(tmp_path, "mmengine_iters")
    assert fmt == "kv_lines" and problems == []
    assert points(frame, "loss") == [(200, 2.7522), (400, 2.5), (600, 2.4)]
    assert frame.filter(pl.col("tag") == "val/mIoU").select("step", "value").rows() == [(400, 40.21)]
    assert frame.filter(pl.col("tag") == "decode.loss_ce").height == 3


def test_mmengine_validation_before_any_training_line_is_not_read(tmp_path):
    path = tmp_path / "eval.log"
    path.write_text("06/10 14:31:01 - mmengine - INFO - Epoch(val) [1][500/500]    loss: 2.1000  accuracy/top1: 76.5000  data_time: 0.0021  time: 0.1012\n" + console_samples.MMSEG_ITER)
    frame = read(path, run="r", fmt="kv_lines", final=True, options=ReadOptions()).frame
    assert points(frame, "eval_loss") == [] and points(frame, "loss")[0] == (200, 2.7522)


def test_llmc_main_log_is_train_loss_eval_loss_and_grad_norm_by_step(tmp_path):
    frame, fmt, problems = read_sample(tmp_path, "llmc_main")
    assert fmt == "kv_lines" and problems == []
    assert same(points(frame, "loss"), [(0, 11.0112), (1, 10.9001), (2, math.nan)])
    assert points(frame, "eval_loss") == [(0, 11.0123)]
    assert points(frame, "grad_norm") == [(0, 15.43), (1, 13.98), (2, math.inf)]
    # `s` names the step, it is no metric; `eval` is HellaSwag's accuracy, no loss.
    assert "s" not in tags(frame) and points(frame, "eval") == [(0, 0.25)]


def test_olmo_core_metrics_belong_to_the_marker_above_them_and_evaluations_are_tagged_eval(tmp_path):
    frame, fmt, problems = read_sample(tmp_path, "olmo_core")
    assert fmt == "olmo_core" and problems == []
    # Metrics every 3 steps: steps 2 and 4 print a marker alone.
    assert points(frame, "loss") == [(1, 10.91), (3, 9.812)]
    assert points(frame, "grad_norm") == [(1, 3.21), (3, 1.234)]
    assert points(frame, "lr") == [(1, 2e-05), (3, 6e-05)]
    assert frame.filter(pl.col("tag") == "throughput/total tokens").select("step", "value").rows() == [(1, 4194304.0), (3, 12582912.0)]
    assert frame.filter(pl.col("tag") == "eval/lm/c4_en-validation/CE loss").select("step", "value").rows() == [(3, 9.912)]
    # The evaluation-speed lines (`name (+variants): 12.3 sec`) are no metrics.
    assert not {t for t in tags(frame) if "variants" in t or "Total" in t}


def test_olmo_core_numbers_as_format_float_writes_them_and_blocks_closed_by_other_records(tmp_path):
    path = tmp_path / "train.log"
    head = "2025-01-01 10:00:10.123\thost:0\tolmo_core.train.callbacks.console_logger:76\tINFO\t"
    path.write_text(
        "    train/CE loss=1.0\n"  # before any marker: no step
        f"{head}[step=10/???,epoch=0]\n    throughput/total tokens=4.194B\n    train/CE loss=nan\n    optim/total grad norm=-inf\n"
        f"{head}Saving checkpoint to step10\n    lr=0.5\n"  # another record's indented line: no metric
        f"{head}[step=20/5000,epoch=1,eta=3d4h(hard stop)]\n    train/CE loss=2.000\n    optim/step skipped=0.0\n"
    )
    frame = read(path, run="r", fmt="olmo_core", final=True, options=ReadOptions()).frame
    assert frame.filter(pl.col("tag") == "throughput/total tokens").get_column("value").to_list() == [4.194e9]
    assert same(points(frame, "loss"), [(10, math.nan), (20, 2.0)])
    assert points(frame, "grad_norm") == [(10, -math.inf)]
    assert "lr" not in tags(frame) and points(frame, "lr") == []


def test_composer_file_logger_lines_are_each_at_their_batch_and_its_captured_console_is_not_read_again(tmp_path):
    frame, fmt, problems = read_sample(tmp_path, "composer_file")
    assert fmt == "composer" and problems == []
    assert same(points(frame, "loss"), [(1, 11.2345), (2, math.nan)])  # not the console's 112.345
    assert points(frame, "lr") == [(1, 0.0), (2, 0.0001)] and points(frame, "grad_norm") == [(1, 5.4321), (2, 4.321)]
    assert "seed" not in tags(frame)  # a hyperparameter, no metric


def test_clu_logging_writer_lines_take_their_step_from_the_brackets(tmp_path):
    frame, fmt, problems = read_sample(tmp_path, "clu")
    assert fmt == "kv_lines" and problems == []
    assert same(points(frame, "loss"), [(100, 3.2), (200, 3.0), (300, math.nan)])
    assert points(frame, "lr") == [(100, 0.001), (200, 0.001), (300, 0.001)]
    assert points(frame, "grad_norm") == [(100, 1.5), (200, 1.25), (300, 1.0)]


def test_a_step_key_wins_over_a_bracketed_number(tmp_path):
    path = tmp_path / "train.log"
    path.write_text("[7] step=100, loss=3.2\n[8] step=200, loss=3.1\n")
    frame = read(path, run="r", fmt="kv_lines", final=True, options=ReadOptions()).frame
    assert points(frame, "loss") == [(100, 3.2), (200, 3.1)]


@pytest.mark.parametrize("name", ["verl", "verl_legacy"])
def test_verl_actor_loss_and_grad_norm_are_the_runs_and_critic_and_rewards_keep_their_names(tmp_path, name):
    frame, fmt, problems = read_sample(tmp_path, name)
    assert fmt == "kv_lines" and problems == []
    loss = points(frame, "loss")
    assert [s for s, _ in loss] == [1, 2] and math.isnan(loss[1][1]) and loss[0][1] == pytest.approx(0.0123, abs=5e-4)
    assert points(frame, "grad_norm") == [(1, 0.279), (2, 0.3)]
    by_tag = {t: m for t, m in frame.select("tag", "metric").unique().rows()}
    assert by_tag["actor/pg_loss"] == "loss" and by_tag["actor/lr"] == "lr"
    assert by_tag["critic/vf_loss"] == "critic/vf_loss" and by_tag["critic/rewards/mean"] == "critic/rewards/mean"
    assert by_tag["actor/entropy"] == "actor/entropy"
    assert frame.filter(pl.col("tag") == "val-core/openai/gsm8k/acc/mean@1").select("step", "value").rows() == [(0, 0.508)]
    assert not {t for t in tags(frame) if "pid" in t}  # Ray's prefix says who printed the line


def test_openrlhf_dicts_are_at_the_global_step_before_them_and_policy_loss_is_the_loss(tmp_path):
    frame, fmt, problems = read_sample(tmp_path, "openrlhf")
    assert fmt == "hf_console" and problems == []
    # Not at the prompt bar's count (8 prompts a step), which no training dict takes here.
    assert same(points(frame, "loss"), [(1, 0.0123), (2, 0.0125), (3, math.nan)])
    assert points(frame, "lr") == [(1, 1e-06), (2, 2e-06), (3, 3e-06)] and points(frame, "grad_norm") == [(1, 0.41), (2, 0.39), (3, 0.38)]
    by_tag = {t: m for t, m in frame.select("tag", "metric").unique().rows()}
    assert by_tag["critic_loss"] == "critic_loss" and by_tag["critic_lr"] == "critic_lr"
    assert frame.filter(pl.col("tag") == "eval_pass1").select("step", "value").rows() == [(2, 0.5)]


def test_fairseq_2017_progress_lines_are_at_their_batch_count_and_the_validation_is_eval(tmp_path):
    frame, fmt, problems = read_sample(tmp_path, "fairseq_2017")
    assert fmt == "fairseq" and problems == []
    # The batch's loss, not its running average in parentheses; two batches an epoch.
    assert [p for p in points(frame, "loss")] == [(1, 9.57), (2, 9.17), (3, 8.97)]
    assert points(frame, "eval_loss") == [(2, 9.37)]


def test_capitalised_dict_keys_are_the_vocabularys_words_and_step(tmp_path):
    frame, fmt, problems = read_sample(tmp_path, "capitalised_dicts")
    assert fmt == "hf_console" and problems == []
    assert same(points(frame, "loss"), [(100, 0.287), (200, 0.2), (300, math.nan)])
    assert points(frame, "lr") == [(100, 1e-3), (200, 1e-3), (300, 5e-4)]


def test_capitalised_dicts_with_only_an_epoch_are_numbered_and_a_warning_says_so(tmp_path):
    path = tmp_path / "stdout.txt"
    path.write_text(console_samples.EPOCH_DICTS)
    frame, results, problems = read_paths([path], ReadOptions())
    assert results[0].format == "hf_console" and points(frame, "loss") == [(1, 0.287), (2, 0.2), (3, 0.187)]
    assert [p.message for p in problems] == [
        "no step in this file (no progress bar, no epoch with a known number of steps per epoch): its records are numbered 1, 2, 3... in file order"
    ]


def test_plural_steps_key_names_the_step_and_torch_tensors_read_as_their_number(tmp_path):
    frame, fmt, problems = read_sample(tmp_path, "plural_steps")
    assert fmt == "kv_lines" and problems == []
    assert points(frame, "loss") == [(100, 8.43), (200, 8.03)]
    assert frame.filter(pl.col("tag") == "kl_Loss").get_column("value").to_list() == [0.843, 0.803]
    assert "Rank" not in tags(frame)


def test_a_banners_plural_steps_is_no_record_and_leaves_epoch_steps_alone(tmp_path):
    # wav2letter's epochs are the steps; a banner's `accumulation steps: 4` must not make them no records.
    from . import samples

    path = tmp_path / "001_log"
    path.write_text("=> calculated gradient accumulation steps: 4\n" + samples.WAV2LETTER_EPOCHS)
    frame = read(path, run="r", fmt="kv_lines", final=True, options=ReadOptions()).frame
    assert [s for s, _ in points(frame, "loss")] == [1, 2, 3]


def test_torchtitans_coloured_lines_are_read_and_its_validation_is_eval_not_the_training_loss(tmp_path):
    # Its colours stood between every name and its number: nothing was read, and "0 spikes" said.
    # Stripped, its `validate step: N  loss:` lines were training losses 2.5x the curve: spikes.
    frame, fmt, problems = read_sample(tmp_path, "torchtitan")
    assert fmt == "kv_lines" and problems == []
    assert same(points(frame, "loss"), [(1, 10.9095), (2, 10.5), (3, float("nan"))])
    assert points(frame, "grad_norm") == [(1, 2.0088), (2, 1.9), (3, 1.8)]
    assert points(frame, "eval_loss") == [(2, 26.25)] and "val/loss" in tags(frame)


def test_maxtexts_eval_lines_are_eval_not_the_training_loss(tmp_path):
    frame, fmt, problems = read_sample(tmp_path, "maxtext")
    assert fmt == "kv_lines" and problems == []
    assert same(points(frame, "loss"), [(0, 10.9), (1, 10.5), (2, float("nan")), (3, 10.1)])
    # The eval summary at the training step it ran after; the running eval lines are eval values too.
    summary = frame.filter(pl.col("tag") == "val/loss").select("step", "value").rows()
    assert same(summary, [(0, 27.25), (2, float("nan"))]) and "val/running loss" in tags(frame)
    assert frame.filter(pl.col("metric") == "loss").get_column("tag").unique().to_list() == ["loss"]


def test_timm_train_lines_are_at_epoch_times_its_updates_plus_the_update_and_its_test_lines_are_eval(tmp_path):
    # No step key: read as nothing ("no training metrics recognised").
    frame, fmt, problems = read_sample(tmp_path, "timm")
    assert fmt == "kv_lines" and problems == []
    assert same(points(frame, "loss"), [(0, 6.91), (1, 6.86), (2, float("nan")), (3, 6.5)])
    assert points(frame, "lr") == [(0, 1e-5), (1, 1e-5), (2, 2e-5), (3, 2e-5)]
    assert points(frame, "eval_loss") == [(1, 10.29), (1, 10.29), (3, 9.75), (3, 9.75)]  # (printed `{:>7.3f}`: at the training step before them)
    assert not {"Train", "Test", "val/Test"} & tags(frame)  # (its header's words, not metrics)


def test_a_training_line_whose_prefix_holds_an_eval_word_stays_the_trainings_and_every_escape_is_read_past(tmp_path):
    text = "".join(
        f"[test] step {s} loss {2.0 + s / 100} | INFO eval.py step {s} \x1b[1mlr\x1b(B\x1b[m: 0.001 \x1b7grad_norm\x1b8: 1.5\n" for s in range(3)
    )
    (tmp_path / "train.log").write_text(text)
    frame = read_paths([tmp_path / "train.log"])[0]
    assert points(frame, "loss") == [(s, 2.0 + s / 100) for s in range(3)]
    assert points(frame, "lr") == [(s, 0.001) for s in range(3)] and points(frame, "grad_norm") == [(s, 1.5) for s in range(3)]


WRITERS = {
    "mmengine": ("20240512_103600.log", console_samples.mmengine),
    "llmc": ("main.log", console_samples.llmc),
    "olmo_core": ("train.log", console_samples.olmo_core),
    "composer_file": ("logs-rank0.txt", console_samples.composer_file),
    "clu": ("train.log", console_samples.clu),
    "verl": ("verl_demo.log", console_samples.verl),
    "openrlhf": ("train_ppo.log", console_samples.openrlhf),
    "fairseq_2017": ("train.log", console_samples.fairseq_2017),
    "capitalised_dicts": ("stdout.txt", console_samples.capitalised_dicts),
    "plural_steps": ("pretrain.log", console_samples.plural_steps),
    "torchtitan": ("train.log", console_samples.torchtitan),
    "maxtext": ("train.log", console_samples.maxtext),
    "timm": ("train.log", console_samples.timm),
    "build_nanogpt": ("log.txt", console_samples.build_nanogpt),
}


@pytest.mark.parametrize("name", sorted(WRITERS))
def test_a_loss_spike_in_a_console_log_is_found_by_scan(tmp_path, capsys, name):
    fname, write = WRITERS[name]
    run = tmp_path / name
    run.mkdir()
    (run / fname).write_text(write(synth.curves("bad_batch")))
    # (In process: the command-line's own process is tested elsewhere; here, what each writer's log gives.)
    code = main(["scan", str(run), "--format", "json"])
    out = capsys.readouterr()
    assert code == 1, out.err
    (report,) = json.loads(out.out)["runs"]
    spikes = [(s["metric"], s["step"]) for s in report["spikes"]]
    assert ("loss", 701) in spikes, spikes  # synth's bad batch: index 700, step 701


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=st.sampled_from(sorted(console_samples.ALL)), fractions=st.lists(st.floats(0, 1), max_size=12))
def test_console_logs_read_in_pieces_equal_one_read(tmp_path, name, fractions):
    fname, text = console_samples.ALL[name]
    data = text.encode()
    whole_path = tmp_path / f"whole-{fname}"
    whole_path.write_bytes(data)
    fmt = format_of(whole_path)
    whole = read(whole_path, Cursor(), run="r", fmt=fmt, final=True, options=ReadOptions())
    grown, cursor = _grow_and_read(tmp_path / fname, data, [int(f * len(data)) for f in fractions], fmt)
    assert whole.frame.height > 0
    assert grown.drop("source").equals(whole.frame.drop("source"))
    assert cursor.offset == len(data)


def test_build_nanogpts_log_is_its_train_loss_each_step_and_its_val_loss_and_hellaswag_at_their_steps(tmp_path):
    frame, fmt, problems = read_sample(tmp_path, "build_nanogpt")
    assert fmt == "step_split" and problems == []
    assert same(points(frame, "loss"), [(0, 10.955029), (1, 10.284193), (2, float("nan")), (3, 9.5)])
    assert same(points(frame, "eval_loss"), [(0, 11.5028), (2, float("nan")), (3, 9.975)])
    assert [s for s, _ in points(frame, "hella")] == [0, 2, 3]

