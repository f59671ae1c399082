"""Progress bars in console logs (formats/progress_bars.py): Keras' model.fit bar, in files Keras
itself wrote (tests/fixtures/keras) and as its Progbar draws itself, and Lightning's tqdm bar drawn
by the real tqdm through Lightning's bar class (tests/bar_samples.py)."""

from __future__ import annotations

import json
import math

import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lossguard.ingest.cursor import Cursor
from lossguard.ingest.reader import ReadOptions, read, read_paths

from . import bar_samples, synth
from .conftest import FIXTURES, run_lossguard
from .test_incremental import _grow_and_read

KERAS = FIXTURES / "keras"


def _read(path):
    frame, results, problems = read_paths([path], ReadOptions())
    assert results[0].format == "progress_bars"
    return frame, [p.message for p in problems]


def _points(frame, metric):
    return frame.filter(pl.col("metric") == metric).select("step", "value").rows()


def test_a_keras_fit_log_is_read_at_epoch_times_batches_plus_the_batch_with_the_epochs_validation_at_its_end():
    frame, problems = _read(KERAS / "keras3_fit_verbose1.log")
    assert problems == []
    loss = _points(frame, "loss")
    assert [s for s, _ in loss] == list(range(1, 121))  # 3 epochs of 40 batches, each drawn once
    assert [s for s, _ in _points(frame, "eval_loss")] == [40, 80, 120]
    assert dict(loss)[64] == 8732.499  # the bad batch (the second epoch's 24th), as the bar shows it
    assert {"mae", "val_mae"} <= set(frame.get_column("tag").to_list())


def test_keras_verbose_2_lines_hold_the_values_its_bar_shows_at_each_epochs_end():
    """The same fit with verbose=2 (a line an epoch) and verbose=1: Keras' own two outputs agree
    on every epoch, and lossguard reads them at the same steps."""
    bars, _ = _read(KERAS / "keras3_fit_verbose1.log")
    lines, problems = _read(KERAS / "keras3_fit_verbose2.log")
    assert problems == []
    ends = bars.filter(pl.col("step").is_in([40, 80, 120])).select("step", "tag", "value").sort("step", "tag")
    assert lines.select("step", "tag", "value").sort("step", "tag").equals(ends)
    assert ends.height == 12


def test_scan_finds_the_bad_batch_keras_logged(tmp_path):
    res = run_lossguard("scan", str(KERAS / "keras3_fit_verbose1.log"), "--format", "json", timeout=120)
    assert res.returncode == 1, res.stderr
    (report,) = json.loads(res.stdout)["runs"]
    assert [(s["metric"], s["step"]) for s in report["spikes"]] == [("loss", 64)]


WRITERS = {"keras3": bar_samples.keras3, "tf_keras": bar_samples.tf_keras, "lightning": bar_samples.lightning}


@pytest.mark.parametrize("name", sorted(WRITERS))
def test_a_loss_spike_drawn_by_a_progress_bar_is_found_by_scan(tmp_path, name):
    run = tmp_path / name
    run.mkdir()
    (run / "train.log").write_text(WRITERS[name](synth.curves("bad_batch")))
    res = run_lossguard("scan", str(run), "--format", "json", timeout=120)
    assert res.returncode == 1, res.stderr
    (report,) = json.loads(res.stdout)["runs"]
    assert ("loss", 701) in [(s["metric"], s["step"]) for s in report["spikes"]]  # synth's bad batch


def test_lightnings_bar_gives_each_batch_its_own_value_once_and_a_validation_loss_once(tmp_path):
    """Lightning draws a batch twice (its count with the previous batch's postfix, then the new
    postfix), and the postfix keeps the last validation loss for the epoch after it: neither is a
    new value."""
    curves = synth.curves("clean", steps=650)
    path = tmp_path / "train.log"
    path.write_text(bar_samples.lightning(curves, per_epoch=300))
    frame, problems = _read(path)
    assert problems == []
    loss = _points(frame, "loss")
    assert [s for s, _ in loss] == list(range(1, 651))
    assert all(math.isclose(v, c, rel_tol=5e-3) for (_, v), c in zip(loss, curves["loss"].tolist()))  # (tqdm's 3 digits)
    assert [s for s, _ in _points(frame, "eval_loss")] == [300, 600, 650]


def test_a_bar_with_no_validation_values_and_an_epoch_header_read_before_is_read_on_at_its_epoch(tmp_path):
    """A read that starts past Keras' `Epoch 2/3` line places the bar's states in epoch 2 (the
    cursor keeps the epoch); tqdm values drawn before the read are not taken again."""
    text = bar_samples.keras3({"step": [1, 2, 3, 4], "loss": [2.0, 1.9, 1.8, 1.7]}, per_epoch=2)
    path = tmp_path / "fit.log"
    head, tail = text.split("Epoch 2/2\n")
    path.write_text(head + "Epoch 2/2\n")
    first = read(path, Cursor(), run="r", fmt="progress_bars", final=False, options=ReadOptions())
    assert first.cursor.epoch == 2
    with open(path, "a") as fh:
        fh.write(tail)
    then = read(path, first.cursor, run="r", fmt="progress_bars", final=True, options=ReadOptions())
    assert then.frame.filter(pl.col("tag") == "loss").select("step", "value").rows() == [(3, 1.8), (4, 1.7)]


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=st.sampled_from(sorted(WRITERS)), fractions=st.lists(st.floats(0, 1), max_size=8))
def test_progress_bars_read_in_pieces_equal_one_read(tmp_path, name, fractions):
    """Over whole lines of several epochs (a Lightning bar's line ends at each validation): the
    epoch and the values a postfix showed go on in the cursor."""
    data = WRITERS[name](synth.curves("clean", steps=130), per_epoch=40).encode()
    whole_path = tmp_path / f"whole-{name}.log"
    whole_path.write_bytes(data)
    whole = read(whole_path, Cursor(), run="r", fmt="progress_bars", final=True, options=ReadOptions())
    grown, cursor = _grow_and_read(tmp_path / f"{name}.log", data, [int(f * len(data)) for f in fractions], "progress_bars")
    assert whole.frame.filter(pl.col("metric") == "loss").height == 130
    assert grown.drop("source").equals(whole.frame.drop("source"))
    assert cursor.offset == len(data)
