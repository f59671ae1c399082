"""Which format each known file is sniffed as. Sniffing is name patterns, a few head checks and
line counting, with precedence, spread over the format modules: a new format must not take the
files of another, and these tables say at once when one does."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lossguard.ingest.formats import megatron
from lossguard.ingest.formats.sniff import format_of

from . import samples
from .conftest import FIXTURES

FIXTURE_FORMATS = {
    "corpus/SOURCES.md": None,
    "corpus/csv/slm_training_lightning_v0_metrics.csv": "csv",
    "corpus/hf_trainer/mistral7b_lora_translator_trainer_state.json": "hf_trainer_state",
    "corpus/hf_trainer/t5_summarization_trainer_state.json": "hf_trainer_state",
    "corpus/hf_trainer/whisper_tiny_nbailab_trainer_state.json": "hf_trainer_state",
    "corpus/jsonl/luojiu_7b_llamafactory_pretrain_trainer_log.jsonl": "jsonl",
    "corpus/jsonl/qwen25_7b_medical_llamafactory_trainer_log.jsonl": "jsonl",
    "corpus/megatron/bigscience_meg_ds_3d_gpt2_perf_n16_ds_off.log": "megatron",
    "corpus/megatron/bloom176b_tr11_spike_31216.log": "megatron",
    "corpus/megatron/tr8_104b_exp12_spike_8741_diverge_9027.log": "megatron",
    "corpus/megatron/tr8_104b_exp2_glitch_6930.log": "megatron",
    "corpus/megatron/tr8b_104b_resume_spike_17062.log": "megatron",
    "corpus/other/build_nanogpt_agndm_bigger_254M.log": "kv_lines",
    "corpus/other/modded_nanogpt_scaleup1b_87bd51fd_steps.log": "kv_lines",
    "corpus/tfevents/lstm_textgen_lightning/events.out.tfevents.1716735746.99c8c45923de.3769.0": "tfevents",
    "corpus/tfevents/satd_hmer_lightning_lr_sgd/events.out.tfevents.1699875277.Ender-PC.10072.0": "tfevents",
    "corpus/tfevents/t5_summarization_hf_trainer/events.out.tfevents.1742826235.DESKTOP-41L2EO3.107869.0": "tfevents",
    "make_runs.py": None,
    "real_trainers/SOURCES.md": None,
    "real_trainers/hf_clean/hf_console.log": "hf_console",
    "real_trainers/hf_clean/output/checkpoint-200/config.json": None,
    "real_trainers/hf_clean/output/checkpoint-200/trainer_state.json": "hf_trainer_state",
    "real_trainers/hf_clean/output/checkpoint-400/config.json": None,
    "real_trainers/hf_clean/output/checkpoint-400/trainer_state.json": "hf_trainer_state",
    "real_trainers/hf_clean/output/checkpoint-600/config.json": None,
    "real_trainers/hf_clean/output/checkpoint-600/trainer_state.json": "hf_trainer_state",
    "real_trainers/hf_clean/output/checkpoint-700/config.json": None,
    "real_trainers/hf_clean/output/checkpoint-700/trainer_state.json": "hf_trainer_state",
    "real_trainers/hf_clean/output/runs/Dec06_05-45-17_vm/events.out.tfevents.1796535917.vm.5435.0": "tfevents",
    "real_trainers/hf_clean/wandb/offline-run-20261206_054517-hf-clean/files/requirements.txt": None,
    "real_trainers/hf_clean/wandb/offline-run-20261206_054517-hf-clean/run-hf-clean.wandb": "wandb",
    "real_trainers/hf_lr_jump/hf_console.log": "hf_console",
    "real_trainers/hf_lr_jump/output/checkpoint-200/config.json": None,
    "real_trainers/hf_lr_jump/output/checkpoint-200/trainer_state.json": "hf_trainer_state",
    "real_trainers/hf_lr_jump/output/checkpoint-400/config.json": None,
    "real_trainers/hf_lr_jump/output/checkpoint-400/trainer_state.json": "hf_trainer_state",
    "real_trainers/hf_lr_jump/output/checkpoint-600/config.json": None,
    "real_trainers/hf_lr_jump/output/checkpoint-600/trainer_state.json": "hf_trainer_state",
    "real_trainers/hf_lr_jump/output/checkpoint-700/config.json": None,
    "real_trainers/hf_lr_jump/output/checkpoint-700/trainer_state.json": "hf_trainer_state",
    "real_trainers/hf_lr_jump/output/runs/Dec06_05-44-16_vm/events.out.tfevents.1796535856.vm.4458.0": "tfevents",
    "real_trainers/hf_lr_jump/wandb/offline-run-20261206_054416-hf-lr-jump/files/requirements.txt": None,
    "real_trainers/hf_lr_jump/wandb/offline-run-20261206_054416-hf-lr-jump/run-hf-lr-jump.wandb": "wandb",
    "real_trainers/lightning_clean/csv/digits/version_0/hparams.yaml": None,
    "real_trainers/lightning_clean/csv/digits/version_0/metrics.csv": "csv",
    "real_trainers/lightning_clean/tb/digits/version_0/events.out.tfevents.1796535789.vm.2552.0": "tfevents",
    "real_trainers/lightning_clean/tb/digits/version_0/hparams.yaml": None,
    "real_trainers/lightning_clean/wandb/offline-run-20261206_054307-lightning-clean/files/requirements.txt": None,
    "real_trainers/lightning_clean/wandb/offline-run-20261206_054307-lightning-clean/run-lightning-clean.wandb": "wandb",
    "real_trainers/lightning_lr_jump/csv/digits/version_0/hparams.yaml": None,
    "real_trainers/lightning_lr_jump/csv/digits/version_0/metrics.csv": "csv",
    "real_trainers/lightning_lr_jump/tb/digits/version_0/events.out.tfevents.1796535663.vm.8903.0": "tfevents",
    "real_trainers/lightning_lr_jump/tb/digits/version_0/hparams.yaml": None,
    "real_trainers/lightning_lr_jump/wandb/offline-run-20261206_054057-lightning-lr-jump/files/requirements.txt": None,
    "real_trainers/lightning_lr_jump/wandb/offline-run-20261206_054057-lightning-lr-jump/run-lightning-lr-jump.wandb": "wandb",
    "real_trainers/make_runs.py": None,
    "real_trainers/mlflow.db": "mlflow_db",
    "comet/SOURCES.md": None,
    "comet/write_offline.py": None,
    "comet/c377ed14a8294afe8d8b51fbd1a80f33.zip": "comet_offline",
    "keras/SOURCES.md": None,
    "keras/keras_fit.py": None,
    "keras/keras3_fit_verbose1.log": "progress_bars",
    "keras/keras3_fit_verbose2.log": "progress_bars",
    "runs/hf-lr-too-high/checkpoint-1200/trainer_state.json": "hf_trainer_state",
    "runs/hf-lr-too-high/checkpoint-600/trainer_state.json": "hf_trainer_state",
    "runs/jsonl-lr-restart/metrics.jsonl": "jsonl",
    "runs/lightning-bad-batch/version_0/metrics.csv": "csv",
    "runs/megatron-fp16-overflow/train.log": "megatron",
    "runs/megatron-grad-explosion/train.log": "megatron",
    "runs/nanogpt-clean/train.log": "kv_lines",
    "runs/tb-clean/events.out.tfevents.1796083710.vm": "tfevents",
    "runs/tf2-recurring-spikes/events.out.tfevents.1796083711.vm.4616.0": "tfevents",
    "torchrun/PROVENANCE.md": None,
    "torchrun/clean/launcher.log": None,
    "torchrun/clean/launcher.log.cmd": None,
    "torchrun/clean/logs/c7b57c36-ae62-446e-b6e4-0ad941aafb59_e4xhzk66/attempt_0/0/stderr.log": None,
    "torchrun/clean/logs/c7b57c36-ae62-446e-b6e4-0ad941aafb59_e4xhzk66/attempt_0/0/stdout.log": 'kv_lines',
    "torchrun/clean/logs/c7b57c36-ae62-446e-b6e4-0ad941aafb59_e4xhzk66/attempt_0/1/stderr.log": None,
    "torchrun/clean/logs/c7b57c36-ae62-446e-b6e4-0ad941aafb59_e4xhzk66/attempt_0/1/stdout.log": 'kv_lines',
    "torchrun/crash_rank1/launcher.log": None,
    "torchrun/crash_rank1/launcher.log.cmd": None,
    "torchrun/crash_rank1/logs/00a95706-e93c-42a8-8d4f-99d2d910c77c_e1kyr9sq/attempt_0/0/error.json": None,
    "torchrun/crash_rank1/logs/00a95706-e93c-42a8-8d4f-99d2d910c77c_e1kyr9sq/attempt_0/0/stderr.log": None,
    "torchrun/crash_rank1/logs/00a95706-e93c-42a8-8d4f-99d2d910c77c_e1kyr9sq/attempt_0/0/stdout.log": 'kv_lines',
    "torchrun/crash_rank1/logs/00a95706-e93c-42a8-8d4f-99d2d910c77c_e1kyr9sq/attempt_0/1/error.json": None,
    "torchrun/crash_rank1/logs/00a95706-e93c-42a8-8d4f-99d2d910c77c_e1kyr9sq/attempt_0/1/stderr.log": None,
    "torchrun/crash_rank1/logs/00a95706-e93c-42a8-8d4f-99d2d910c77c_e1kyr9sq/attempt_0/1/stdout.log": 'kv_lines',
    "torchrun/make_torchrun_runs.py": 'kv_lines',  # (its print format strings; a .py is no candidate a walk reads)
    "torchrun/nan_rank1/launcher.log": None,
    "torchrun/nan_rank1/launcher.log.cmd": None,
    "torchrun/nan_rank1/logs/563ff66a-bdcb-4a41-a98b-096c99c6adb8_uq_jy7ws/attempt_0/0/stderr.log": None,
    "torchrun/nan_rank1/logs/563ff66a-bdcb-4a41-a98b-096c99c6adb8_uq_jy7ws/attempt_0/0/stdout.log": 'kv_lines',
    "torchrun/nan_rank1/logs/563ff66a-bdcb-4a41-a98b-096c99c6adb8_uq_jy7ws/attempt_0/1/stderr.log": None,
    "torchrun/nan_rank1/logs/563ff66a-bdcb-4a41-a98b-096c99c6adb8_uq_jy7ws/attempt_0/1/stdout.log": 'kv_lines',
    "torchrun/two_nodes/launcher_node0.log": None,
    "torchrun/two_nodes/launcher_node0.log.cmd": None,
    "torchrun/two_nodes/launcher_node1.log": None,
    "torchrun/two_nodes/launcher_node1.log.cmd": None,
    "torchrun/two_nodes/logs/job4242_4tll2scm/attempt_0/0/stderr.log": None,
    "torchrun/two_nodes/logs/job4242_4tll2scm/attempt_0/0/stdout.log": 'kv_lines',
    "torchrun/two_nodes/logs/job4242_4tll2scm/attempt_0/1/stderr.log": None,
    "torchrun/two_nodes/logs/job4242_4tll2scm/attempt_0/1/stdout.log": 'kv_lines',
    "torchrun/two_nodes/logs/job4242_5ci0mepp/attempt_0/0/stderr.log": None,
    "torchrun/two_nodes/logs/job4242_5ci0mepp/attempt_0/0/stdout.log": 'kv_lines',
    "torchrun/two_nodes/logs/job4242_5ci0mepp/attempt_0/1/stderr.log": None,
    "torchrun/two_nodes/logs/job4242_5ci0mepp/attempt_0/1/stdout.log": 'kv_lines',
}

SAMPLE_FORMATS = {
    "composer": "composer",
    "csv": "csv",
    "hf_console": "hf_console",
    "hf_console_no_bar": "hf_console",
    "jsonl": "jsonl",
    "fairseq": "fairseq",
    "fairseq_legacy": "fairseq",
    "fairseq_no_updates": "fairseq",
    "fairseq_06": "fairseq",
    "fairseq_json": "jsonl",
    "kv_deepspeed": "kv_lines",
    "kv_flashlight": "kv_lines",
    "kv_llmc": "kv_lines",
    "kv_nanogpt": "kv_lines",
    "kv_torchtitan": "kv_lines",
    "megatron": "megatron",
    "mmengine_epochs": "kv_lines",
    "mmengine_iters": "kv_lines",
    "llmc_main": "kv_lines",
    "olmo_core": "olmo_core",
    "composer_file": "composer",
    "clu": "kv_lines",
    "verl": "kv_lines",
    "verl_legacy": "kv_lines",
    "openrlhf": "hf_console",
    "fairseq_2017": "fairseq",
    "capitalised_dicts": "hf_console",
    "plural_steps": "kv_lines",
    "torchtitan": "kv_lines",
    "maxtext": "kv_lines",
    "timm": "kv_lines",
    "keras3": "progress_bars",
    "tf_keras": "progress_bars",
    "lightning": "progress_bars",
    "nemo": "progress_bars",
    "build_nanogpt": "step_split",
}


def test_every_fixture_file_is_sniffed_as_the_format_it_is_in():
    # Every file, so that a new fixture must be given its expected format here.
    files = sorted(p for p in FIXTURES.rglob("*") if p.is_file() and "__pycache__" not in p.parts)
    assert {p.relative_to(FIXTURES).as_posix(): format_of(p) for p in files} == FIXTURE_FORMATS


@pytest.mark.parametrize("sample", sorted(samples.ALL))
def test_every_sample_log_is_sniffed_as_the_format_it_is_in(tmp_path, sample):
    assert set(SAMPLE_FORMATS) == set(samples.ALL)
    name, text = samples.ALL[sample]
    path = tmp_path / name
    path.write_text(text)
    assert format_of(path) == SAMPLE_FORMATS[sample]


BANNER = "a banner line with no metrics in it, as launchers print them by the page\n"


@pytest.mark.parametrize(
    "name,text,expected",
    [
        pytest.param("Metrics.CSV", "a,b\n1,2\n", "csv", id="csv by its suffix in any case"),
        pytest.param(".csv", "a,b\n1,2\n", None, id="a hidden file named .csv has no suffix"),
        pytest.param("events.out.tfevents.1.host.csv", "a,b\n", "tfevents", id="an event file's name beats a csv suffix"),
        pytest.param("EVENTS.OUT.TFEVENTS.1", "x", None, id="an event file's name is case-sensitive"),
        pytest.param("state.json", '{"best_metric": null, "log_history": [{"loss": 1.0, "step": 1}]}', "hf_trainer_state", id="trainer state by content"),
        pytest.param(
            "mixed.log", "{'loss': 2.0, 'epoch': 0.1}\n" * 2 + 'step 1 | loss 2.0 | "lr": 0.1\n' * 3, "hf_console",
            id="a quoted metric key is a dict's even without its brace, never a kv line",
        ),
        pytest.param(
            "tie.log", "\t Train loss/train/total: 2.0\n iteration 5/ 10 | lm loss: 2.0 |\n", "composer",
            id="a tie goes to the format first in precedence",
        ),
        pytest.param(
            "epochs.log", "epoch 001 | step 100 | loss 2.0\n" * 3, "kv_lines", id="a zero-padded epoch alone is not fairseq",
        ),
        pytest.param("late.log", BANNER * (300_000 // len(BANNER)) + "step 1 | loss 2.0\n", "kv_lines", id="first metric line past the head"),
        pytest.param("nothing.log", BANNER * 3, None, id="no metric lines"),
    ],
)
def test_sniffing_edge_cases(tmp_path, name, text, expected):
    path = tmp_path / name
    path.write_text(text)
    assert format_of(path) == expected


_piece = st.sampled_from
_MEGATRON_LINES = st.tuples(
    _piece(["", " ", "x", "|", "| loss |", "loss", "xiteration 1/2 ", "iteration 3/4 ", "ITERATION 5/ 6 | "]),  # what comes before
    _piece(["iteration", "ITERATION", "Iteration", "iteratio", "iterations", "ıteration", "İTERATION", "ITERATİON", "iTeRaTiOn", "itεration"]),
    _piece([" ", "  ", "\t", ""]),
    _piece(["12", "7", "", "x"]),
    _piece(["/", " / ", "/ ", " /", ""]),
    _piece(["1200", "9", "", " "]),
    _piece(["", " ", " | ", "|", " x ", " | x | "]),
    _piece(["", "lm ", "LM "]),
    _piece(["loss", "LOSS", "Loss", "los", "ſ", "loſs", ""]),
    _piece(["", " |", ": 2.0", " | loss", "|LOSS"]),
).map("".join)


@settings(max_examples=1500, deadline=None)
@given(_MEGATRON_LINES)
def test_the_megatron_line_test_claims_what_its_regex_claims(line):
    """The line test is the regex `ITERATION.*\\|.*loss` (case-blind) without its backtracking."""
    regex = re.compile(megatron.ITERATION + r".*\|.*loss", re.IGNORECASE)
    assert bool(megatron.FORMAT.line(line)) == bool(regex.search(line))
