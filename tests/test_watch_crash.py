"""The daemon's crash findings and stall notices: a followed log that ends in the error that ended
its run is said once, as that error at the run's last step, once the output has been quiet for
`crash_after`; never as a spike of the traceback's numbers, never again across restarts, and never
followed by a bare `stalled`. A stall says what the log's tail says: its last line, or that it
ended cleanly. The passes run in-process with the clock given; one test runs the daemon itself."""

from __future__ import annotations

import os
from pathlib import Path

from lossguard.detection.rules import default_rules
from lossguard.state import State
from lossguard.watch.follow import Follower

from .conftest import WAIT_FOR_EVERY_READ
from .test_crash import FRAMES, OOM, hf_lines
from .test_ranks import nanogpt_lines
from .test_watch import NO_PLOTS, Watch


def follower(tmp_path: Path, **options) -> tuple[State, Follower]:  # noqa: ANN003
    state = State(tmp_path / "state")
    return state, Follower([tmp_path / "runs"], rules=default_rules(), state=state, log=lambda _: None,
                           **{"pass_budget": WAIT_FOR_EVERY_READ, **options})


def said(report) -> list[tuple]:  # noqa: ANN001
    return [(n.kind, n.run, n.incident.rule if n.incident else None, n.incident.error if n.incident else None,
             n.incident.step if n.incident else n.step) for n in report.notices]


def test_a_log_that_ends_in_an_oom_is_said_once_as_the_oom_and_never_as_stalled(tmp_path):
    log = tmp_path / "runs" / "exp" / "train.log"
    log.parent.mkdir(parents=True)
    log.write_text(hf_lines(range(1, 31)))
    state, f = follower(tmp_path, crash_after=60, stall_after=600)
    assert said(f.run_pass(1000.0)) == []
    with open(log, "a") as fh:
        fh.write(hf_lines(range(31, 41)))
    f.run_pass(1010.0)
    with open(log, "a") as fh:
        fh.write(FRAMES)  # the traceback's frames, its exception line not written yet
    assert said(f.run_pass(1020.0)) == []
    assert said(f.run_pass(1085.0)) == []  # quiet, but no error yet: an unfinished traceback
    with open(log, "a") as fh:
        fh.write(OOM)
    assert said(f.run_pass(1090.0)) == []  # not quiet for a minute yet
    assert said(f.run_pass(1150.0)) == [("opened", "exp", "crash-cuda-oom", "CUDA out of memory", 40)]
    assert said(f.run_pass(3000.0)) == []  # past the stall window: the crash said why it stopped
    state.close()
    # A restart judges the run again and says nothing it said before.
    state, f = follower(tmp_path, crash_after=60, stall_after=600)
    assert said(f.run_pass(4000.0)) == [] and said(f.run_pass(4100.0)) == [] and said(f.run_pass(9000.0)) == []
    (row,) = state.open_incidents_of(["exp"])["exp"]
    assert row.incident.lines[0].startswith("torch.OutOfMemoryError") and row.source == str(log)
    # The run restarted from a checkpoint: its crash is over.
    with open(log, "a") as fh:
        fh.write(hf_lines(range(41, 43)))
    assert said(f.run_pass(9001.0)) == [("resumed", "exp", None, None, 42), ("resolved", "exp", "crash-cuda-oom", "CUDA out of memory", 40)]
    state.close()


def test_a_crash_in_the_history_read_at_the_first_start_is_recorded_without_a_word(tmp_path):
    log = tmp_path / "runs" / "exp" / "train.log"
    log.parent.mkdir(parents=True)
    log.write_text(hf_lines(range(1, 31)) + FRAMES + OOM)
    state, f = follower(tmp_path, crash_after=60, stall_after=0)
    assert said(f.run_pass(1000.0)) == [] and said(f.run_pass(1100.0)) == []
    assert [r.incident.rule for r in state.open_incidents_of(["exp"])["exp"]] == ["crash-cuda-oom"]
    state.close()


def test_a_stall_says_what_the_logs_tail_says(tmp_path):
    runs = tmp_path / "runs"
    finish = "`Trainer.fit` stopped: `max_steps=30` reached.\n"  # lightning/pytorch/loops/fit_loop.py
    for run, text in {"done": hf_lines(range(1, 31)) + finish, "stopped": hf_lines(range(1, 31)) + "Saving model checkpoint to out/checkpoint-30\n"}.items():
        (runs / run).mkdir(parents=True)
        (runs / run / "train.log").write_text(text)
    (runs / "quiet").mkdir()
    (runs / "quiet" / "metrics.jsonl").write_text("".join(f'{{"step": {s}, "loss": 2.0}}\n' for s in range(1, 31)))
    state, f = follower(tmp_path, crash_after=60, stall_after=600)
    f.run_pass(1000.0)
    notices = {n.run: n for n in f.run_pass(1700.0).notices}
    assert {run: (n.kind, n.step, n.finished, n.tail) for run, n in notices.items()} == {
        "done": ("stalled", 30, True, "`Trainer.fit` stopped: `max_steps=30` reached."),
        "stopped": ("stalled", 30, False, "Saving model checkpoint to out/checkpoint-30"),
        "quiet": ("stalled", 30, False, None),
    }
    from lossguard.alerts.message import describe

    assert describe(notices["done"]) == "FINISHED run done at step 30: its output ended cleanly (`Trainer.fit` stopped: `max_steps=30` reached.)"
    assert describe(notices["stopped"]).endswith("without a new step; its log's last line: Saving model checkpoint to out/checkpoint-30")
    assert describe(notices["quiet"]).endswith("; its log ends in nothing")
    state.close()


def test_the_daemon_says_a_growing_logs_oom_once_across_kill_9(tmp_path):
    log = tmp_path / "runs" / "exp" / "train.log"
    log.parent.mkdir(parents=True)
    log.write_text(hf_lines(range(1, 21)))
    # 0.3 s of quiet for a crash, 1.2 s for a stall: a stall checks for a crash first, so the order
    # the two windows end in on a loaded machine cannot turn the crash into a stall.
    quick = ("--crash-after", "0.005", "--stall-after", "0.02")

    def crashes(ev: list[dict]) -> list[tuple]:
        return [(e["event"], e["rule"], e["error"], e["step"]) for e in ev if e["run"] == "exp" and e.get("kind") == "crash"]

    w = Watch(tmp_path, env=NO_PLOTS)
    w.args = [*w.args[: w.args.index("--stall-after")], *w.args[w.args.index("--stall-after") + 2:], *quick]
    w.start()
    try:
        w.wait_ready()
        with open(log, "a") as fh:
            fh.write(hf_lines(range(21, 41)))
            fh.flush()
            fh.write(FRAMES + OOM)
        w.wait_for(crashes)
        w.kill9()
        w.start()
        # A run of its own written after the restart: once it is said stalled, the restarted daemon
        # has judged everything, and the stall window of `exp` went by long before.
        (tmp_path / "runs" / "zz").mkdir()
        (tmp_path / "runs" / "zz" / "metrics.jsonl").write_text("".join(f'{{"step": {s}, "loss": 2.0}}\n' for s in range(1, 5)))
        ev = w.wait_for(lambda ev: any(e["event"] == "stalled" and e["run"] == "zz" for e in ev))
    finally:
        w.kill9()
    assert crashes(ev) == [("opened", "crash-cuda-oom", "CUDA out of memory", 40)]
    mine = [e for e in ev if e["run"] == "exp"]
    assert [e["event"] for e in mine] == ["opened"]  # no spike of the traceback's numbers, no stalled after
    assert mine[0]["lines"][0].startswith("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB")
    (zz,) = [e for e in ev if e["run"] == "zz"]
    assert (zz["event"], zz["step"], zz["tail"], zz["finished"]) == ("stalled", 4, None, False)  # a tracker file: no console tail


def test_a_crashed_run_moved_on_by_lines_no_rule_judges_ends_its_crash_and_no_pass_fails(tmp_path):
    # (Its metrics file goes on with an accuracy alone, from the checkpoint's step: the read moves the
    # run on with no judged row; a pass that raised on it would hold back every other run's alert too.)
    run = tmp_path / "runs" / "exp"
    run.mkdir(parents=True)
    (run / "train.log").write_text(nanogpt_lines(ms=150, steps=30))
    (run / "metrics.jsonl").write_text("".join(f'{{"step": {s}, "loss": 2.0, "accuracy": 0.5}}\n' for s in range(0, 30)))
    other = tmp_path / "runs" / "other" / "train.log"
    other.parent.mkdir()
    other.write_text(hf_lines(range(1, 61)))
    state, f = follower(tmp_path, crash_after=60, stall_after=6000)
    f.run_pass(1000.0)
    with open(run / "train.log", "a") as fh:
        fh.write("".join(f"iter {s}: loss {2.5 - s * 0.002:.4f}, time 150.00ms, mfu 30.00%\n" for s in range(30, 41)) + OOM)
    f.run_pass(1010.0)
    assert said(f.run_pass(1100.0)) == [("opened", "exp", "crash-cuda-oom", "CUDA out of memory", 40)]
    with open(run / "metrics.jsonl", "a") as fh:
        fh.write("".join(f'{{"step": {s}, "accuracy": 0.5}}\n' for s in range(20, 25)))
    with open(other, "a") as fh:
        fh.write("{'loss': 9.0, 'grad_norm': 1.2, 'learning_rate': 5e-05, 'epoch': 0.61}\n")
    kinds = [(kind, run_) for kind, run_, *_ in said(f.run_pass(1200.0))]
    assert ("resolved", "exp") in kinds and ("opened", "other") in kinds
    state.close()


def test_a_run_restarted_into_a_new_log_is_not_said_crashed_again_by_the_old_ones_error(tmp_path):
    run = tmp_path / "runs" / "exp"
    run.mkdir(parents=True)
    (run / "train.log").write_text(hf_lines(range(1, 31)))
    state, f = follower(tmp_path, crash_after=60, stall_after=6000)
    f.run_pass(1000.0)
    with open(run / "train.log", "a") as fh:
        fh.write(hf_lines(range(31, 41)) + OOM)
    f.run_pass(1010.0)
    assert [k for k, *_ in said(f.run_pass(1100.0))] == ["opened"]
    hour_ago = os.stat(run / "train.log").st_mtime - 3600  # (the restart comes an hour later, into a new file)
    os.utime(run / "train.log", (hour_ago, hour_ago))
    (run / "log.txt").write_text(hf_lines(range(20, 60)))
    assert "resolved" in [k for k, *_ in said(f.run_pass(1200.0))]
    assert said(f.run_pass(1300.0)) == [] and said(f.run_pass(1400.0)) == []  # (log.txt quiet: no crash in it)
    state.close()
