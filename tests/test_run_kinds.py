"""Slowdowns and overfitting onset: a run's pace read from the logs trainers print (Megatron,
nanoGPT, TensorBoard, a CSV) and judged against its own median; an evaluation loss judged against
the training loss beside it. With the baits each must pass (a slow checkpoint step, slow warm-up
steps, a count of seconds, a noisy eval loss still improving, eval and train loss rising together),
the daemon's tail agreeing with `scan`, and the real corpus."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from lossguard.cli import main
from lossguard.detection.rules import default_rules, rule_from
from lossguard.state import State
from lossguard.watch.follow import Follower

from .conftest import CORPUS, WAIT_FOR_EVERY_READ
from .test_watch import alerted_once_across_a_kill

tensorboardX = pytest.importorskip("tensorboardX")


def megatron_line(iteration: int, ms: float, loss: float = 2.5) -> str:
    """A line as Megatron-LM's training_log prints it (megatron/training/training.py: ` iteration
    {:8d}/{:8d} |`, `elapsed time per iteration (ms): {:.1f} |`, `learning rate: {:.6E} |`,
    `lm loss: {:.6E} |`, `grad norm: {:.3f} |`, the skipped and NaN counters)."""
    return (
        f" iteration {iteration:8d}/{100000:8d} | consumed samples: {iteration * 512:12d} | elapsed time per iteration (ms): {ms:.1f} |"
        f" learning rate: {1e-4:.6E} | global batch size: {512:5d} | lm loss: {loss:.6E} | loss scale: 1.0 | grad norm: {1.1:.3f} |"
        f" number of skipped iterations: {0:3d} | number of nan iterations: {0:3d} |\n"
    )


def nanogpt_line(iteration: int, ms: float, mfu: float) -> str:
    """As karpathy/nanoGPT's train.py prints it: `iter {iter_num}: loss {lossf:.4f}, time
    {dt*1000:.2f}ms, mfu {running_mfu*100:.2f}%` (mfu -100% until its 5th iteration)."""
    return f"iter {iteration}: loss {3.0 - iteration * 1e-4:.4f}, time {ms:.2f}ms, mfu {mfu:.2f}%\n"


def pace(n: int, *, level: float = 1000.0, seed: int = 0) -> np.ndarray:
    """Step times of a steady run: its level with 3% noise."""
    return level * (1 + np.random.default_rng(seed).normal(0, 0.03, n))


def scan(path: Path, capsys) -> tuple[int, list[dict]]:  # noqa: ANN001
    code = main(["scan", str(path), "--format", "json", "--quiet"])
    doc = json.loads(capsys.readouterr().out)
    return code, [s for r in doc["runs"] for s in r["spikes"] if s["kind"] in ("throughput", "overfitting")]


def write_megatron(path: Path, times: np.ndarray) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(megatron_line(i + 1, ms) for i, ms in enumerate(times)))
    return path


# --- Slowdowns ----------------------------------------------------------------------------------


def test_a_scan_of_mixed_findings_counts_each_by_its_own_word_and_keeps_the_json_keys(tmp_path, capsys):
    from lossguard.alerts.message import title_of
    from lossguard.alerts.picture import shown_trouble
    from lossguard.report.audit import scan as scan_result

    times = pace(120)
    times[60:] *= 2.2
    write_megatron(tmp_path / "slow" / "train.log", times)
    loss = 2.0 + 0.01 * np.random.default_rng(1).normal(size=120)
    loss[80] = 9.0
    (tmp_path / "spiky").mkdir()
    (tmp_path / "spiky" / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "loss": float(v)}) + "\n" for s, v in enumerate(loss, 1)))
    (tmp_path / "dead").mkdir()
    (tmp_path / "dead" / "stderr.log").write_text("Traceback (most recent call last):\n  File \"t.py\", line 3, in <module>\nKeyError: 'x'\n")
    write_megatron(tmp_path / "calm" / "train.log", pace(120))
    assert main(["scan", str(tmp_path), "--quiet"]) == 1
    text = capsys.readouterr().out
    assert text.splitlines()[-1] == "3 finding(s) in 3 of 4 run(s): 1 spike, 1 slowdown, 1 crash."
    assert "FINDINGS" in text.splitlines()[2] and "SPIKES" not in text
    assert main(["scan", str(tmp_path), "--quiet", "--format", "markdown"]) == 1
    assert capsys.readouterr().out.startswith("## lossguard scan: 3 finding(s) in 3 of 4 run(s): 1 spike, 1 slowdown, 1 crash\n")
    assert main(["scan", str(tmp_path), "--quiet", "--format", "json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    # `spikes` keeps its name in the JSON and holds every finding, whatever its kind.
    assert sorted(s["kind"] for r in doc["runs"] for s in r["spikes"]) == ["crash", "ratio", "throughput"]
    assert {k: doc["summary"][k] for k in ("spikes", "crashes", "findings", "by_kind")} == {
        "spikes": 2, "crashes": 1, "findings": 3, "by_kind": {"crash": 1, "slowdown": 1, "spike": 1}}
    # Alerts and their pictures call each finding by the same word.
    found = {i.trouble: i for i in scan_result([tmp_path], rules=default_rules()).incidents}
    assert set(found) == {"spike", "slowdown", "crash"}
    assert title_of("opened", found["slowdown"]) == "WARNING: step time slowdown"
    assert shown_trouble(found["slowdown"]) == "slowdown" and shown_trouble(found["spike"]) == "spike"


def test_a_megatron_step_time_that_doubles_and_stays_is_one_throughput_finding_at_its_first_slow_step(tmp_path, capsys):
    times = pace(120)
    times[60:] *= 2.2
    write_megatron(tmp_path / "run" / "train.log", times)
    code, found = scan(tmp_path / "run", capsys)
    assert code == 1
    assert [(f["rule"], f["kind"], f["metric"], f["step"], f["end_step"]) for f in found] == [("step-time-slowdown", "throughput", "step_time", 61, None)]
    cause = found[0]["causes"][0]
    assert cause["cause"] == "shared_node"
    assert "2.2x slower" in cause["evidence"] and "from step 61" in cause["evidence"]


@pytest.mark.parametrize(
    "shape",
    [
        pytest.param("checkpoint", id="one slow step (a checkpoint save), then the old pace"),
        pytest.param("evaluations", id="a slow step at every evaluation, every 20 steps"),
        pytest.param("warm-up", id="the first steps slow (compilation, warm-up), then faster"),
        pytest.param("counter", id="a time since the start, which only grows"),
    ],
)
def test_a_pace_that_does_not_stay_slower_is_no_finding(tmp_path, capsys, shape):
    times = pace(150)
    if shape == "checkpoint":
        times[80] *= 12
    elif shape == "evaluations":
        times[20::20] *= 4
    elif shape == "warm-up":
        times[:12] *= np.linspace(15, 3, 12)
    else:
        times = np.cumsum(times)
    write_megatron(tmp_path / "run" / "train.log", times)
    assert scan(tmp_path / "run", capsys) == (0, [])


def test_a_slowdown_that_ends_by_itself_resolves_and_says_so(tmp_path, capsys):
    times = pace(150)
    times[70:82] *= 3
    write_megatron(tmp_path / "run" / "train.log", times)
    _, found = scan(tmp_path / "run", capsys)
    assert [(f["step"], f["end_step"]) for f in found] == [(71, 83)]
    assert found[0]["causes"][0]["cause"] == "checkpoint_or_evaluation"


def test_nanogpt_time_and_mfu_both_say_the_run_slowed_and_the_mfu_sentinel_is_no_pace(tmp_path, capsys):
    times = pace(100, level=150.0)
    times[50:] *= 2.5
    mfu = 30.0 * 150.0 / times
    mfu[:5] = -100.0  # nanoGPT's running MFU before its 5th iteration
    log = tmp_path / "run" / "train.log"
    log.parent.mkdir()
    log.write_text("".join(nanogpt_line(i, t, m) for i, (t, m) in enumerate(zip(times, mfu))))
    code, found = scan(log.parent, capsys)
    assert code == 1
    assert sorted((f["rule"], f["metric"], f["step"]) for f in found) == [("step-time-slowdown", "step_time", 50), ("throughput-drop", "throughput", 50)]
    drop = next(f for f in found if f["metric"] == "throughput")
    assert drop["value"] < drop["threshold"] < drop["baseline"]  # slower is lower for a rate


def test_a_tensorboard_throughput_that_halves_is_found_and_erratic_steps_point_at_the_data_loader(tmp_path, capsys):
    rng = np.random.default_rng(3)
    tps = 50_000 * (1 + rng.normal(0, 0.02, 160))
    tps[100:] = 50_000 / rng.uniform(2.5, 6.0, 60)  # steps waiting on input: slow, and unevenly so
    with tensorboardX.SummaryWriter(str(tmp_path / "run")) as w:
        for step, value in enumerate(tps):
            w.add_scalar("train/loss", 2.0 - step * 1e-3, step)
            w.add_scalar("throughput/tokens_per_sec", value, step)
    _, found = scan(tmp_path / "run", capsys)
    assert [(f["rule"], f["step"]) for f in found] == [("throughput-drop", 100)]
    assert found[0]["causes"][0]["cause"] == "data_loader"


def test_a_rule_on_a_metric_with_no_slow_direction_must_say_which(tmp_path):
    with pytest.raises(ValueError, match="slower: set 'up' .* or 'down' .* for metric 'loss'"):
        rule_from({"name": "x", "metric": "loss", "kind": "throughput"})
    assert rule_from({"name": "x", "metric": "loss", "kind": "throughput", "slower": "up"}).direction == "up"


def test_the_daemon_following_a_growing_log_finds_the_slowdown_scan_finds(tmp_path):
    times = pace(130)
    times[70:] *= 2.4
    log = write_megatron(tmp_path / "runs" / "exp" / "train.log", times[:40])
    state = State(tmp_path / "state")
    follower = Follower([tmp_path / "runs"], rules=default_rules(), state=state, log=lambda _: None, pass_budget=WAIT_FOR_EVERY_READ)
    opened = []
    for now, (lo, hi) in enumerate([(40, 72), (72, 90), (90, 130)], start=1):
        with open(log, "a") as fh:
            fh.write("".join(megatron_line(i + 1, times[i]) for i in range(lo, hi)))
        report = follower.run_pass(float(now))
        opened += [(n.incident.rule, n.incident.step) for n in report.notices if n.kind == "opened"]
    state.close()
    assert opened == [("step-time-slowdown", 71)]


def test_a_slowdown_is_alerted_once_across_a_kill_9(tmp_path):
    times = pace(140)
    times[80:] *= 2.5
    log = write_megatron(tmp_path / "runs" / "exp" / "train.log", times[:60])

    def write() -> None:
        with open(log, "a") as fh:
            fh.write("".join(megatron_line(i + 1, times[i]) for i in range(60, 140)))

    assert alerted_once_across_a_kill(tmp_path, write, 81, rule="step-time-slowdown") == [("exp", "step-time-slowdown", 81)]


# --- Overfitting --------------------------------------------------------------------------------


def write_tb(folder: Path, train: np.ndarray, evals: dict[int, float]) -> Path:
    """Lightning's TensorBoard tags (train_loss every step, val_loss at each validation), written by
    tensorboardX's SummaryWriter."""
    with tensorboardX.SummaryWriter(str(folder)) as w:
        for step, value in enumerate(train):
            w.add_scalar("train_loss", value, step)
            if step in evals:
                w.add_scalar("val_loss", evals[step], step)
    return folder


def curves(n_evals: int, *, best_at: int, seed: int = 0, noise: float = 0.004) -> tuple[np.ndarray, dict[int, float]]:
    """A training loss falling all along (every step, 50 steps an evaluation) and an evaluation loss
    falling to its best at evaluation `best_at`, then rising."""
    rng = np.random.default_rng(seed)
    steps = n_evals * 50
    train = 3.0 * np.exp(-np.arange(steps) / 900) + 0.5 + rng.normal(0, 0.01, steps)
    k = np.arange(n_evals)
    ev = 2.0 * np.exp(-k / 6) + 1.0 + np.where(k > best_at, (k - best_at) * 0.03, 0.0) + rng.normal(0, noise, n_evals)
    return train, {int(i * 50 + 49): float(v) for i, v in zip(k, ev)}


def test_an_eval_loss_that_turns_up_while_the_train_loss_falls_is_overfitting_at_the_best_evaluation(tmp_path, capsys):
    train, evals = curves(40, best_at=24)
    best = min(evals, key=evals.get)
    code, found = scan(write_tb(tmp_path / "run", train, evals), capsys)
    assert code == 1
    assert [(f["rule"], f["kind"], f["metric"], f["step"]) for f in found] == [("overfitting", "overfitting", "eval_loss", best)]
    cause = found[0]["causes"][0]
    assert cause["cause"] == "overfitting" and f"Keep the checkpoint from step {best}" in cause["suggestion"]
    assert "while the training loss fell" in cause["evidence"]


@pytest.mark.parametrize(
    "case",
    [
        pytest.param("noisy", id="a noisy eval loss still going down"),
        pytest.param("divergence", id="eval and train loss rising together: a divergence, not overfitting"),
        pytest.param("early", id="one bad evaluation, then improving again"),
        pytest.param("ripple", id="one bad evaluation of an eval loss that ripples up a little between drops"),
    ],
)
def test_an_eval_loss_that_is_not_overfitting_is_no_finding(tmp_path, capsys, case):
    if case == "noisy":
        rng = np.random.default_rng(7)
        train, _ = curves(60, best_at=99)
        k = np.arange(60)
        evals = {int(i * 50 + 49): float(v) for i, v in zip(k, 1.0 + 0.6 * np.exp(-k / 40) + rng.normal(0, 0.03, 60))}
    elif case == "divergence":
        train, evals = curves(40, best_at=24)
        train[25 * 50 :] += np.linspace(0, 2.0, train.size - 25 * 50)
    elif case == "ripple":
        # Each evaluation set drawn in turn from 5 shards of unequal difficulty: +0.01 a shard, then back.
        train, _ = curves(300, best_at=999)
        k = np.arange(300)
        evals = {int(i * 50 + 49): float(v) for i, v in zip(k, 2.0 * np.exp(-k / 100) + 0.3 + 0.01 * (k % 5))}
        evals[222 * 50 + 49] = 50.0
    else:
        train, evals = curves(40, best_at=99)
        evals[20 * 50 + 49] *= 1.3
    code, found = scan(write_tb(tmp_path / "run", train, evals), capsys)
    # (Eval and train loss rising together is the training loss's divergence: found by its own rule.)
    assert (code, found) == ((1, []) if case == "divergence" else (0, []))


# --- The real corpus ----------------------------------------------------------------------------


def test_the_corpus_shows_no_slowdown_and_overfitting_only_where_its_eval_loss_really_turned_up(capsys):
    """No run of the corpus slowed (build-nanogpt's 19,073 `dt` and `tok/sec`, the Megatron logs'
    step times and rates): no throughput finding. One eval loss does turn up while the training
    loss falls: LLaMA-Factory's medical fine-tune in its second epoch (1.552 at step 4500, then
    1.573-1.578 for the four evaluations left, the training loss 1.69 -> 1.54). The HMER Lightning
    run's val_loss, rising 0.51 -> 0.74 between LR drops, moves too much from one validation to the
    next to call it."""
    _, found = scan(CORPUS, capsys)
    assert [(f["run"], f["rule"], f["step"], f["end_step"]) for f in found] == [
        ("jsonl/qwen25_7b_medical_llamafactory_trainer_log", "overfitting", 4500, None),
    ]
    assert "eval_loss best 1.55 at step 4500" in found[0]["causes"][0]["evidence"]
