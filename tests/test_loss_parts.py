"""A loss logged in parts only (YOLO's results.csv, DeepSpeed-Chat's RLHF step) is judged as their
sum, by `scan` on the whole run and by the daemon pass by pass, a step summed once its last part is
read, whichever pass reads it."""

from __future__ import annotations

import json
import sqlite3
import time

import pytest

from lossguard.detection.loss_parts import SETTLE
from lossguard.detection.rules import default_rules
from lossguard.api import LossguardWarning
from lossguard.ingest.vocabulary import is_loss_part
from lossguard.state import State
from lossguard.watch.follow import Follower

from .conftest import WAIT_FOR_EVERY_READ, run_lossguard
from .test_no_loss import yolo_results
from .test_watch import NO_PLOTS, Watch, opened

YOLO_SUM = "train/box_loss + train/cls_loss + train/dfl_loss"


def _scan(path) -> tuple[int, dict]:  # noqa: ANN001
    res = run_lossguard("scan", str(path), "--format", "json", "--quiet")
    (report,) = json.loads(res.stdout)["runs"]
    return res.returncode, report


def _results(tmp_path, text: str):  # noqa: ANN001, ANN202
    run = tmp_path / "runs" / "detect" / "train"
    run.mkdir(parents=True)
    (run / "results.csv").write_text(text)
    return run / "results.csv"


def test_a_yolo_box_loss_spike_is_a_loss_spike_of_the_summed_parts_and_the_metrics_line_names_them(tmp_path):
    _results(tmp_path, yolo_results(factor=8.0))
    code, report = _scan(tmp_path / "runs")
    assert code == 1
    assert [(s["rule"], s["metric"], s["step"]) for s in report["spikes"]] == [("loss-spike", "loss", 20)]
    assert report["metrics"]["loss"] == YOLO_SUM
    assert "no_loss" not in [w["kind"] for w in report["warnings"]]
    read = run_lossguard("read", str(tmp_path / "runs"), "--format", "table")
    assert f"metrics (detect/train/results): loss <- {YOLO_SUM}, lr <- lr/pg0" in read.stdout


def test_the_sum_is_what_the_parts_add_up_to_at_each_epoch(tmp_path):
    from lossguard.api import read
    from lossguard.detection.loss_parts import with_summed_loss

    _results(tmp_path, yolo_results(rows=SETTLE, spike_at=99))
    with pytest.warns(LossguardWarning, match="no step finer than the epoch"):  # (YOLO's steps are its epochs)
        rows = read(tmp_path / "runs")
    loss = with_summed_loss(rows).filter(metric="loss")
    by_step = {}
    for step, tag, value in rows.select("step", "tag", "value").iter_rows():
        if tag in YOLO_SUM.split(" + "):
            by_step[step] = by_step.get(step, 0.0) + value
    assert loss.get_column("step").to_list() == list(range(1, SETTLE + 1))
    assert loss.get_column("value").to_list() == pytest.approx([by_step[s] for s in range(1, SETTLE + 1)])


def test_parts_of_fewer_steps_than_a_judgement_needs_are_no_loss(tmp_path):
    """Under SETTLE summed steps the daemon could not yet tell parts from a loss logged after them:
    scan, which judges as the daemon does, sums none either, and says the run has no loss."""
    _results(tmp_path, yolo_results(rows=SETTLE - 1, spike_at=99))
    code, report = _scan(tmp_path / "runs")
    assert code == 0 and "loss" not in report["metrics"]
    assert "no_loss" in [w["kind"] for w in report["warnings"]]


def test_a_nan_in_one_part_is_caught_by_the_nonfinite_rule(tmp_path):
    _results(tmp_path, yolo_results(spike_at=99, nan_at=25))
    code, report = _scan(tmp_path / "runs")
    assert code == 1
    assert [(s["rule"], s["step"]) for s in report["spikes"]] == [("loss-nonfinite", 25)]


def test_a_step_one_part_is_missing_at_is_no_point(tmp_path):
    log = tmp_path / "runs" / "rlhf" / "metrics.jsonl"
    log.parent.mkdir(parents=True)
    lines = [{"step": s, "act_loss": 0.05, "cri_loss": 0.4} for s in range(1, 31)]
    lines[19] = {"step": 20, "act_loss": 5.0}  # the critic's loss not logged at step 20: no sum there
    log.write_text("".join(json.dumps(line) + "\n" for line in lines))
    code, report = _scan(tmp_path / "runs")
    assert (code, report["spikes"], report["steps"]) == (0, [], 29)
    assert report["metrics"]["loss"] == "act_loss + cri_loss"


def test_deepspeed_chat_actor_and_critic_losses_are_summed_as_json_lines_and_as_its_console_print(tmp_path):
    # DeepSpeed-Chat step 3 (main.py): print_rank_0(f'epoch: {epoch}|step: {step}|ppo_ep: {ppo_ep+1}|act_loss: ...|cri_loss: ...|unsuper_loss: ...')
    console = tmp_path / "console" / "rlhf" / "training.log"
    jsonl = tmp_path / "jsonl" / "rlhf" / "metrics.jsonl"
    for path in (console, jsonl):
        path.parent.mkdir(parents=True)
    said, records = [], []
    for step in range(40):
        act, cri = 0.05 - 0.0005 * step + (0.9 if step == 30 else 0.0), 0.4 - 0.002 * step
        said.append(f"epoch: 0|step: {step}|ppo_ep: 1|act_loss: {act}|cri_loss: {cri}|unsuper_loss: 0.0\n")
        records.append(json.dumps({"step": step, "act_loss": act, "cri_loss": cri}) + "\n")
    console.write_text("".join(said))
    jsonl.write_text("".join(records))
    for root, summed in ((console.parents[1], "act_loss + cri_loss + unsuper_loss"), (jsonl.parents[1], "act_loss + cri_loss")):
        code, report = _scan(root)
        assert (code, report["metrics"]["loss"]) == (1, summed)
        assert [(s["rule"], s["step"]) for s in report["spikes"]] == [("loss-spike", 30)]


def test_validation_losses_are_never_summed_into_the_training_loss(tmp_path):
    _results(tmp_path, yolo_results(spike_at=99, val_spike_at=20, factor=8.0))
    code, report = _scan(tmp_path / "runs")
    assert (code, report["spikes"], report["metrics"]["loss"]) == (0, [], YOLO_SUM)


@pytest.mark.parametrize(("tag", "part"), [
    pytest.param("train/box_loss", True, id="YOLO's training part"),
    pytest.param("act_loss", True, id="DeepSpeed-Chat's actor loss"),
    pytest.param("train/CrossEntropyLoss", False, id="a spelling of the loss is the loss, no part"),
    pytest.param("val/box_loss", False, id="a validation part"),
    pytest.param("eval_cls_loss", False, id="an eval part"),
    pytest.param("test/dfl_loss", False, id="a test part"),
    pytest.param("loss_scale", False, id="the loss scale"),
    pytest.param("train/train_loss", False, id="HF's end-of-run summary"),
    pytest.param("box_loss_epoch", False, id="an epoch aggregate"),
    pytest.param("dev_loss", False, id="a dev split's"),
    pytest.param("heldout/lm_loss", False, id="a held-out split's"),
    pytest.param("best_loss", False, id="a record"),
    pytest.param("final_loss", False, id="a run's last"),
    pytest.param("target_kl_loss", False, id="a goal"),
])
def test_which_names_are_parts_of_a_training_loss(tag, part):
    assert is_loss_part(tag) is part


def test_a_run_with_a_loss_of_its_own_keeps_it_and_its_parts_are_not_summed(tmp_path):
    log = tmp_path / "runs" / "det" / "metrics.jsonl"
    log.parent.mkdir(parents=True)
    # MMDetection: loss_cls and loss_bbox beside the loss they add up to; a spike in a part alone
    # that the total does not show is not the loss's.
    log.write_text("".join(json.dumps({"step": s, "loss": 1.0, "loss_cls": 0.4 * (9 if s == 20 else 1), "loss_bbox": 0.6}) + "\n" for s in range(1, 31)))
    code, report = _scan(tmp_path / "runs")
    assert (code, report["spikes"], report["metrics"]["loss"]) == (0, [], "loss")


def _incidents(state_dir) -> list[tuple[str, int]]:  # noqa: ANN001
    with sqlite3.connect(f"file:{state_dir / 'state.db'}?mode=ro", uri=True) as db:
        return sorted(db.execute("SELECT rule, step FROM incidents").fetchall())


def _follow_in_pieces(tmp_path, log, lines: list[str], *, each: int, restart_at: int):  # noqa: ANN001, ANN202
    """The daemon's follower reading `log` as `lines` are appended `each` at a time, a pass each,
    closed and made anew (a restart) before the pass that reads line `restart_at`; its state folder."""
    log.write_text("")
    state_dir = tmp_path / "state"

    def follower() -> Follower:
        return Follower([tmp_path / "runs"], rules=default_rules(), state=State(state_dir), log=lambda _: None, pass_budget=WAIT_FOR_EVERY_READ)

    f = follower()
    f.run_pass(0.0)
    for i in range(0, len(lines), each):
        with open(log, "a") as fh:
            fh.writelines(lines[i : i + each])
        if i <= restart_at < i + each:
            f.state.close()
            f = follower()
        f.run_pass(float(i + 1))
    f.state.close()
    return state_dir


def test_parts_of_one_step_read_in_different_passes_and_across_a_restart_are_summed_once(tmp_path):
    """Each part on a line of its own (a tracker writing one record per metric), the daemon reading
    a line a pass and restarted in between: every step is summed once its last part is read, never
    from one part, never twice, so the daemon finds the incidents `scan` finds, no more."""
    log = tmp_path / "runs" / "rlhf" / "metrics.jsonl"
    log.parent.mkdir(parents=True)
    lines = []
    for step in range(1, 41):
        act = 5.0 if step == 30 else 0.05
        lines += [json.dumps({"step": step, "act_loss": act}) + "\n", json.dumps({"step": step, "cri_loss": 0.4}) + "\n"]
    # Restarted between a step's two parts: what the pass before kept is in the state.
    state_dir = _follow_in_pieces(tmp_path, log, lines, each=1, restart_at=len(lines) // 2 + 1)
    code, report = _scan(tmp_path / "runs")
    assert code == 1 and report["metrics"]["loss"] == "act_loss + cri_loss"
    assert _incidents(state_dir) == sorted((s["rule"], s["step"]) for s in report["spikes"]) == [("loss-spike", 30)]


def test_a_loss_first_logged_after_its_parts_replaces_their_sum_on_a_timeline_of_its_own(tmp_path):
    """A run logging its parts every step and its own loss every 20 (a VAE's recon and KL terms, the
    total on a slower cadence): the daemon, reading a few lines a pass and restarted in between, takes
    the parts' sum for the run's loss until the loss itself shows up, then judges the loss alone, its
    history not the sum's. It finds what `scan` (which never sums a run that logs a loss) finds: the
    loss's own spike, and nothing where the loss changes from the sum's scale to its own."""
    log = tmp_path / "runs" / "vae" / "metrics.jsonl"
    log.parent.mkdir(parents=True)
    lines = []
    for step in range(1, 301):
        lines += [json.dumps({"step": step, "recon_loss": 0.8, "kl_loss": 0.1}) + "\n"]
        if step % 20 == 0:
            lines += [json.dumps({"step": step, "loss": 30.0 if step == 280 else 3.0}) + "\n"]
    # Restarted while the sum is the loss: what the state keeps tells it after the restart.
    state_dir = _follow_in_pieces(tmp_path, log, lines, each=7, restart_at=7)
    code, report = _scan(tmp_path / "runs")
    assert code == 1 and report["metrics"]["loss"] == "loss"
    assert _incidents(state_dir) == sorted((s["rule"], s["step"]) for s in report["spikes"]) == [("loss-spike", 280)]
    with sqlite3.connect(f"file:{state_dir / 'state.db'}?mode=ro", uri=True) as db:
        assert db.execute("SELECT count(*) FROM streams WHERE metric LIKE 'part:%'").fetchone() == (0,)


def test_the_daemon_following_a_growing_results_csv_alerts_the_spike_scan_reports_once(tmp_path):
    text = yolo_results(factor=8.0)
    header, *rows = text.splitlines(keepends=True)
    target = _results(tmp_path, header + "".join(rows[:3]))
    expected = [("loss-spike", 20)]
    w = Watch(tmp_path, env=NO_PLOTS).start()
    try:
        w.wait_ready()
        for row in rows[3:]:
            with open(target, "a") as fh:
                fh.write(row)
            time.sleep(0.02)
        w.wait_for(lambda ev: opened(ev) == expected)
        ev = w.settle()
    finally:
        w.kill9()
    code, report = _scan(tmp_path / "runs" / "detect")
    assert code == 1 and [(s["rule"], s["step"]) for s in report["spikes"]] == expected
    assert [(e["rule"], e["step"]) for e in ev if e["event"] == "opened"] == expected


def test_parts_written_as_tensorboard_scalars_of_their_own_are_summed(tmp_path):
    """YOLOv5's TensorBoard logging: each part an event of its own (tensorboardX's writer)."""
    from tensorboardX import SummaryWriter

    writer = SummaryWriter(str(tmp_path / "runs" / "yolo"))
    for step in range(1, 31):
        writer.add_scalar("train/box_loss", 0.05 * (9 if step == 20 else 1), step)
        writer.add_scalar("train/obj_loss", 0.03, step)
        writer.add_scalar("train/cls_loss", 0.02, step)
        writer.add_scalar("val/box_loss", 0.06, step)
    writer.close()
    code, report = _scan(tmp_path / "runs")
    assert report["metrics"]["loss"] == "train/box_loss + train/cls_loss + train/obj_loss"
    assert (code, [(s["rule"], s["step"]) for s in report["spikes"]]) == (1, [("loss-spike", 20)])
