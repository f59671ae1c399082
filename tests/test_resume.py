"""A run that crashed at a spike and resumed from an earlier checkpoint: the log holds the spike, then
a replay of the same steps. The spike is explained by the context logged with it (not by the replay's
clean values), in `scan` and in the daemon alike, and it ended with the resume rather than staying
"open at the end of the log"."""

from __future__ import annotations

import json

from lossguard.cli import main
from lossguard.watch.follow import Follower
from lossguard.detection.rules import default_rules
from lossguard.state import State

from .conftest import WAIT_FOR_EVERY_READ

CRASH, RESUME = 100, 80


def _line(step: int, loss: float, gn: float) -> str:
    return json.dumps({"step": step, "loss": loss, "lr": 3e-4, "grad_norm": gn}) + "\n"


def _before_the_crash() -> str:
    """Calm to step 97, the grad norm exploding from 98, the loss following at 100; then the crash."""
    calm = "".join(_line(s, 2.0 - s * 1e-3, 1.0 + (s % 3) * 0.02) for s in range(1, 98))
    return calm + _line(98, 1.90, 9.0) + _line(99, 1.91, 60.0) + _line(CRASH, 7.5, 400.0)


def _replay() -> str:
    """From the checkpoint at step 80 on, clean: the grad norms logged at 98-100 are overwritten."""
    return "".join(_line(s, 2.0 - s * 1e-3, 1.0 + (s % 3) * 0.02) for s in range(RESUME, 140))


def _scan(capsys, log) -> dict:
    main(["scan", str(log.parent.parent), "--format", "json", "--quiet"])
    (run,) = json.loads(capsys.readouterr().out)["runs"]
    return run


def test_a_spike_before_a_resume_is_explained_by_its_own_segment_in_scan(tmp_path, capsys):
    log = tmp_path / "runs" / "exp" / "metrics.jsonl"
    log.parent.mkdir(parents=True)
    log.write_text(_before_the_crash() + _replay())
    (spike,) = [s for s in _scan(capsys, log)["spikes"] if s["metric"] == "loss"]
    assert spike["step"] == CRASH and spike["causes"][0]["cause"] == "gradient_explosion"  # not "unknown"
    assert "400" in spike["causes"][0]["evidence"]  # the grad norm logged at the spike, not the replay's
    assert spike["end_step"] is None and spike["resumed_from"] == RESUME


def test_the_report_says_the_incident_ended_with_the_resume(tmp_path, capsys):
    log = tmp_path / "runs" / "exp" / "metrics.jsonl"
    log.parent.mkdir(parents=True)
    log.write_text(_before_the_crash() + _replay())
    main(["scan", str(tmp_path / "runs"), "--quiet"])
    out = capsys.readouterr().out
    assert "ended when the run resumed from step 80" in out and "still open at the end of the log" not in out


def test_the_daemon_labels_it_from_its_segment_and_resolves_it_when_the_run_resumes(tmp_path):
    log = tmp_path / "runs" / "exp" / "metrics.jsonl"
    log.parent.mkdir(parents=True)
    log.write_text("")
    state = State(tmp_path / "state")
    follower = Follower([tmp_path / "runs"], rules=default_rules(), state=state, log=lambda _: None, pass_budget=WAIT_FOR_EVERY_READ)
    follower.run_pass(1.0)
    log.write_text(_before_the_crash())
    opened = [n for n in follower.run_pass(2.0).notices if n.incident and n.incident.metric == "loss"]
    # (The grad norm was alerted at 98; the loss following it is that alert escalating.)
    assert [(n.kind, n.incident.step, n.incident.causes[0].cause) for n in opened] == [("escalated", CRASH, "gradient_explosion")]
    with open(log, "a") as fh:
        fh.write(_replay())
    later = [n for n in follower.run_pass(3.0).notices if n.incident and n.incident.metric == "loss"]
    assert [(n.kind, n.incident.step, n.incident.resumed_from) for n in later] == [("resolved", CRASH, RESUME)]
    assert later[0].incident.causes[0].cause == "gradient_explosion"  # the replay did not relabel it
    assert state.open_incidents("exp") == []
    state.close()


def test_a_spike_after_the_steps_went_back_names_its_timeline(tmp_path, capsys):
    """Acceptance run 2: two files of one W&B run both counting from 0 gave "step 100" with nothing
    to tell which timeline's step 100 spiked. Here a log rewritten from step 1 spikes at 100 on its
    second timeline: the spike names it (JSON `segment`, the table's "timeline 2")."""
    first = "".join(_line(s, 2.0 + (s % 3) * 0.01, 1.0) for s in range(1, 200))
    second = "".join(_line(s, 9.0 if s == CRASH else 2.0 + (s % 3) * 0.01, 1.0) for s in range(1, 150))
    log = tmp_path / "runs" / "exp" / "metrics.jsonl"
    log.parent.mkdir(parents=True)
    log.write_text(first + second)
    (spike,) = [s for s in _scan(capsys, log)["spikes"] if s["metric"] == "loss"]
    assert spike["step"] == CRASH and spike["segment"] == 1
    main(["scan", str(tmp_path / "runs"), "--quiet"])
    assert f"step {CRASH} (timeline 2: after the steps went back) · rule loss-spike" in capsys.readouterr().out
    log.write_text(second)  # (one timeline: no segment said)
    (spike,) = [s for s in _scan(capsys, log)["spikes"] if s["metric"] == "loss"]
    assert "segment" not in spike
