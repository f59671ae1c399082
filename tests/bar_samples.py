"""Progress bars as a console log sent to a file holds them: Keras' (as its Progbar draws itself,
the file and function named at each) and Lightning's, drawn by the real tqdm through Lightning's
own bar class and format. Whole runs' curves (synth.curves) or small samples."""

from __future__ import annotations

import io
from numbers import Number

import numpy as np


def _keras_value(v: float) -> str:
    """keras/src/utils/progbar.py, Progbar.update: ` {avg:.4f}` if abs(avg) > 1e-3 else ` {avg:.4e}`."""
    return f" {v:.4f}" if abs(v) > 1e-3 else f" {v:.4e}"


def _batches(curves: dict, per_epoch: int):  # noqa: ANN202 - (a generator of tuples)
    """(index, batch of its epoch from 1, the epoch's last, `Epoch E/M` line before it or "") of each
    step: ProgbarLogger.on_epoch_begin's line, `Epoch {epoch + 1}/{self.epochs}`."""
    steps = [int(s) for s in curves["step"]]
    epochs = -(-max(steps) // per_epoch)
    for k, step in enumerate(steps):
        epoch, i = (step - 1) // per_epoch + 1, (step - 1) % per_epoch + 1
        yield k, i, i == per_epoch or k == len(steps) - 1, f"Epoch {epoch}/{epochs}\n" if i == 1 or k == 0 else ""


def _draw(states) -> str:  # noqa: ANN001 - (an iterable of (header, state, ends))
    """Progbar.update's dynamic display, as a file receives it: the `Epoch E/M` line before an
    epoch's first state, each state after backspacing over the one before and a carriage return,
    a newline after an epoch's last."""
    out, prev = io.StringIO(), 0
    for header, state, ends in states:
        if header:
            out.write(header)
            prev = 0
        out.write("\b" * prev + "\r" + state + ("\n" if ends else ""))
        prev = len(state)
    return out.getvalue()


def keras3(curves: dict, *, per_epoch: int = 300) -> str:
    """Keras 3's model.fit(verbose=1) with stdout sent to a file: progbar_logger.py's on_epoch_begin
    prints `Epoch {epoch + 1}/{self.epochs}`; Progbar.update draws each state (_draw: its dynamic
    display holds on any POSIX system): the count in bold, the bar in green and white `━`, the time
    and time a step, then ` - name: value` in the logs' sorted order; the epoch's last state is
    drawn again with the validation's values, then a newline."""
    width = len(str(per_epoch))

    def states():  # noqa: ANN202
        for k, i, last, header in _batches(curves, per_epoch):
            done = int(20 * i / per_epoch)
            bar = f"\x1b[1m{i:>{width}d}/{per_epoch}\x1b[0m " + (f"\x1b[32m{'━' * done}\x1b[0m" if done else "") + f"\x1b[37m{'━' * (20 - done)}\x1b[0m"
            logs = {"loss": curves["loss"][k], "mae": curves["loss"][k] / 3}
            yield header, bar + f" \x1b[1m{max(1, (per_epoch - i) // 50)}s\x1b[0m 12ms/step" + "".join(f" - {n}:{_keras_value(v)}" for n, v in sorted(logs.items())), False
            if last:
                logs |= {"val_loss": curves["loss"][k] * 1.1, "val_mae": curves["loss"][k] / 2.5}
                yield "", bar + " \x1b[1m4s\x1b[0m 12ms/step" + "".join(f" - {n}:{_keras_value(v)}" for n, v in sorted(logs.items())), True

    return _draw(states())


def tf_keras(curves: dict, *, per_epoch: int = 300) -> str:
    """tf.keras 2's bar (tf_keras/utils/generic_utils.py, Progbar.update, drawn as _draw does): `%{w}d/%d [`,
    then `=`s and a `>` (a `=` when done), dots to width 30, `]`; ` - ETA: 1s` while running,
    ` - 4s 12ms/step` at the end; metrics in model.metrics' order (loss first)."""
    width = len(str(per_epoch))

    def states():  # noqa: ANN202
        for k, i, last, header in _batches(curves, per_epoch):
            done = int(30 * i / per_epoch)
            bar = f"{i:>{width}d}/{per_epoch} [" + ("=" * (done - 1) + (">" if i < per_epoch else "=") if done else "") + "." * (30 - done) + "]"
            logs = {"loss": curves["loss"][k], "accuracy": 0.5}
            if last:
                logs |= {"val_loss": curves["loss"][k] * 1.1, "val_accuracy": 0.6}
            yield header, bar + (" - 4s 12ms/step" if last else " - ETA: 1s") + "".join(f" - {n}:{_keras_value(v)}" for n, v in logs.items()), last

    return _draw(states())


BAR_FORMAT = "{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}<{remaining}, {rate_noinv_fmt}{postfix}]"
"""lightning/pytorch/callbacks/progress/tqdm_progress.py: the bars' format."""


def _lightning_tqdm():  # noqa: ANN202 - (a tqdm subclass, made when tqdm is imported)
    from tqdm import tqdm

    class Tqdm(tqdm):
        """tqdm_progress.py's Tqdm: numbers as tqdm writes them, floats padded to 5 characters."""

        @staticmethod
        def format_num(n: Number | str) -> str:
            padded = isinstance(n, (float, str))
            if not isinstance(n, str):
                n = tqdm.format_num(n)
            if padded and "e" not in n:
                if "." not in n and len(n) < 5:
                    try:
                        float(n)
                    except ValueError:
                        return n
                    n += "."
                n += "0" * (5 - len(n))
            return n

    return Tqdm


def lightning(curves: dict, *, per_epoch: int = 300, val_every_epoch: bool = True, validation=None, known: bool = True) -> str:  # noqa: ANN001
    """Lightning's TQDMProgressBar (tqdm_progress.py) on stdout sent to a file: the training bar
    (init_train_tqdm: position 0, dynamic_ncols, smoothing 0, BAR_FORMAT) reset to the epoch's
    batches and described `Epoch {current_epoch}` at each epoch's start; on_train_batch_end sets
    its count and refreshes, then sets the postfix (`v_num` and what was logged with prog_bar=True:
    here `train_loss`, and `val_loss` from the first validation on, which stays); each epoch's
    validation bar (init_validation_tqdm: position 1, leave=False) is drawn below and cleared, then
    on_validation_end sets the postfix again with the validation's values (`validation(epoch)`,
    by default `val_loss`). Not `known`: a loader of no known length (an iterable dataset), whose
    bar the callback resets to no total (convert_inf)."""
    tqdm = _lightning_tqdm()
    out = io.StringIO()
    steps = [int(s) for s in curves["step"]]
    bar = tqdm(desc="Training", position=0, disable=False, leave=True, dynamic_ncols=True, file=out, smoothing=0, bar_format=BAR_FORMAT)
    shown: dict = {"v_num": 0}
    for k, step in enumerate(steps):
        epoch, i = divmod(step - 1, per_epoch)
        if i == 0 or k == 0:
            bar.reset(per_epoch if known else None)
            bar.initial = 0
            bar.set_description(f"Epoch {epoch}")
        bar.n = i + 1
        bar.refresh()
        shown["train_loss"] = float(curves["loss"][k])
        bar.set_postfix(shown)
        if val_every_epoch and (i + 1 == per_epoch or k == len(steps) - 1):
            val = tqdm(desc="Validation DataLoader 0", position=1, disable=False, leave=False, dynamic_ncols=True, file=out, bar_format=BAR_FORMAT, total=2)
            val.update(1)
            val.update(1)
            val.close()
            shown |= validation(epoch) if validation else {"val_loss": float(curves["loss"][k]) * 1.1}
            bar.set_postfix(shown)
    bar.close()
    return out.getvalue()


NEMO_BAR_FORMAT = "{desc}: {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} [{elapsed}<{remaining}{postfix}]"
"""nemo/lightning/pytorch/callbacks/progress_bar.py: MegatronProgressBar.init_train_tqdm's format."""


def nemo(curves: dict, *, max_steps: int = 2000, resumed_at: int | None = None) -> str:
    """NeMo 2's MegatronProgressBar (a Lightning TQDMProgressBar) on stdout sent to a file: reset to
    max_steps and described `Epoch {current_epoch}` at the epoch's start; on_train_batch_end sets
    the count (Lightning's _update_n: a refresh, so with the postfix set before) and then the
    postfix without a refresh (set_postfix(..., refresh=False)): what the training step logged with
    prog_bar=True, the trainer's global_step (counted from 0) among it; the bar drawn last at close.
    `resumed_at`: a run resumed from a checkpoint, its count from 1 again, its global_step from there."""
    tqdm = _lightning_tqdm()
    out = io.StringIO()
    bar = tqdm(desc="Training", position=0, disable=False, leave=True, dynamic_ncols=True, file=out, smoothing=0, bar_format=BAR_FORMAT)
    bar.bar_format = NEMO_BAR_FORMAT
    bar.reset(max_steps)
    bar.initial = 0
    bar.set_description("Epoch 0")
    for k, step in enumerate(int(s) for s in curves["step"]):
        bar.n = step if resumed_at is None else k + 1
        bar.refresh()
        global_step = step - 1 if resumed_at is None else resumed_at + k
        bar.set_postfix({
            "reduced_train_loss": float(curves["loss"][k]), "global_step": float(global_step), "consumed_samples": float(8 * step),
            "train_step_timing in s": 0.3012,
        }, refresh=False)
    bar.close()
    return out.getvalue()


_SMALL = {"step": np.array([1, 2, 3, 4, 5]), "loss": np.array([2.5, 2.4, float("nan"), 2.2, 2.1])}
KERAS3 = keras3(_SMALL, per_epoch=2)
TF_KERAS = tf_keras(_SMALL, per_epoch=2)
LIGHTNING = lightning(_SMALL, per_epoch=2)
NEMO = nemo(_SMALL, max_steps=10)

ALL = {
    "keras3": ("fit.log", KERAS3),
    "tf_keras": ("train_output.txt", TF_KERAS),
    "lightning": ("lightning.log", LIGHTNING),
    "nemo": ("nemo_log_globalrank-0_localrank-0.txt", NEMO),
}
"""name -> (file name, text). Each is also in samples.ALL (sniffing, reading in pieces)."""


def keras1(epochs: list[list[float]], *, samples: int, batch_size: int, validate: int | None = 1000) -> str:
    """Keras 1.2.2's model.fit(x, y, verbose=1) with stdout sent to a file, its bar counting samples.
    `epochs`: each epoch's per-batch losses (ceil(samples / batch_size) of them). keras/engine/
    training.py's _fit_loop prints `Train on %d samples, validate on %d samples` (with validation
    data only); keras/callbacks.py's ProgbarLogger prints `Epoch %d/%d`, then, after each batch but
    the last, Progbar.update(seen) (keras/utils/generic_utils.py: `'\\b' * prev_total_width`, `\\r`,
    `%{w}d/%{w}d [`, `=`s and a `>` (a `=` when done) to width 30, dots, `]`, ` - ETA: %ds` while
    running or ` - %ds` at the end, ` - %s:` and ` %.4f` (` %.4e` at or under 1e-3) of the mean
    weighted by the samples, spaces over a longer state before), and at the epoch's end the last
    state with the validation's values, then a newline. Every batch is drawn (one takes longer than
    the bar's interval, 0.05 s); `acc` is a constant 0.5."""
    width = len(str(samples))
    out = io.StringIO()
    if validate is not None:
        out.write(f"Train on {samples} samples, validate on {validate} samples\n")

    def value(v: float) -> str:
        return f" {v:.4f}" if abs(v) > 1e-3 else f" {v:.4e}"

    for e, losses in enumerate(epochs, start=1):
        out.write(f"Epoch {e}/{len(epochs)}\n")
        seen, total, prev = 0, 0.0, 0
        for b, loss in enumerate(losses):
            size = min(batch_size, samples - seen)
            seen, total = seen + size, total + loss * size
            last = b == len(losses) - 1
            done = int(30 * seen / samples)
            bar = f"{seen:{width}d}/{samples} [" + ("=" * (done - 1) + (">" if seen < samples else "=") if done else "") + "." * (30 - done) + "]"
            info = (" - 3s" if last else f" - ETA: {(samples - seen) // 1000}s") + f" - loss:{value(total / seen)} - acc:{value(0.5)}"
            if last and validate is not None:
                info += f" - val_loss:{value(total / seen * 1.1)} - val_acc:{value(0.6)}"
            state = bar + info + " " * max(0, prev - len(bar + info))
            out.write("\b" * prev + "\r" + state + ("\n" if last else ""))
            prev = len(bar + info)
    return out.getvalue()


def keras2_verbose2(losses: list[float], *, samples: int | None = 60000, validate: int | None = 10000) -> str:
    """Keras 2.0-2.2's model.fit(..., verbose=2) with stdout sent to a file: a line an epoch that
    counts nothing. keras/engine/training_arrays.py prints `Train on %d samples, validate on %d
    samples` (arrays with validation data); keras/callbacks.py's ProgbarLogger `Epoch %d/%d`, then
    at the epoch's end Progbar.update with verbose=2 (keras/utils/generic_utils.py) writes
    `' - %.0fs'` and, for each value, `' - %s:'` and `' %.4f'` (`' %.4e'` at or under 1e-3), then a
    newline. `losses`: each epoch's mean loss."""
    def value(v: float) -> str:
        return f" {v:.4f}" if abs(v) > 1e-3 else f" {v:.4e}"

    out = io.StringIO()
    if samples is not None and validate is not None:
        out.write(f"Train on {samples} samples, validate on {validate} samples\n")
    for e, loss in enumerate(losses, start=1):
        out.write(f"Epoch {e}/{len(losses)}\n")
        out.write(f" - {3 + e % 2}s - loss:{value(loss)} - acc:{value(0.9)}"
                  + (f" - val_loss:{value(loss * 1.1)} - val_acc:{value(0.88)}" if validate is not None else "") + "\n")
    return out.getvalue()
