"""Every real log in the corpus (tests/fixtures/corpus, provenance in its SOURCES.md) is read into the
canonical table with the metrics and step counts SOURCES.md lists."""

from __future__ import annotations

import math

import polars as pl
import pytest

from lossguard.detection.streams import stream
from lossguard.ingest.reader import ReadOptions, read_paths

from .conftest import CORPUS

# path -> (format, {metric: points}, (first step, last step) of the loss)
EXPECTED = {
    "megatron/bloom176b_tr11_spike_31216.log": ("megatron", {"loss": 11, "lr": 11, "grad_norm": 11}, (31214, 31251)),
    "megatron/tr8b_104b_resume_spike_17062.log": ("megatron", {"loss": 9, "lr": 9, "grad_norm": 9, "loss_scale": 9 + 6}, (17060, 17068)),
    "megatron/tr8_104b_exp12_spike_8741_diverge_9027.log": ("megatron", {"loss": 7, "lr": 8, "grad_norm": 8, "loss_scale": 8}, (8738, 9026)),
    "megatron/tr8_104b_exp2_glitch_6930.log": ("megatron", {"loss": 5, "lr": 5, "grad_norm": 5, "loss_scale": 5}, (6900, 6940)),
    "megatron/bigscience_meg_ds_3d_gpt2_perf_n16_ds_off.log": ("megatron", {"loss": 62, "lr": 62, "grad_norm": 62, "loss_scale": 62}, (1, 62)),
    "hf_trainer/t5_summarization_trainer_state.json": ("hf_trainer_state", {"loss": 430, "lr": 430, "grad_norm": 430}, (500, 215000)),
    "hf_trainer/whisper_tiny_nbailab_trainer_state.json": ("hf_trainer_state", {"loss": 2000, "lr": 2000, "eval_loss": 100}, (50, 100000)),
    "hf_trainer/mistral7b_lora_translator_trainer_state.json": ("hf_trainer_state", {"loss": 866, "lr": 866, "grad_norm": 866}, (10, 8660)),
    # 1743 lines; the last one has "loss": null, which is no loss point.
    "jsonl/luojiu_7b_llamafactory_pretrain_trainer_log.jsonl": ("jsonl", {"loss": 1742, "lr": 1742}, (5, 8710)),
    # SOURCES.md says 14 eval lines; the file holds 13 (grep -c eval_loss).
    "jsonl/qwen25_7b_medical_llamafactory_trainer_log.jsonl": ("jsonl", {"loss": 675, "lr": 675, "eval_loss": 13}, (10, 6750)),
    # 2814 per-step losses and 10 epoch means (train_loss_epoch: the loss too, though the stream is
    # read from train_loss_step, which outranks it).
    "csv/slm_training_lightning_v0_metrics.csv": ("csv", {"loss": 2824, "eval_loss": 10}, (49, 140699)),
    "tfevents/t5_summarization_hf_trainer": ("tfevents", {"loss": 430, "lr": 430, "grad_norm": 430}, (500, 215000)),
    "tfevents/lstm_textgen_lightning": ("tfevents", {"loss": 7691, "eval_loss": 29}, (49, 384549)),
    "tfevents/satd_hmer_lightning_lr_sgd": ("tfevents", {"loss": 240, "lr": 240, "eval_loss": 120}, None),
    "other/modded_nanogpt_scaleup1b_87bd51fd_steps.log": ("kv_lines", {"loss": 20344, "eval_loss": 164}, (1, 20344)),
    "other/build_nanogpt_agndm_bigger_254M.log": ("kv_lines", {"loss": 19073, "lr": 19073, "grad_norm": 19073}, (0, 19072)),
}


def test_every_corpus_file_is_listed_here():
    on_disk = {p.relative_to(CORPUS).as_posix() for p in CORPUS.rglob("*") if p.is_file() and p.name != "SOURCES.md"}
    listed = set()
    for key in EXPECTED:
        target = CORPUS / key
        listed |= {p.relative_to(CORPUS).as_posix() for p in target.iterdir()} if target.is_dir() else {key}
    assert on_disk == listed


@pytest.mark.parametrize("relpath", sorted(EXPECTED), ids=sorted(EXPECTED))
def test_corpus_file_is_read_with_its_metrics(relpath):
    fmt, counts, loss_span = EXPECTED[relpath]
    frame, results, problems = read_paths([CORPUS / relpath], ReadOptions())
    assert problems == []
    assert {r.format for r in results} == {fmt}
    got = dict(frame.group_by("metric").len().iter_rows())
    for metric, n in counts.items():
        assert got.get(metric) == n, (metric, got.get(metric))
    if loss_span is not None:
        steps = stream(frame, "loss").get_column("step")
        assert (steps.min(), steps.max()) == loss_span
    assert frame.schema == {
        "run": pl.String, "source": pl.String, "step": pl.Int64, "metric": pl.String,
        "tag": pl.String, "value": pl.Float64, "wall_time": pl.Float64,
    }


def test_bloom_spike_values_are_read_exactly():
    frame, _, _ = read_paths([CORPUS / "megatron/bloom176b_tr11_spike_31216.log"])
    loss = dict(frame.filter(pl.col("metric") == "loss").select("step", "value").iter_rows())
    grad = dict(frame.filter(pl.col("metric") == "grad_norm").select("step", "value").iter_rows())
    assert loss[31216] == pytest.approx(2.595213)
    assert grad[31217] == pytest.approx(15.886)
    assert max(loss.values()) == pytest.approx(loss[31219])


def test_deepspeed_overflow_lines_become_loss_scale_points_at_the_next_step():
    frame, _, _ = read_paths([CORPUS / "megatron/tr8b_104b_resume_spike_17062.log"])
    overflow = frame.filter(pl.col("tag") == "OVERFLOW loss scale").select("step", "value").rows()
    assert overflow[0] == (17062, 1048576.0)
    assert overflow[1] == (17063, 524288.0)
    assert [v for _, v in overflow][-1] == 32768.0


def test_hf_trainer_state_and_its_tensorboard_file_agree():
    a, _, _ = read_paths([CORPUS / "hf_trainer/t5_summarization_trainer_state.json"])
    b, _, _ = read_paths([CORPUS / "tfevents/t5_summarization_hf_trainer"])
    for metric in ("loss", "grad_norm", "lr"):
        x = a.filter(pl.col("metric") == metric).select("step", "value").sort("step")
        y = b.filter(pl.col("metric") == metric).select("step", "value").sort("step")
        assert x.get_column("step").to_list() == y.get_column("step").to_list()
        # The event file stores float32.
        assert all(math.isclose(p, q, rel_tol=1e-6) for p, q in zip(x.get_column("value"), y.get_column("value")))


def test_final_hf_summary_entry_is_not_a_loss_point():
    frame, _, _ = read_paths([CORPUS / "hf_trainer/t5_summarization_trainer_state.json"])
    assert "train_runtime" not in frame.get_column("tag").to_list()
    assert frame.filter(pl.col("metric") == "loss").get_column("step").max() == 215000


def test_whole_corpus_folder_names_runs_relative_to_the_root():
    frame, _, problems = read_paths([CORPUS])
    runs = set(frame.get_column("run").unique())
    assert "tfevents/lstm_textgen_lightning" in runs
    assert "megatron/bloom176b_tr11_spike_31216" in runs
    assert len(runs) == 16
    assert problems == []
