"""Runs written by the real trainers (tests/fixtures/real_trainers: PyTorch Lightning 2.6 and the HF
transformers 5.25 Trainer on a small MLP, through every logger they drive; SOURCES.md there), the LR
multiplied by 100 for 5 steps at step 400 and a clean control: every logger reads as the same run, the
jump is named the spike's cause in each, and the daemon announces the spike once while the HF
checkpoints appear in turn."""

from __future__ import annotations

import json
import shutil
import time

import pytest

from lossguard.cli import main

from .conftest import FIXTURES
from .test_watch import NO_PLOTS, Watch

REAL = FIXTURES / "real_trainers"
LOGGERS = ("csv", "tfevents", "wandb", "mlflow_db", "hf_console", "hf_trainer_state")


def _of(runs: dict[str, dict], scenario: str) -> dict[str, dict]:
    """The scenario's run as each logger wrote it, by format (the MLflow store names its runs by the
    experiment: lightning_digits/lightning_lr_jump)."""
    return {r["format"]: r for name, r in runs.items() if name.split("/")[0 if r["format"] != "mlflow_db" else 1] == scenario}


@pytest.fixture(scope="module")
def scanned():
    import io
    import sys

    out, sys.stdout = sys.stdout, io.StringIO()
    try:
        main(["scan", str(REAL), "--format", "json", "--quiet"])
        doc = sys.stdout.getvalue()
    finally:
        sys.stdout = out
    return {run["run"]: run for run in json.loads(doc)["runs"]}


@pytest.mark.parametrize("scenario", ["lightning_lr_jump", "lightning_clean", "hf_lr_jump", "hf_clean"])
def test_every_logger_of_a_real_run_reads_as_the_same_run_with_the_same_spikes(scanned, scenario):
    by_logger = _of(scanned, scenario)
    expected = {"csv", "tfevents", "wandb", "mlflow_db"} if scenario.startswith("lightning") else {"tfevents", "wandb", "mlflow_db", "hf_console", "hf_trainer_state"}
    assert set(by_logger) == expected
    spans = {(r["first_step"], r["last_step"], r["steps"]) for r in by_logger.values()}
    assert spans == {(0, 699, 700)} if scenario.startswith("lightning") else spans == {(1, 700, 700)}
    spikes = {f: [(s["rule"], s["step"], s["peak_step"]) for s in r["spikes"]] for f, r in by_logger.items()}
    assert len({tuple(v) for v in spikes.values()}) == 1, spikes


@pytest.mark.parametrize("scenario,begins", [("lightning_lr_jump", 398), ("hf_lr_jump", 401)])
def test_the_lr_jump_is_named_the_loss_spikes_cause_by_every_logger(scanned, scenario, begins):
    for fmt, run in _of(scanned, scenario).items():
        (spike,) = [s for s in run["spikes"] if s["metric"] == "loss" and s["step"] <= 402 <= (s["end_step"] or 1 << 62)]
        assert (spike["step"], spike["peak_step"]) == (begins, 402), fmt
        top = spike["causes"][0]
        assert top["cause"] == "lr_schedule", (fmt, spike["causes"])
        assert "lr jumped 1.0e-03 -> 0.1 at step 400" in top["evidence"], fmt
        assert "the grad norm exploded after it" in top["evidence"], fmt


def test_the_clean_control_run_has_no_lr_event_named(scanned):
    for scenario in ("lightning_clean", "hf_clean"):
        for fmt, run in _of(scanned, scenario).items():
            assert all(c["cause"] != "lr_schedule" for s in run["spikes"] for c in s["causes"]), fmt


def test_a_real_hf_output_folder_and_its_console_are_announced_once_as_they_are_written(tmp_path):
    # The Trainer's checkpoints, copied in as it wrote them (200, 400, 600, 700): each holds the whole
    # history again, and the spike at 401 is announced once, every incident once. Its console
    # (stdout and stderr, tqdm's redraws and the logged dicts) grows beside them a few KB at a time,
    # from a head of W&B's banner and the bar alone (no dict yet: no format to tell): its rows are
    # read as they come, and the same spike is announced once for it too.
    output = tmp_path / "runs" / "hf" / "output"
    output.mkdir(parents=True)
    source = REAL / "hf_lr_jump" / "output"
    shutil.copytree(source / "checkpoint-200", output / "checkpoint-200")
    console = (REAL / "hf_lr_jump" / "hf_console.log").read_bytes()
    log = output.parent / "hf_console.log"
    head = console.index(b"{'loss'")
    log.write_bytes(console[:head])
    pieces = iter(range(head, len(console), 4096))
    w = Watch(tmp_path, env=NO_PLOTS).start()
    try:
        w.wait_ready()
        w.wait_settled()
        for n in (400, 600, 700):
            for at in [next(pieces, None) for _ in range(12)]:
                if at is not None:
                    with open(log, "ab") as fh:
                        fh.write(console[at : at + 4096])
                    time.sleep(0.02)
            shutil.copytree(source / f"checkpoint-{n}", output / f"checkpoint-{n}.tmp")
            (output / f"checkpoint-{n}.tmp").rename(output / f"checkpoint-{n}")
            if n == 600:  # (checkpoint-400 ends at step 400: the spike is in 600's history)
                w.wait_for(lambda ev: any(e["event"] == "opened" and e["step"] == 401 and e["rule"] == "loss-spike" for e in ev))
        with open(log, "ab") as fh:
            fh.write(console[next(pieces, len(console)) :])
        ev = w.settle()
    finally:
        w.kill9()
    opened = [(e["run"], e["rule"], e["step"]) for e in ev if e["event"] == "opened"]
    assert opened.count(("hf/output", "loss-spike", 401)) == 1 and opened.count(("hf/hf_console", "loss-spike", 401)) == 1, opened
    assert len(opened) == len(set(opened)), opened
    assert all(step > 200 for run, _, step in opened if run == "hf/output")  # the first checkpoint was history


def test_transformers_5_console_places_every_dict_at_the_bars_step_as_its_checkpoint_holds_it():
    # transformers 5.25's console at logging_steps=1: values printed as strings (`'loss': '2.26'`),
    # the first dict written after the bar's first draw at 0/700 (tqdm redraws at most every 0.1 s),
    # every later one between the bar's redraws on one `\r`-separated line.
    from lossguard.ingest.reader import ReadOptions, read_paths

    frame, results, problems = read_paths([REAL / "hf_clean" / "hf_console.log"], ReadOptions())
    assert results[0].format == "hf_console"
    assert [p.message for p in problems] == []
    got = frame.filter(frame["metric"] == "loss").select("step", "value").rows()
    state = json.loads((REAL / "hf_clean" / "output" / "checkpoint-700" / "trainer_state.json").read_text())
    # The console writes each float as f"{v:.4g}" (transformers' ProgressCallback), the state whole.
    held = [(h["step"], float(f"{h['loss']:.4g}")) for h in state["log_history"] if "loss" in h]
    assert [s for s, _ in got] == list(range(1, 701))
    assert got == held


def test_a_live_clean_noisy_run_is_one_slack_notice_and_the_lr_jump_one_alert_through_a_kill9(tmp_path, slack):
    # Lightning's metrics.csv of the control and the LR-jump run written a chunk at a time into a
    # followed folder, through the real slack-sdk: the control's 35 firings on its own batch-to-batch
    # spread are folded into one noisy notice (at most 2 posts: every firing was an alert before),
    # while the jump's 43.9x spike is alerted at once, and once, across a kill -9 and a restart.
    from .test_watch_slack import _daemon, _posts

    logs = {}
    for run, scenario in (("control", "lightning_clean"), ("jump", "lightning_lr_jump")):
        lines = (REAL / scenario / "csv" / "digits" / "version_0" / "metrics.csv").read_text().splitlines(keepends=True)
        log = tmp_path / "runs" / run / "metrics.csv"
        log.parent.mkdir(parents=True)
        log.write_text("".join(lines[:200]))  # (history up to step 99: no firing in it)
        logs[run] = (log, lines)
    w = _daemon(tmp_path, slack, "min_interval = 0\n", env=NO_PLOTS).start()
    try:
        w.wait_ready(files=2)
        w.wait_settled()
        for start in range(200, 1410, 300):
            for log, lines in logs.values():
                with open(log, "a") as fh:
                    fh.write("".join(lines[start : start + 300]))
            if start == 800:  # (steps up to ~550 written: the jump's alert comes now, and the kill right after it)
                w.wait_for(lambda ev: any(e["event"] == "opened" and e["run"] == "jump" and e["rule"] == "loss-spike" for e in ev))
                w.kill9()
                w.start()
            time.sleep(0.2)
        ev = w.settle()
    finally:
        w.kill9()
    by_run = {run: [p.body["text"] for p in _posts(slack) if f"`{run}`" in p.body.get("text", "")] for run in logs}
    assert len(by_run["control"]) <= 2 and any("NOISY run" in t for t in by_run["control"]), by_run["control"]
    opened = [(e["run"], e["step"]) for e in ev if e["event"] == "opened" and e["rule"] == "loss-spike"]
    assert opened.count(("jump", 398)) == 1 and ("control", 398) not in opened and all(run == "jump" for run, _ in opened), opened
    noisy = [e for e in ev if e["event"] == "noisy"]
    assert sorted(e["run"] for e in noisy) == ["control", "jump"] and all(e["folded"] >= 5 and e["rule"] == "loss-spike" for e in noisy)


def test_no_real_trainers_run_raises_a_divergence(scanned):
    """The small models' per-batch loss moves 2x from one batch to the next, and the LR jump's spike
    comes back down: neither is a loss that kept rising."""
    assert [(name, s["step"]) for name, run in scanned.items() for s in run["spikes"] if s["rule"] == "loss-divergence"] == []
