"""A HF Trainer output folder as it grows: each `checkpoint-N/trainer_state.json` holds the whole
log history again, up to N. One run, each incident announced once, by the daemon (a real process)
as by scan."""

from __future__ import annotations

import json
import math
import shutil

from .test_watch import NO_PLOTS, Watch, opened


def _history(upto: int, *, spike: int, shift_from: int | None = None) -> list[dict]:
    out = []
    for step in range(1, upto + 1):
        loss = 2.0 + 0.02 * math.sin(step) + (0.1 if shift_from is not None and step >= shift_from else 0.0)
        out.append({"epoch": step / 100, "grad_norm": 1.0 + 0.01 * (step % 7), "learning_rate": 1e-4, "loss": 8.0 if step in (spike, spike + 1) else loss, "step": step})
    return out


def _checkpoint(folder, step: int, *, spike: int, top: bool = False, shift_from: int | None = None) -> None:
    where = folder if top else folder / f"checkpoint-{step}"
    where.mkdir(parents=True, exist_ok=True)
    state = {"global_step": step, "epoch": step / 100, "log_history": _history(step, spike=spike, shift_from=shift_from)}
    tmp = where / "trainer_state.json.tmp"
    tmp.write_text(json.dumps(state, indent=2))
    tmp.rename(where / "trainer_state.json")


def test_each_checkpoints_trainer_state_adds_only_its_new_steps_and_a_spike_is_announced_once(tmp_path):
    out = tmp_path / "runs" / "hf-out"
    _checkpoint(out, 200, spike=300)
    w = Watch(tmp_path, env=NO_PLOTS).start()
    try:
        w.wait_ready()
        w.wait_settled()
        _checkpoint(out, 400, spike=300)
        w.wait_for(lambda ev: ("loss-spike", 300) in opened(ev))
        _checkpoint(out, 600, spike=300)
        shutil.rmtree(out / "checkpoint-200")  # save_total_limit=2: the Trainer deletes the oldest
        _checkpoint(out, 705, spike=300, top=True)  # the end of training: trainer_state.json at the top
        ev = w.settle()
    finally:
        w.kill9()
    assert [(e["run"], e["rule"], e["step"]) for e in ev if e["event"] == "opened"] == [("hf-out", "loss-spike", 300)]


def test_a_later_checkpoint_whose_history_differs_where_the_read_stopped_is_read_again_from_its_start(tmp_path):
    # A resume from an older checkpoint that logged other values: the later trainer_state.json does
    # not hold the entry the read before stopped after, so its history is read whole, said once.
    from lossguard.ingest.cursor import Cursor
    from lossguard.ingest.formats.trainer_state import TRAINER_STATE

    out = tmp_path / "hf-out"
    _checkpoint(out, 400, spike=300)
    first = TRAINER_STATE.read(out / "checkpoint-400" / "trainer_state.json", Cursor(), final=True)
    _checkpoint(out, 600, spike=300)
    on = TRAINER_STATE.read(out / "checkpoint-600" / "trainer_state.json", first.cursor, final=True)
    assert not on.problems and on.rows.get_column("step").min() == 401
    _checkpoint(out, 600, spike=300, shift_from=350)  # the same steps, other values from 350 on
    again = TRAINER_STATE.read(out / "checkpoint-600" / "trainer_state.json", on.cursor.advance(index=400, mark=first.cursor.mark), final=True)
    assert again.rows.get_column("step").min() == 1
    assert [p.message for p in again.problems] == ["log_history differs from the checkpoint read before at entry 400; read again from its start"]
