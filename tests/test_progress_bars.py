"""Progress bars in console logs (formats/progress_bars.py): Keras' model.fit bar, in files Keras
itself wrote (tests/fixtures/keras) and as its Progbar draws itself, and Lightning's tqdm bar drawn
by the real tqdm through Lightning's bar class (tests/bar_samples.py)."""

from __future__ import annotations

import json
import math
import time

import numpy as np
import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lossguard.ingest.cursor import Cursor
from lossguard.ingest.reader import ReadOptions, read, read_paths

from . import bar_samples, synth
from .conftest import FIXTURES, run_lossguard, run_lossguard_in_process
from .test_incremental import _grow_and_read
from .test_watch import NO_PLOTS, Watch

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
    res = run_lossguard_in_process("scan", str(run), "--format", "json")
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


def test_a_validations_values_are_read_once_each_validation_whatever_their_names_and_even_when_equal(tmp_path):
    """Lightning's postfix keeps a validation's values for the batches after it: `acc` and
    `dev_loss` hold no eval word to tell them by, and a validation may print the values of the one
    before (tqdm's 3 digits). Each is read once a validation, at its step; the training loss, which
    a batch logs, at every batch."""
    curves = synth.curves("clean", steps=90)
    path = tmp_path / "train.log"
    path.write_text(bar_samples.lightning(curves, per_epoch=30, validation=lambda e: {"acc": 0.9, "dev_loss": 2.0 + e / 1000, "val_loss": 1.0}))
    frame, problems = _read(path)
    assert problems == []
    for tag in ("acc", "dev_loss", "val_loss"):
        assert frame.filter(pl.col("tag") == tag).get_column("step").to_list() == [30, 60, 90], tag
    assert [s for s, _ in _points(frame, "loss")] == list(range(1, 91))


def test_a_bar_of_unknown_length_counts_on_from_the_epochs_before(tmp_path):
    """An iterable loader's bar shows `i/?`: epoch E's batches go on from where the epochs before
    it ended (each as long as its last count)."""
    curves = synth.curves("clean", steps=75)
    path = tmp_path / "train.log"
    path.write_text(bar_samples.lightning(curves, per_epoch=30, known=False))
    frame, problems = _read(path)
    assert problems == []
    assert [s for s, _ in _points(frame, "loss")] == list(range(1, 76))
    assert [s for s, _ in _points(frame, "eval_loss")] == [30, 60, 75]


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


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=st.sampled_from([*sorted(WRITERS), "keras_real", "lightning_unknown", "nemo"]), fractions=st.lists(st.floats(0, 1), max_size=8))
def test_progress_bars_read_in_pieces_equal_one_read(tmp_path, name, fractions):
    """Cut anywhere, a read ends at the last carriage return or newline: the epoch, the last state
    read and the values a postfix showed go on in the cursor (a batch's two draws, or an epoch's
    last state and its redraw with the validation's values, may fall in two reads)."""
    if name == "keras_real":
        data = (KERAS / "keras3_fit_verbose1.log").read_bytes()
    elif name == "lightning_unknown":
        data = bar_samples.lightning(synth.curves("clean", steps=130), per_epoch=40, known=False).encode()
    elif name == "nemo":
        data = bar_samples.nemo(synth.curves("clean", steps=130), max_steps=1000).encode()
    else:
        data = WRITERS[name](synth.curves("clean", steps=130), per_epoch=40).encode()
    whole_path = tmp_path / f"whole-{name}.log"
    whole_path.write_bytes(data)
    whole = read(whole_path, Cursor(), run="r", fmt="progress_bars", final=True, options=ReadOptions())
    grown, cursor = _grow_and_read(tmp_path / f"{name}.log", data, [int(f * len(data)) for f in fractions], "progress_bars")
    assert whole.frame.filter(pl.col("metric") == "loss").height == (120 if name == "keras_real" else 130)
    assert grown.drop("source").equals(whole.frame.drop("source"))
    assert cursor.offset == len(data)


def _keras3_state(i: int, n: int | str, loss: float) -> str:
    """A Keras 3 bar state (Progbar.update), as bar_samples draws it, without its colours; with no
    target, `%7d/Unknown` and no bar."""
    bar = f"{i:>7d}/Unknown" if n == "Unknown" else f"{i:>3d}/{n} " + "━" * 20
    return f"\r{bar} 1s 12ms/step - loss: {loss:.4f}"


def test_an_evaluation_after_the_fit_is_not_read_as_its_last_epoch_and_a_fit_line_cut_by_a_warning_goes_on(tmp_path):
    """model.evaluate draws the same bar with no Epoch line before it (its count starts again): it
    overwrote the last epoch's losses. A warning printed into the bar's line mid-epoch cuts it in
    two, and the rest of the epoch is still the fit's."""
    fit = "Epoch 1/2\n" + "".join(_keras3_state(i, 4, 2.0 - i / 10) for i in range(1, 5)) + "\n"
    fit += "Epoch 2/2\n" + "".join(_keras3_state(i, 4, 1.5 - i / 10) for i in (1, 2)) + "\nW1204 12:00:00 warning: something\n"
    fit += "".join(_keras3_state(i, 4, 1.5 - i / 10) for i in (3, 4)) + "\n"
    evaluate = "".join(_keras3_state(i, 4, 9.0) for i in range(1, 5)) + "\n"
    path = tmp_path / "fit.log"
    path.write_text(fit + evaluate)
    frame, problems = _read(path)
    assert problems == []
    assert _points(frame, "loss") == [(1, 1.9), (2, 1.8), (3, 1.7), (4, 1.6), (5, 1.4), (6, 1.3), (7, 1.2), (8, 1.1)]


def test_a_first_epoch_of_unknown_length_is_read_at_its_batch_counts(tmp_path):
    """Keras draws `i/Unknown` until the first epoch ends (a dataset of no known length), then
    knows the epoch's length."""
    text = "Epoch 1/2\n" + "".join(_keras3_state(i, "Unknown", 3.0 - i / 10) for i in (1, 2, 3)) + "\n"
    text += "Epoch 2/2\n" + "".join(_keras3_state(i, 3, 2.0 - i / 10) for i in (1, 2, 3)) + "\n"
    path = tmp_path / "fit.log"
    path.write_text(text)
    frame, _ = _read(path)
    assert [s for s, _ in _points(frame, "loss")] == [1, 2, 3, 4, 5, 6]


@pytest.mark.parametrize("text", [
    "".join(f"{i}/100 - note: {i}\n" for i in range(20)),  # a count and a `name: value`: no bar
    "".join(f"{i} apples {0.5 + i}\n" for i in range(20)),  # a step, a word, a number: no loss split
])
def test_lines_that_only_look_like_a_bar_or_a_split_log_are_not_taken_for_one(tmp_path, text):
    from lossguard.ingest.formats.sniff import format_of

    path = tmp_path / "notes.txt"
    path.write_text(text)
    assert format_of(path) is None


def test_a_bar_still_being_drawn_is_read_up_to_its_last_redraw(tmp_path):
    """A bar's line ends only when its loop does (Lightning's, at a validation or at the end of
    training): a daemon reads its batches as they are drawn, up to the last carriage return."""
    text = bar_samples.lightning(synth.curves("clean", steps=40), per_epoch=1000, val_every_epoch=False)
    assert "\n" not in text.rstrip("\n")  # (one line: the bar's, not ended)
    drawing = text.rstrip("\n")[: text.index("| 21/1000")]
    path = tmp_path / "train.log"
    path.write_text(drawing)
    res = read(path, Cursor(), run="r", fmt="progress_bars", final=False, options=ReadOptions())
    assert res.problems == ()
    assert res.frame.filter(pl.col("metric") == "loss").get_column("step").to_list() == list(range(1, 21))


def test_the_daemon_alerts_a_spike_in_a_bar_still_being_drawn_once_and_not_again_after_kill_9(tmp_path):
    """A Lightning run with no validation: its bar's line does not end before training does. The
    daemon alerts the spike while the bar is drawn, as tqdm flushes each redraw."""
    steps = np.arange(1, 101)
    loss = 2.0 + 0.01 * np.sin(steps)
    loss[59] *= 3.0  # step 60
    text = bar_samples.lightning({"step": steps, "loss": loss}, per_epoch=1000, val_every_epoch=False).rstrip("\n")
    log = tmp_path / "runs" / "exp" / "lightning.log"
    log.parent.mkdir(parents=True)
    log.write_text("")
    w = Watch(tmp_path, env=NO_PLOTS).start()
    try:
        w.wait_settled()
        with open(log, "a") as fh:
            for piece in (text[: len(text) // 3], text[len(text) // 3 : 2 * len(text) // 3], text[2 * len(text) // 3 :]):
                fh.write(piece)
                fh.flush()
                time.sleep(0.3)
        ev = w.wait_for(lambda ev: any(e["event"] == "opened" for e in ev))
        assert [(e["run"], e["rule"], e["step"]) for e in ev if e["event"] == "opened"] == [("exp/lightning", "loss-spike", 60)]
        w.kill9()
        w.start()
        ev = w.settle()
        assert [(e["rule"], e["step"]) for e in ev if e["event"] == "opened"] == [("loss-spike", 60)]
    finally:
        err = w.stop_and_read()
    assert w.proc.returncode == 0, err


def test_a_read_ending_after_a_batchs_first_draw_reads_on_as_one_read(tmp_path):
    """From the review: a read ending inside a batch's second draw (after the first, a count's
    update of which no row is read) compared what came next with the state before the update, so a
    batch's value was taken for a new one, not its metric for one a batch logs; after the
    validation the bar's redraw took it again at its step."""
    data = bar_samples.LIGHTNING.encode()
    cuts = [data.index(b"train_loss=2.400") - 5, data.index(b"\x1b[A\r", data.index(b"Validation")) + 5]
    whole_path = tmp_path / "whole.log"
    whole_path.write_bytes(data)
    whole = read(whole_path, Cursor(), run="r", fmt="progress_bars", final=True, options=ReadOptions())
    grown, _ = _grow_and_read(tmp_path / "grown.log", data, cuts, "progress_bars")
    assert grown.drop("source").equals(whole.frame.drop("source"))


def test_nemos_bar_puts_each_value_at_the_global_step_it_was_logged_with(tmp_path):
    """NeMo 2's MegatronProgressBar draws a step's count before setting the values of the step
    (set_postfix without a refresh): each state shows the step before's values, the trainer's
    global_step among them, which is where they go; `train_step_timing in s` is one name."""
    run = tmp_path / "nemo_experiments" / "default"
    run.mkdir(parents=True)
    (run / "nemo_log_globalrank-0_localrank-0.txt").write_text(bar_samples.nemo(synth.curves("bad_batch"), max_steps=2000))
    frame, problems = _read(run / "nemo_log_globalrank-0_localrank-0.txt")
    assert problems == []
    assert [s for s, _ in _points(frame, "loss")] == list(range(0, 1200))  # (global_step from 0: the curve's steps less one)
    assert "train_step_timing in s" in set(frame.get_column("tag").to_list())
    res = run_lossguard_in_process("scan", str(tmp_path / "nemo_experiments"), "--format", "json")
    assert res.returncode == 1, res.stderr
    (report,) = json.loads(res.stdout)["runs"]
    assert ("loss", 700) in [(s["metric"], s["step"]) for s in report["spikes"]]  # synth's step 701, global_step 700


def test_a_nemo_run_resumed_past_step_100000_is_read_at_every_global_step(tmp_path):
    """From the review: from 100000 on tqdm writes no global_step exactly (`1.5e+5` is always the
    shorter), so a run resumed there fell onto one step; and at the bar's close the last step's
    values, drawn at the count before, overwrote the step before it."""
    curves = synth.curves("bad_batch", steps=800)
    path = tmp_path / "nemo_log_globalrank-0_localrank-0.txt"
    path.write_text(bar_samples.nemo(curves, max_steps=1000, resumed_at=150_000))
    frame, problems = _read(path)
    loss = _points(frame, "loss")
    assert problems == [] and len(loss) == 800
    assert [s for s, _ in loss] == list(range(loss[0][0], loss[0][0] + 800))  # (each step once, in order)
    assert abs(loss[0][0] - 150_000) < 1000  # (placed within tqdm's rounding, before any exact step)
    jumps = [b[0] - loss[0][0] for a, b in zip(loss, loss[1:]) if b[1] > 2 * a[1]]
    assert jumps == [700] and math.isclose(loss[-1][1], curves["loss"][-1], rel_tol=5e-3)  # (synth's bad batch; the last step's own value)


def _keras1_epochs(nan_at: int | None = None) -> list[list[float]]:
    """Three epochs of 300 batches of 32 of 9,595 samples, the loss falling; a NaN batch at
    `nan_at` of the second epoch."""
    epochs = [[0.7 - 0.0003 * (300 * e + b) for b in range(300)] for e in range(3)]
    if nan_at is not None:
        epochs[1][nan_at] = math.nan
    return epochs


@pytest.mark.parametrize("validate", [1000, None], ids=["with its Train on line", "counts going up by the batch size"])
def test_a_keras_1_bar_counting_samples_is_read_at_its_epochs_and_the_read_says_so(tmp_path, validate):
    """Keras 1's `9595/9595 [=====] - 3s - loss: ...` counts samples: a NaN in the second epoch is at
    step 2 (it was at "step 12827", the samples seen, and "recovered at step 19222")."""
    path = tmp_path / "train.log"
    path.write_text(bar_samples.keras1(_keras1_epochs(nan_at=100), samples=9595, batch_size=32, validate=validate))
    frame, problems = _read(path)
    loss = _points(frame, "loss")
    assert [s for s, _ in loss] == [1, 2, 3] and math.isnan(loss[1][1])
    first = _keras1_epochs()[0]
    assert loss[0][1] == pytest.approx((sum(first[:-1]) * 32 + first[-1] * 27) / 9595, abs=1e-4)  # the epoch's mean, as drawn last
    assert [s for s, _ in _points(frame, "eval_loss")] == ([1, 2, 3] if validate else [])
    (said,) = problems
    assert "counts samples, not batches" in said and "its epochs are the steps" in said


@pytest.mark.parametrize("validate", [10000, None], ids=["with its Train on line", "no validation"])
def test_keras_2_verbose_2_lines_that_count_nothing_are_read_at_their_epochs(tmp_path, validate):
    """Keras 2.0-2.2's ` - 3s - loss: 0.4948 - acc: ...` line an epoch (no count: it was unread, the
    file "no training metrics recognised"): each epoch is its step, its spike found there."""
    losses = [0.5 - 0.01 * e for e in range(30)]
    losses[19] = 3.0
    path = tmp_path / "train.log"
    path.write_text(bar_samples.keras2_verbose2(losses, validate=validate))
    frame, _ = _read(path)
    assert _points(frame, "loss") == [(e, pytest.approx(v, abs=1e-4)) for e, v in enumerate(losses, start=1)]
    assert len(_points(frame, "eval_loss")) == (30 if validate else 0)
    res = run_lossguard_in_process("scan", str(path), "--format", "json")
    (spike,) = json.loads(res.stdout)["runs"][0]["spikes"]
    assert (spike["rule"], spike["step"]) == ("loss-spike", 20)


def test_a_keras_3_bar_counting_batches_is_not_taken_for_samples():
    frame, problems = _read(KERAS / "keras3_fit_verbose2.log")
    assert problems == [] and [s for s, _ in _points(frame, "loss")] == [40, 80, 120]


def test_a_keras_1_bar_read_in_pieces_is_read_as_in_one_go_and_says_so_once(tmp_path):
    data = bar_samples.keras1(_keras1_epochs(), samples=9595, batch_size=32).encode()
    whole = read(_written(tmp_path / "whole.log", data), Cursor(), run="r", fmt="progress_bars", final=True, options=ReadOptions())
    path, cursor, frames, said = tmp_path / "grown.log", Cursor(), [], []
    path.write_bytes(b"")
    for cut in [60, 61, 3000, len(data) // 2, len(data) - 5, len(data)]:
        with open(path, "ab") as fh:
            fh.write(data[path.stat().st_size : cut])
        res = read(path, cursor, run="r", fmt="progress_bars", final=cut == len(data), options=ReadOptions())
        frames.append(res.frame)
        said += [p.message for p in res.problems]
        cursor = res.cursor
    assert pl.concat(frames).drop("source").equals(whole.frame.drop("source"))
    assert len(said) == 1 and "counts samples" in said[0]


def _written(path, data: bytes):
    path.write_bytes(data)
    return path
