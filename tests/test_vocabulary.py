"""Tags as trainers really write them -> canonical metrics; what must not map; which tag wins when
several mean one metric; and the end-to-end consequence (a grad norm found under a namespace labels
the explosion)."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import polars as pl
import pytest

from lossguard.ingest.aliases import Aliases
from lossguard.detection.engine import tags_used
from lossguard.detection.streams import preferred
from lossguard.ingest.vocabulary import RANK_AGGREGATE, RANK_CANONICAL, RANK_SPELLING, RANK_TEST, recognise

from .synth import curves

# (tag as written, canonical metric): each taken from the framework's logging code, file named.
POSITIVES = [
    # HF Transformers: src/transformers/trainer.py (_maybe_log_save_evaluate, evaluate)
    pytest.param("loss", "loss", id="hf trainer loss"),
    pytest.param("grad_norm", "grad_norm", id="hf trainer grad_norm"),
    pytest.param("learning_rate", "lr", id="hf trainer learning_rate"),
    pytest.param("eval_loss", "eval_loss", id="hf trainer eval_loss"),
    # HF Transformers: src/transformers/integrations/integration_utils.py (TensorBoardCallback, rewrite_logs)
    pytest.param("train/loss", "loss", id="hf tensorboard train/loss"),
    pytest.param("train/grad_norm", "grad_norm", id="hf tensorboard train/grad_norm"),
    pytest.param("train/learning_rate", "lr", id="hf tensorboard train/learning_rate"),
    pytest.param("eval/loss", "eval_loss", id="hf tensorboard eval/loss"),
    # Lightning: src/lightning/pytorch/callbacks/lr_monitor.py (lr-{optimizer}, /pg{n} per param group)
    pytest.param("lr-Adam", "lr", id="lightning lr-Adam"),
    pytest.param("lr-AdamW/pg1", "lr", id="lightning lr-AdamW/pg1"),
    # Lightning: core/module.py log(on_step=True, on_epoch=True) names _step/_epoch; utilities/grads.py grad_norm
    pytest.param("train_loss_step", "loss", id="lightning train_loss_step"),
    pytest.param("val_loss", "eval_loss", id="lightning val_loss"),
    pytest.param("grad_2.0_norm_total", "grad_norm", id="lightning grad_2.0_norm_total"),
    # Megatron-LM: megatron/training/training.py (training_log, evaluate_and_print_results: f'{key} validation')
    pytest.param("lm loss", "loss", id="megatron lm loss"),
    pytest.param("grad-norm", "grad_norm", id="megatron grad-norm"),
    pytest.param("learning-rate", "lr", id="megatron learning-rate"),
    pytest.param("loss-scale", "loss_scale", id="megatron loss-scale"),
    pytest.param("lm loss validation", "eval_loss", id="megatron lm loss validation"),
    # DeepSpeed: deepspeed/runtime/engine.py summary_events, docs/_tutorials/monitor.md
    pytest.param("Train/Samples/train_loss", "loss", id="deepspeed Train/Samples/train_loss"),
    pytest.param("Train/Samples/lr", "lr", id="deepspeed Train/Samples/lr"),
    pytest.param("Train/Samples/loss_scale", "loss_scale", id="deepspeed Train/Samples/loss_scale"),
    # torchtitan: torchtitan/components/metrics.py (MetricsProcessor.log), components/validate.py
    pytest.param("loss_metrics/global_avg_loss", "loss", id="torchtitan loss_metrics/global_avg_loss"),
    pytest.param("validation_metrics/loss", "eval_loss", id="torchtitan validation_metrics/loss"),
    # OLMo-core: train/train_module/transformer/train_module.py, train/callbacks/grad_clipper.py, scheduler callback
    pytest.param("train/CE loss", "loss", id="olmo-core train/CE loss"),
    pytest.param("optim/total grad norm", "grad_norm", id="olmo-core optim/total grad norm"),
    pytest.param("optim/LR (group 0)", "lr", id="olmo-core optim/LR (group 0)"),
    # OLMo-core's LMEvaluatorCallback (train/callbacks/evaluator_callback.py): `eval/{evaluator}/{set} {metric}`
    # in its console and trackers: the eval loss, not nothing (and never the training loss).
    pytest.param("eval/lm/c4_en-validation/CE loss", "eval_loss", id="olmo-core eval/lm/<set>/CE loss"),
    # OLMo: olmo/train.py (train_step, log_metrics_to_console)
    pytest.param("train/CrossEntropyLoss", "loss", id="olmo train/CrossEntropyLoss"),
    pytest.param("optim/total_grad_norm", "grad_norm", id="olmo optim/total_grad_norm"),
    pytest.param("optim/learning_rate_group0", "lr", id="olmo optim/learning_rate_group0"),
    # Levanter: src/levanter/callbacks.py, src/levanter/optim (grad/norm/total), src/levanter/eval.py
    pytest.param("train/loss", "loss", id="levanter train/loss"),
    pytest.param("optim/learning_rate", "lr", id="levanter optim/learning_rate"),
    pytest.param("grad/norm/total", "grad_norm", id="levanter grad/norm/total"),
    # nanotron: src/nanotron/trainer.py (LogItem list in train_step_logs)
    pytest.param("lm_loss", "loss", id="nanotron lm_loss"),
    pytest.param("lr", "lr", id="nanotron lr"),
    # Composer / llm-foundry: composer/trainer/trainer.py, callbacks/lr_monitor.py, callbacks/optimizer_monitor.py
    pytest.param("loss/train/total", "loss", id="composer loss/train/total"),
    pytest.param("lr-DecoupledAdamW/group0", "lr", id="composer lr-DecoupledAdamW/group0"),
    pytest.param("l2_norm/grad/global", "grad_norm", id="composer l2_norm/grad/global"),
    pytest.param("metrics/eval/LanguageCrossEntropy", "eval_loss", id="composer metrics/eval/LanguageCrossEntropy"),
    # fairseq: fairseq_cli/train.py + fairseq/trainer.py (metrics.log_scalar), JSON progress bar
    pytest.param("gnorm", "grad_norm", id="fairseq gnorm"),
    pytest.param("loss_scale", "loss_scale", id="fairseq loss_scale"),
    pytest.param("valid_loss", "eval_loss", id="fairseq valid_loss"),
    # MMEngine: mmengine/optim/optimizer/optimizer_wrapper.py ('train/grad_norm' in the message hub),
    # runner/log_processor.py (logged without the train/ prefix: loss, lr, grad_norm)
    pytest.param("train/grad_norm", "grad_norm", id="mmengine message hub train/grad_norm"),
    pytest.param("grad_norm", "grad_norm", id="mmengine grad_norm"),
    # NeMo: nemo/collections/nlp/models/language_modeling/megatron_gpt_model.py, megatron_bert_model.py
    pytest.param("reduced_train_loss", "loss", id="nemo reduced_train_loss"),
    pytest.param("train_loss", "loss", id="nemo train_loss"),
    # Keras: keras/src/callbacks/csv_logger.py (logs keys), keras/src/callbacks/tensorboard.py ("epoch_" + name)
    pytest.param("epoch_loss", "loss", id="keras tensorboard epoch_loss"),
    pytest.param("epoch_learning_rate", "lr", id="keras tensorboard epoch_learning_rate"),
    # timm: timm/utils/summary.py update_summary ('train_' + k, 'eval_' + k, lr)
    pytest.param("train_loss", "loss", id="timm train_loss"),
    pytest.param("eval_loss", "eval_loss", id="timm eval_loss"),
    # A namespace the old list never had.
    pytest.param("optim/grad_norm", "grad_norm", id="optim/grad_norm"),
    pytest.param("optimizer/lr", "lr", id="optimizer/lr"),
    pytest.param("trainer/loss", "loss", id="trainer/loss"),
    pytest.param("metrics/loss", "loss", id="metrics/loss"),
    pytest.param("Train Loss", "loss", id="case and spaces"),
    # Ray Tune: ray/tune/logger/tensorboardx.py (TBXLoggerCallback: "/".join(["ray", "tune"] + path))
    pytest.param("ray/tune/loss", "loss", id="ray tune loss"),
    pytest.param("ray/tune/lr", "lr", id="ray tune lr"),
    # Step times. Megatron-LM: megatron/training/training.py (training_log)
    pytest.param("elapsed time per iteration (ms)", "step_time", id="megatron elapsed time per iteration"),
    pytest.param("elapsed time per iteration (s)", "step_time", id="megatron-deepspeed (bloom) in seconds"),
    # nanoGPT: train.py (`time {dt*1000:.2f}ms`); build-nanogpt: train_gpt2.py (`dt {dt*1000:.2f}ms`)
    pytest.param("time", "step_time", id="nanogpt time"),
    pytest.param("dt", "step_time", id="build-nanogpt dt"),
    # Lightning / NeMo: nemo/utils/exp_manager.py (TimingCallback logs train_step_timing)
    pytest.param("train_step_timing in s", "step_time", id="nemo train_step_timing in s"),
    pytest.param("train_step_timing", "step_time", id="nemo train_step_timing"),
    pytest.param("iter_time", "step_time", id="iter time"),
    # Throughput. torchtitan: torchtitan/train.py (`tps`, `mfu`); OLMo-core: train/callbacks/speed_monitor.py
    pytest.param("tps", "throughput", id="torchtitan tps"),
    pytest.param("mfu", "throughput", id="nanogpt and torchtitan mfu"),
    pytest.param("throughput/device/TPS", "throughput", id="olmo-core device tps"),
    pytest.param("throughput/device/MFU", "throughput", id="olmo-core device mfu"),
    pytest.param("tok/sec", "throughput", id="build-nanogpt tok/sec"),
    pytest.param("tokens/s", "throughput", id="tokens/s"),
    pytest.param("samples per second", "throughput", id="megatron-deepspeed samples per second"),
    pytest.param("TFLOPs", "throughput", id="megatron-deepspeed TFLOPs"),
    pytest.param("throughput per GPU (TFLOP/s/GPU)", "throughput", id="megatron-lm throughput per gpu"),
]

# Tags that must NOT become the metric they resemble: (tag, what it may be instead, or None).
NEGATIVES = [
    pytest.param("grad_norm_clip", None, id="a clip threshold, not the norm"),
    pytest.param("clip", None, id="clip alone"),
    pytest.param("eval/loss", "eval_loss", id="eval loss is eval_loss"),
    pytest.param("val_loss", "eval_loss", id="val_loss is eval_loss, never loss"),
    pytest.param("test_loss", "eval_loss", id="test_loss is eval_loss, never loss"),
    pytest.param("loss_scale", "loss_scale", id="loss_scale is never the loss"),
    pytest.param("num_nan_iterations", None, id="nan counter"),
    pytest.param("number of nan iterations", None, id="megatron nan counter (read by the labeller as a tag)"),
    pytest.param("skipped iterations", None, id="skipped counter"),
    pytest.param("moe_aux_loss", None, id="moe auxiliary loss"),
    pytest.param("z_loss", None, id="z-loss"),
    pytest.param("aux_loss", None, id="auxiliary loss"),
    pytest.param("train/Z loss", None, id="olmo-core Z loss"),
    pytest.param("reduced_lm_train_loss", None, id="nemo bert lm component"),
    pytest.param("nll_loss", None, id="fairseq nll_loss beside the label-smoothed loss"),
    pytest.param("loss_cls", None, id="mmengine loss component"),
    pytest.param("tokens_per_sec", "throughput", id="a rate of tokens is the run's pace, never a loss"),
    pytest.param("throughput/total tokens", None, id="olmo-core token count, no rate"),
    pytest.param("train_time", None, id="modded-nanogpt time since the start, no step's time"),
    pytest.param("step_avg", None, id="modded-nanogpt running mean of every step so far"),
    pytest.param("train_runtime", None, id="hf whole-run runtime"),
    pytest.param("train_samples_per_second", None, id="hf whole-run summary rate"),
    pytest.param("eval_samples_per_second", None, id="an evaluation's rate, not training's"),
    pytest.param("epoch_time", None, id="an epoch's time, no step's"),
    pytest.param("lr_scale", None, id="a layer-decay multiplier, not the lr"),
    pytest.param("base_lr", None, id="mmengine base_lr"),
    pytest.param("lr-Adam-momentum", None, id="lightning momentum"),
    pytest.param("lr-AdamW-weight_decay", None, id="lightning weight decay"),
    pytest.param("lm loss vs samples", None, id="megatron x axis in samples"),
    pytest.param("grad-norm vs samples", None, id="megatron grad norm against samples"),
    pytest.param("params-norm", None, id="megatron params norm"),
    pytest.param("loss_metrics/global_max_loss", None, id="torchtitan max over ranks"),
    pytest.param("grad/norm/lm_head.weight", None, id="levanter per-parameter norm"),
    pytest.param("l2_norm/grad/module.2.weight", None, id="composer per-parameter norm"),
    pytest.param("train/train_loss", None, id="hf end-of-run summary"),
    pytest.param("metrics/train/LanguageCrossEntropy", None, id="composer train metric"),
    pytest.param("lm loss validation ppl", None, id="megatron validation perplexity"),
    pytest.param("eval/grad_norm", None, id="no eval grad norm"),
]


@pytest.mark.parametrize("tag,metric", POSITIVES)
def test_a_real_trainer_spelling_is_recognised(tag, metric):
    assert Aliases.default().metric_of(tag) == metric


@pytest.mark.parametrize("tag,instead", NEGATIVES)
def test_a_look_alike_tag_does_not_become_that_metric(tag, instead):
    found = recognise(tag)
    assert (found.metric if found else None) == instead


def test_the_tables_are_as_large_as_the_issue_asks():
    assert len(POSITIVES) >= 40 and len(NEGATIVES) >= 10


@pytest.mark.parametrize(
    "tags,expected",
    [
        pytest.param(["train/loss_epoch", "loss"], {"loss": "loss"}, id="loss beats train/loss_epoch"),
        pytest.param(["train_loss_epoch", "train_loss_step"], {"loss": "train_loss_step"}, id="_step beats _epoch"),
        pytest.param(["loss_epoch"], {"loss": "loss_epoch"}, id="an aggregate alone is the loss"),
        pytest.param(["train/loss", "loss"], {"loss": "loss"}, id="canonical beats namespaced"),
        pytest.param(["lr", "optim/LR (group 0)"], {"lr": "lr"}, id="lr beats a group's lr"),
        pytest.param(["val_loss", "test_loss"], {"eval_loss": "val_loss"}, id="validation beats test"),
        pytest.param(["val_loss", "loss"], {"eval_loss": "val_loss", "loss": "loss"}, id="eval never competes with loss"),
        pytest.param(["epoch_loss", "batch_loss"], {"loss": "batch_loss"}, id="keras batch beats epoch"),
        pytest.param(["OVERFLOW loss scale", "loss scale", "lm loss"], {"loss": "lm loss", "loss_scale": "OVERFLOW loss scale"}, id="equal ranks: most points, then first"),
    ],
)
def test_precedence_within_one_run(tags, expected):
    """Every tag means its metric on its own (so a log read in pieces gets the table one read
    gets); the stream is read from the best ranked tag, then the one with most points."""
    mapping = Aliases.default().mapping(tags)
    frame = pl.DataFrame(
        {"metric": [mapping[t] for t in tags for _ in range(3)], "tag": [t for t in tags for _ in range(3)],
         "step": [s for _ in tags for s in range(3)], "value": [1.0] * (3 * len(tags))},
    )
    assert tags_used(frame) == expected


def test_user_aliases_come_first_even_over_the_canonical_name():
    aliases = Aliases.build({"loss": ["objective/ce"], "grad_norm": ["optim/gn_*"]})
    assert aliases.mapping(["objective/ce", "train/loss", "optim/gn_total"]) == {
        "objective/ce": "loss", "train/loss": "loss", "optim/gn_total": "grad_norm",
    }
    assert preferred("loss", [("train/loss", 100), ("objective/ce", 10)]) == "objective/ce"
    # A user alias may also take a tag away from the vocabulary's choice.
    assert Aliases.build({"eval_loss": ["train_loss"]}).metric_of("train_loss") == "eval_loss"


def test_the_ranks_are_in_the_documented_order():
    assert recognise("loss").rank == RANK_CANONICAL
    assert recognise("train/loss").rank == recognise("train_loss_step").rank == RANK_SPELLING
    assert recognise("test/loss").rank == RANK_TEST
    assert recognise("train/loss_epoch").rank == recognise("epoch_loss").rank == RANK_AGGREGATE


def _write_jsonl(path, tags: dict[str, str], scenario: str) -> None:
    c = curves(scenario)
    with path.open("w") as out:
        for i, step in enumerate(c["step"]):
            out.write(json.dumps({"step": int(step), **{tag: float(c[key][i]) for tag, key in tags.items()}}) + "\n")


def _scan(path) -> dict:
    done = subprocess.run([sys.executable, "-m", "lossguard.cli", "scan", str(path), "--format", "json"], capture_output=True, text=True, timeout=120)
    assert done.returncode in (0, 1), done.stderr
    return json.loads(done.stdout)


@pytest.mark.parametrize(
    "tags",
    [
        pytest.param({"loss": "loss", "optim/grad_norm": "grad_norm", "lr": "lr"}, id="the issue: only the grad norm namespaced"),
        pytest.param({"train/CE loss": "loss", "optim/grad_norm": "grad_norm", "optim/LR (group 0)": "lr"}, id="olmo-core style names"),
    ],
)
def test_a_grad_norm_logged_as_optim_grad_norm_labels_the_explosion(tmp_path, tags):
    # Before words were read, optim/grad_norm was no grad norm and this spike's cause was "unknown".
    run = tmp_path / "run"
    run.mkdir()
    _write_jsonl(run / "metrics.jsonl", tags, "gradient_explosion")
    (analysed,) = _scan(tmp_path)["runs"]
    assert analysed["metrics"]["grad_norm"] == "optim/grad_norm"
    assert set(analysed["metrics"].values()) == set(tags)
    loss_spikes = [s for s in analysed["spikes"] if s["metric"] == "loss"]
    assert loss_spikes and loss_spikes[0]["causes"][0]["cause"] == "gradient_explosion"


def test_read_table_says_which_tag_each_metric_came_from(tmp_path):
    log = tmp_path / "metrics.jsonl"
    log.write_text(
        '{"step": 1, "train/CE loss": 2.5, "optim/total grad norm": 1.0, "optim/LR (group 0)": 0.001, "train/Z loss": 0.1}\n'
        '{"step": 2, "train/CE loss": 2.4, "optim/total grad norm": 0.9, "optim/LR (group 0)": 0.001, "train/Z loss": 0.1}\n'
    )
    done = subprocess.run([sys.executable, "-m", "lossguard.cli", "read", str(log), "--format", "table"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "metrics (metrics): loss <- train/CE loss, lr <- optim/LR (group 0), grad_norm <- optim/total grad norm"
    assert lines[1] == ""
    assert lines[2].split() == ["run", "source", "step", "metric", "tag", "value", "wall_time"]
    # The tag no metric claimed is there under its own name.
    assert any(re.search(r"  train/Z loss +train/Z loss  ", line) for line in lines[3:])


def test_read_csv_and_json_carry_no_mapping_block(tmp_path):
    log = tmp_path / "metrics.jsonl"
    log.write_text('{"step": 1, "train/loss": 2.0, "optim/grad_norm": 1.0}\n')
    for fmt in ("csv", "json"):
        done = subprocess.run([sys.executable, "-m", "lossguard.cli", "read", str(log), "--format", fmt], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0 and "<-" not in done.stdout and "grad_norm" in done.stdout
