"""A run whose loss rules judge nothing because no metric of it is read as the loss says so, rather
than a silent "no spike" (a run that logs only its validation losses; a loss logged in parts is
judged as their sum: tests/test_loss_parts.py)."""

from __future__ import annotations

import json

from .conftest import run_lossguard, run_lossguard_in_process


YOLO_KEYS = ("train/box_loss", "train/cls_loss", "train/dfl_loss", "metrics/precision(B)", "metrics/recall(B)", "metrics/mAP50(B)",
             "metrics/mAP50-95(B)", "val/box_loss", "val/cls_loss", "val/dfl_loss", "lr/pg0", "lr/pg1", "lr/pg2")
"""What a detection training's save_metrics writes after `epoch,time`: its loss items, the
validator's metrics and losses, each param group's lr."""
VALIDATION_ONLY = tuple(k for k in YOLO_KEYS if not k.startswith("train/"))
"""A results.csv of a run that logs no training loss at all (its losses are the validator's)."""


def yolo_results(rows: int = 30, spike_at: int = 20, *, factor: float = 3.0, nan_at: int | None = None, val_spike_at: int | None = None,
                 keys: tuple[str, ...] = YOLO_KEYS) -> str:
    """ultralytics/engine/trainer.py, BaseTrainer.save_metrics: the header `epoch,time,<keys>` once,
    then `%.6g,` of epoch + 1, the time and the values, ',' stripped at the end. The box loss is
    `factor` times itself at `spike_at`; the cls loss is NaN at `nan_at`; the validator's box loss
    spikes at `val_spike_at` (default: with the training's)."""
    out = [("%s," * (len(keys) + 2) % ("epoch", "time", *keys)).rstrip(",")]
    for epoch in range(1, rows + 1):
        box = 1.5 - 0.02 * epoch
        value = {
            "train/box_loss": box * (factor if epoch == spike_at else 1.0),
            "train/cls_loss": float("nan") if epoch == nan_at else 2.5 - 0.04 * epoch,
            "train/dfl_loss": 1.3 - 0.01 * epoch,
            "metrics/precision(B)": 0.6, "metrics/recall(B)": 0.4, "metrics/mAP50(B)": 0.3, "metrics/mAP50-95(B)": 0.2,
            "val/box_loss": box * 1.1 * (factor if epoch == (spike_at if val_spike_at is None else val_spike_at) else 1.0),
            "val/cls_loss": 2.6, "val/dfl_loss": 1.4, "lr/pg0": 0.003, "lr/pg1": 0.003, "lr/pg2": 0.003,
        }
        out.append(("%.6g," * (len(keys) + 2) % (epoch, 45.2 * epoch, *(value[k] for k in keys))).rstrip(","))
    return "\n".join(out) + "\n"


def test_a_run_with_no_metric_read_as_the_loss_says_its_loss_rules_judged_nothing(tmp_path):
    run = tmp_path / "runs" / "detect" / "train"
    run.mkdir(parents=True)
    (run / "results.csv").write_text(yolo_results(keys=VALIDATION_ONLY))  # (validation losses are never summed into it)
    res = run_lossguard_in_process("scan", str(tmp_path / "runs"), "--format", "json")
    assert res.returncode == 0, res.stderr
    (report,) = json.loads(res.stdout)["runs"]
    assert report["spikes"] == []
    assert [w["kind"] for w in report["warnings"] if w["kind"] != "read"] == ["no_loss"]
    table = run_lossguard_in_process("scan", str(tmp_path / "runs"))
    assert "no loss to judge" in table.stdout and "no loss in this run" in table.stdout


def test_the_alias_the_warning_names_judges_the_part_it_names(tmp_path):
    run = tmp_path / "runs" / "train"
    run.mkdir(parents=True)
    (run / "results.csv").write_text(yolo_results())
    config = tmp_path / "lossguard.toml"
    config.write_text('[aliases]\nloss = ["train/box_loss"]\n')
    res = run_lossguard_in_process("scan", str(tmp_path / "runs"), "--config", str(config), "--format", "json")
    assert res.returncode == 1, res.stderr
    (report,) = json.loads(res.stdout)["runs"]
    assert [(s["metric"], s["step"]) for s in report["spikes"]] == [("loss", 20)]
    assert "no_loss" not in [w["kind"] for w in report["warnings"]]


def test_a_run_with_no_loss_to_judge_is_said_on_stderr_and_fails_strict_as_an_unreadable_file_does(tmp_path):
    run = tmp_path / "runs" / "detect" / "train"
    run.mkdir(parents=True)
    (run / "results.csv").write_text(yolo_results(keys=VALIDATION_ONLY))
    res = run_lossguard_in_process("scan", str(tmp_path / "runs"), "--format", "json")
    assert res.returncode == 0
    assert "warning: detect/train/results: no loss in this run" in res.stderr
    strict = run_lossguard("scan", str(tmp_path / "runs"), "--strict", "--quiet")
    assert strict.returncode == 2, strict.stderr
    # A run beside it with a loss and a spike: findings say 1, and --strict still says 2.
    other = tmp_path / "runs" / "lm"
    other.mkdir()
    (other / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "loss": 9.0 if s == 15 else 2.0}) + "\n" for s in range(1, 30)))
    assert run_lossguard_in_process("scan", str(tmp_path / "runs"), "--quiet").returncode == 1
    assert run_lossguard_in_process("scan", str(tmp_path / "runs"), "--quiet", "--strict").returncode == 2
