"""A run whose event files are written by several writers, each into a folder of its own below the
run's: keras.callbacks.TensorBoard's `train/` and `validation/`, and SummaryWriter.add_scalars' key
folders. One run, the validation's metrics its eval metrics. Written by tensorboardX's
SummaryWriter: add_scalars itself for its folders (`<logdir>/<main tag>/<key>/`); torch's
add_scalars, whose folders are `<logdir>/<main tag with / as _>_<key>/` (torch/utils/tensorboard/
writer.py, torch not installed here), and Keras' layout and tag names (keras/src/callbacks/
tensorboard.py: `_train_dir`/`_val_dir`, `"epoch_" + name`, `f"evaluation_{name}_vs_iterations"`,
Keras not installed here) by SummaryWriters into those folders."""

from __future__ import annotations

import json
import math
from pathlib import Path

import polars as pl
import pytest

from lossguard.cli import main
from lossguard.ingest.discover import collect
from lossguard.ingest.reader import read_paths

SPIKE, STEPS = 222, 300


def _loss(step: int) -> float:
    return 50.0 if step == SPIKE else 2.0 * math.exp(-step / 100) + 0.01 * (step % 5)


def _writer(folder: Path):
    from tensorboardX import SummaryWriter

    return SummaryWriter(str(folder))


def _scan(capsys, path: Path) -> tuple[int, dict]:
    code = main(["scan", str(path), "--format", "json", "--quiet"])
    return code, json.loads(capsys.readouterr().out)


def _one_run_judged(capsys, root: Path, run: str, metrics: dict[str, str], spike: int) -> None:
    code, report = _scan(capsys, root)
    assert code == 1
    assert [r["run"] for r in report["runs"]] == [run]
    (found,) = report["runs"]
    assert found["metrics"] == metrics
    assert [(s["step"], s["metric"]) for s in found["spikes"]] == [(spike, "loss")]
    assert found["warnings"] == []


def test_add_scalars_folders_are_their_runs_keys(tmp_path, capsys):
    """tensorboardX's add_scalars("loss", {"train": ..., "val": ...}): `exp1/loss/train/`, `exp1/loss/val/`."""
    writer = _writer(tmp_path / "exp1")
    for step in range(STEPS):
        writer.add_scalar("lr", 1e-3, step)
        writer.add_scalars("loss", {"train": _loss(step), "val": _loss(step) + 0.3}, step)
    writer.close()
    assert sorted(p.parent.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("events.out.tfevents*")) == ["exp1", "exp1/loss/train", "exp1/loss/val"]
    found, _ = collect([tmp_path])
    assert {f.run for f in found} == {"exp1"}
    frame, _, problems = read_paths([tmp_path])
    assert problems == []
    by_tag = {t: g.sort("step").get_column("value").to_list() for (t,), g in frame.group_by("tag")}
    assert sorted(by_tag) == ["loss/train", "loss/val", "lr"]
    assert by_tag["loss/val"] == pytest.approx([_loss(s) + 0.3 for s in range(STEPS)])
    _one_run_judged(capsys, tmp_path, "exp1", {"loss": "loss/train", "eval_loss": "loss/val", "lr": "lr"}, SPIKE)


def test_torch_add_scalars_folders_are_their_runs_keys(tmp_path, capsys):
    """torch's add_scalars("Loss", {"train": ..., "val": ...}) writes `Loss_train/`, `Loss_val/`,
    each holding `Loss`; a main tag's `/` is a `_` in its folder (`grad/norm`: `grad_norm_enc/`)."""
    run = tmp_path / "runs" / "Jan05_10-00-00_host"
    main_writer = _writer(run)
    parts = {key: _writer(run / f"Loss_{key}") for key in ("train", "val")}
    encoder = _writer(run / "grad_norm_enc")
    for step in range(STEPS):
        main_writer.add_scalar("lr", 1e-3, step)
        parts["train"].add_scalar("Loss", _loss(step), step)
        parts["val"].add_scalar("Loss", _loss(step) + 0.3, step)
        encoder.add_scalar("grad/norm", 1.0, step)
    for w in (main_writer, encoder, *parts.values()):
        w.close()
    frame, _, _ = read_paths([tmp_path])
    assert sorted(frame.get_column("tag").unique().to_list()) == ["Loss/train", "Loss/val", "grad/norm/enc", "lr"]
    _one_run_judged(capsys, tmp_path, "runs/Jan05_10-00-00_host", {"loss": "Loss/train", "eval_loss": "Loss/val", "lr": "lr"}, SPIKE)


def _keras_logs(log_dir: Path, epochs: int, *, spike: int, validation: bool = True) -> None:
    train = _writer(log_dir / "train")
    val = _writer(log_dir / "validation") if validation else None
    for epoch in range(epochs):
        loss = 40.0 if epoch == spike else 2.0 * math.exp(-epoch / 20) + 0.01 * (epoch % 5)
        train.add_scalar("epoch_loss", loss, epoch)
        train.add_scalar("epoch_learning_rate", 1e-3, epoch)
        if val is not None:
            val.add_scalar("evaluation_loss_vs_iterations", loss + 0.2, (epoch + 1) * 100)
            val.add_scalar("epoch_loss", loss + 0.2, epoch)
    train.close()
    if val is not None:
        val.close()


def test_keras_train_and_validation_folders_are_one_run(tmp_path, capsys):
    _keras_logs(tmp_path / "logs", 60, spike=44)
    frame, _, problems = read_paths([tmp_path])
    assert problems == []
    assert frame.get_column("run").unique().to_list() == ["logs"]
    metrics = dict(frame.select("tag", "metric").unique().iter_rows())
    assert metrics["validation/epoch_loss"] == "eval_loss"
    assert metrics["train/epoch_loss"] == "loss" and metrics["train/epoch_learning_rate"] == "lr"
    assert metrics["validation/evaluation_loss_vs_iterations"] == "validation/evaluation_loss_vs_iterations"  # (at iterations, not epochs: not judged)
    _one_run_judged(capsys, tmp_path, "logs", {"loss": "train/epoch_loss", "eval_loss": "validation/epoch_loss", "lr": "train/epoch_learning_rate"}, 44)


def test_a_train_folder_with_no_validation_beside_it_is_a_run_of_its_own(tmp_path):
    """YOLO's first run writes its events into runs/detect/train: a run so named, not a part."""
    _keras_logs(tmp_path / "runs" / "detect", 10, spike=5, validation=False)
    found, _ = collect([tmp_path])
    assert [f.run for f in found] == ["runs/detect/train"]
    frame, _, _ = read_paths([tmp_path])
    assert sorted(frame.get_column("tag").unique().to_list()) == ["epoch_learning_rate", "epoch_loss"]


def test_runs_side_by_side_stay_runs(tmp_path):
    """Folders of runs under a folder without an event file of its own are runs, as TensorBoard shows them."""
    for name in ("exp_1", "exp_2"):
        writer = _writer(tmp_path / "runs" / name)
        writer.add_scalar("loss", 1.0, 0)
        writer.close()
    frame, _, _ = read_paths([tmp_path])
    assert sorted(frame.select("run", "tag").unique().iter_rows()) == [("runs/exp_1", "loss"), ("runs/exp_2", "loss")]


def test_a_validation_folder_named_as_the_root_is_read_as_a_part_of_nothing_above(tmp_path):
    """Scanning a part's folder itself: the run is that folder, its tags still the part's."""
    _keras_logs(tmp_path / "logs", 5, spike=3)
    frame, _, _ = read_paths([tmp_path / "logs" / "validation"])
    assert set(frame.get_column("run").unique().to_list()) == {"validation"}
    assert frame.filter(pl.col("metric") == "eval_loss").height == 5


def test_the_daemon_alerts_a_keras_runs_spike_once_under_the_run(tmp_path):
    """`lossguard watch` (a real process) following Keras' layout as it is written: the spike of
    train/ is the run's, `logs`, alerted once."""
    from .test_watch import NO_PLOTS, Watch

    log_dir = tmp_path / "runs" / "logs"
    train, val = _writer(log_dir / "train"), _writer(log_dir / "validation")

    def epochs(start: int, stop: int, spike: int | None = None) -> None:
        for epoch in range(start, stop):
            loss = 40.0 if epoch == spike else 2.0 + 0.01 * (epoch % 5)
            train.add_scalar("epoch_loss", loss, epoch)
            train.add_scalar("epoch_learning_rate", 1e-3, epoch)
            val.add_scalar("epoch_loss", 2.2 + 0.01 * (epoch % 5), epoch)
        train.flush()
        val.flush()

    epochs(0, 40)
    w = Watch(tmp_path, env=NO_PLOTS).start()
    try:
        w.wait_ready(files=2)
        epochs(40, 55, spike=45)
        ev = w.wait_for(lambda ev: any(e["event"] == "opened" for e in ev))
        ev = w.settle()
    finally:
        err = w.stop_and_read()
        train.close()
        val.close()
    assert [(e["run"], e["metric"], e["step"]) for e in ev if e["event"] == "opened"] == [("logs", "loss", 45)], err


def test_runs_in_folders_below_a_logdir_with_an_event_file_of_its_own_stay_runs(tmp_path, capsys):
    # TensorFlow's HParams layout: hp.hparams_config writes an event file at the top of the logdir,
    # each trial logs into a folder below it. A trial's folder holds its own tags, not a main tag its
    # name is made of (as add_scalars' do): it is a run of its own, scanned from above or alone.
    logdir = tmp_path / "hparam_tuning"
    with _writer(logdir) as top:
        top.add_scalar("hparams_config", 0.0, 0)
    for trial in range(3):
        with _writer(logdir / f"run-{trial}") as w:
            for step in range(STEPS):
                w.add_scalar("loss", _loss(step) if trial == 1 else 2.0 * math.exp(-step / 100) + 0.01 * (step % 5), step)
                w.add_scalar("accuracy", 0.5, step)
    code, doc = _scan(capsys, logdir)
    assert code == 1
    by_run = {r["run"]: r for r in doc["runs"]}
    assert {"run-0", "run-1", "run-2"} <= set(by_run)
    assert [(s["metric"], s["step"]) for s in by_run["run-1"]["spikes"]] == [("loss", SPIKE)]
    code, alone = _scan(capsys, logdir / "run-1")
    assert code == 1 and alone["runs"][0]["metrics"]["loss"] == "loss"


def test_add_hparams_folder_is_part_of_its_run_as_hf_trainer_writes_it(tmp_path, capsys):
    # HF's TensorBoardCallback calls add_hparams(args, metric_dict={}) in every run: tensorboardX
    # writes it into a folder named by the time below the run's logdir, holding no scalar (or only
    # hparam/ ones). One run, as before the tags were asked.
    logdir = tmp_path / "runs" / "Dec06_host"
    with _writer(logdir) as w:
        for step in range(STEPS):
            w.add_scalar("train/loss", _loss(step), step)
        w.add_hparams({"learning_rate": 1e-3, "per_device_train_batch_size": 16}, {})
    assert [p.name for p in logdir.iterdir() if p.is_dir()]  # (the folder add_hparams made)
    code, doc = _scan(capsys, tmp_path / "runs")
    assert code == 1 and [r["run"] for r in doc["runs"]] == ["Dec06_host"]
    assert [(s["metric"], s["step"]) for s in doc["runs"][0]["spikes"]] == [("loss", SPIKE)]


def test_an_add_scalars_folder_before_its_first_scalar_is_flushed_is_already_a_part(tmp_path):
    # A writer writes its file's version record at once and its scalars after 10 events or 2 minutes:
    # a key folder holding no scalar yet is the run's part, not a run of its own to be renamed later.
    logdir = tmp_path / "exp"
    with _writer(logdir) as w:
        w.add_scalar("loss", 2.0, 0)
    from tensorboardX import SummaryWriter

    early = SummaryWriter(str(logdir / "loss_val"))  # (file created, nothing flushed but its version)
    try:
        found = {f.path.relative_to(tmp_path).as_posix(): f.run for f in collect([tmp_path])[0]}
        assert set(found.values()) == {"exp"}, found
    finally:
        early.close()
