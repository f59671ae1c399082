"""A TensorBoard run restarted from a checkpoint writes the steps after it again, to a new event
file: the later write of a step replaces the earlier (TensorBoard purges the orphaned events,
event_accumulator's _CheckForOutOfOrderStepAndMaybePurge), in `scan` and in the daemon. The
points the restart rewrote raise no incident; a spike the resumed run writes is found once, across
a kill -9 of the daemon."""

from __future__ import annotations

import json
import math

from lossguard.cli import main

from .test_watch import NO_PLOTS, Watch, opened

CHECKPOINT, CRASHED_AT, END, SPIKE = 200, 266, 400, 330


def _loss(step: int) -> float:
    return 2.0 * math.exp(-step / 150) + 0.5 + 0.01 * (step % 3)


def _writer(logdir, session: int):  # noqa: ANN202 - (a tensorboardX SummaryWriter)
    from tensorboardX import SummaryWriter

    # (The suffix keeps the files apart and in order when both sessions start within one second.)
    return SummaryWriter(logdir=str(logdir), filename_suffix=f".{session}")


def _first_session(w, steps, *, diverged_from: int = CHECKPOINT) -> None:  # noqa: ANN001
    """The run before its crash: from `diverged_from` on, the loss 3x what it was (why it was restarted)."""
    for s in steps:
        w.add_scalar("train/loss", _loss(s) * (3.0 if s >= diverged_from else 1.0), s)
    w.flush()


def _resumed(w, *, spike: int | None = None) -> None:  # noqa: ANN001
    """From the checkpoint on, calm again; a one-step spike at `spike`."""
    for s in range(CHECKPOINT, END):
        w.add_scalar("train/loss", _loss(s) * (10.0 if s == spike else 1.0), s)
    w.flush()


def _scan(capsys, root) -> list[dict]:
    main(["scan", str(root), "--format", "json", "--quiet"])
    (run,) = json.loads(capsys.readouterr().out)["runs"]
    return [s for s in run["spikes"] if s["metric"] == "loss"]


def test_points_a_restart_rewrote_raise_no_incident_and_a_spike_after_it_is_found(tmp_path, capsys):
    logdir = tmp_path / "runs" / "exp"
    with _writer(logdir, 1) as w:
        _first_session(w, range(CRASHED_AT + 1))
    with _writer(logdir, 2) as w:
        _resumed(w)
    # (Before, the first session's 66 rewritten points were a spike at 200, "ended when the run resumed from step 200".)
    assert _scan(capsys, tmp_path / "runs") == []
    with _writer(logdir, 3) as w:  # a second restart from the same checkpoint, with a spike of its own
        _resumed(w, spike=SPIKE)
    assert [(s["rule"], s["step"], s.get("resumed_from")) for s in _scan(capsys, tmp_path / "runs")] == [("loss-spike", SPIKE, None)]


def test_a_spike_that_began_before_the_rewritten_steps_is_kept_and_ended_by_the_resume(tmp_path, capsys):
    logdir = tmp_path / "runs" / "exp"
    with _writer(logdir, 1) as w:
        _first_session(w, range(CRASHED_AT + 1), diverged_from=180)
    with _writer(logdir, 2) as w:
        _resumed(w)
    (spike,) = _scan(capsys, tmp_path / "runs")
    assert (spike["step"], spike["end_step"], spike["resumed_from"]) == (180, None, CHECKPOINT)


def test_the_daemon_killed_across_a_restart_alerts_only_the_resumed_runs_spike_once(tmp_path):
    """Killed -9 while the run diverged, crashed and was restarted: started again, the daemon reads
    both files' new points at once and alerts what the resumed run wrote, not the rewritten ones."""
    logdir = tmp_path / "runs" / "exp"
    first = _writer(logdir, 1)
    _first_session(first, range(150))
    w = Watch(tmp_path, env=NO_PLOTS).start()
    try:
        w.wait_ready()
        w.wait_settled()
        w.kill9()
        _first_session(first, range(150, CRASHED_AT + 1))
        first.close()
        with _writer(logdir, 2) as second:
            _resumed(second, spike=SPIKE)
        w = Watch(tmp_path, env=NO_PLOTS).start()
        ev = w.settle()
    finally:
        err = w.stop_and_read()
    assert [(e["run"], e["rule"], e["step"]) for e in ev if e["event"] == "opened"] == [("exp", "loss-spike", SPIKE)], err
