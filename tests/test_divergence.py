"""A loss that keeps rising is an incident of the default rules (loss-divergence): found once, where
the climb becomes clear against the loss's recent minimum and its own noise, open while the loss
stays up; a plateau, a warm-up bump and a noisy small model's per-batch loss are none."""

from __future__ import annotations

import json
import math

import pytest

from lossguard.alerts.message import describe
from lossguard.cli import main
from lossguard.detection.rules import default_rules
from lossguard.state import State
from lossguard.watch.follow import Follower

from .conftest import WAIT_FOR_EVERY_READ
from .synth import DIVERGING, divergence_cases, write_loss_csv

CASES = divergence_cases()


def _scan(capsys, root) -> list[dict]:
    main(["scan", str(root), "--format", "json", "--quiet"])
    return json.loads(capsys.readouterr().out)["runs"]


@pytest.mark.parametrize("name", DIVERGING)
def test_a_slow_divergence_is_one_incident_from_where_it_becomes_clear_open_while_the_loss_stays_up(tmp_path, capsys, name):
    values = CASES[name]
    write_loss_csv(tmp_path / "runs" / "exp" / "metrics.csv", values)
    (run,) = _scan(capsys, tmp_path / "runs")
    (inc,) = run["spikes"]
    assert inc["rule"] == "loss-divergence"
    climb_from = min(range(len(values)), key=lambda i: values[i] if i >= len(values) // 4 or name.startswith("climb") else math.inf)
    assert climb_from <= inc["step"] < len(values) - 5  # after the minimum, before the end of the run
    # Where it became clear: 1.5x the minimum at least, and not long after (a few points' worth of the climb).
    assert inc["value"] == pytest.approx(max(values), rel=1e-6) and inc["end_step"] is None
    assert values[inc["step"]] <= 2.5 * inc["baseline"]
    assert inc["baseline"] == pytest.approx(min(values[: inc["step"]]), rel=0.2)


@pytest.mark.parametrize("name", [n for n in CASES if n not in DIVERGING])
def test_a_plateau_a_warm_up_bump_and_a_noisy_per_batch_loss_are_no_divergence(tmp_path, capsys, name):
    write_loss_csv(tmp_path / "runs" / "exp" / "metrics.csv", CASES[name])
    (run,) = _scan(capsys, tmp_path / "runs")
    assert [s for s in run["spikes"] if s["rule"] == "loss-divergence"] == []


def test_a_climb_that_comes_back_down_resolves_and_the_next_climb_is_a_new_incident(tmp_path, capsys):
    calm = [2.0 + 0.02 * ((i * 7) % 5 - 2) for i in range(100)]
    climb = [2.0 * 1.05**k for k in range(1, 31)]
    write_loss_csv(tmp_path / "runs" / "exp" / "metrics.csv", calm + climb + calm + climb)
    (run,) = _scan(capsys, tmp_path / "runs")
    found = [(s["rule"], s["end_step"] is None) for s in run["spikes"]]
    assert found == [("loss-divergence", False), ("loss-divergence", True)]
    first, second = run["spikes"]
    assert 100 < first["step"] < 130 and first["end_step"] == 130  # back under 1.5x the minimum with the calm
    assert 230 < second["step"] < 260


def test_a_jump_that_stays_up_is_one_spike_not_a_spike_and_a_divergence(tmp_path, capsys):
    calm = [2.0 + 0.02 * ((i * 7) % 5 - 2) for i in range(100)]
    write_loss_csv(tmp_path / "runs" / "exp" / "metrics.csv", calm + [6.0] * 8 + calm)
    (run,) = _scan(capsys, tmp_path / "runs")
    assert [(s["rule"], s["step"]) for s in run["spikes"]] == [("loss-spike", 100)]


def test_the_report_calls_it_a_divergence_against_the_loss_minimum(tmp_path, capsys):
    write_loss_csv(tmp_path / "runs" / "exp" / "metrics.csv", CASES["compounding 1.08x"])
    main(["scan", str(tmp_path / "runs")])
    out = capsys.readouterr().out
    assert "rule loss-divergence" in out and "vs its recent minimum 2.6" in out and "still open at the end of the log" in out


def test_the_daemon_announces_a_divergence_once_as_it_grows_and_not_again_after_a_restart(tmp_path):
    values = CASES["compounding 1.08x"]
    log = tmp_path / "runs" / "exp" / "metrics.csv"
    write_loss_csv(log, values[:90])
    state = State(tmp_path / "state")
    follower = Follower([tmp_path / "runs"], rules=default_rules(), state=state, log=lambda _: None, pass_budget=WAIT_FOR_EVERY_READ)
    notices = list(follower.run_pass(1.0).notices)
    for k, stop in enumerate(range(100, len(values) + 1, 10)):
        with open(log, "a") as fh:
            fh.write("".join(f"{i},{values[i]:.6f}\n" for i in range(stop - 10, stop)))
        notices += follower.run_pass(2.0 + k).notices
    state.close()
    opened = [n for n in notices if n.incident is not None and n.kind == "opened"]
    assert [(n.incident.rule, n.incident.step) for n in opened] == [("loss-divergence", 105)]  # scan's step (see above)
    assert describe(opened[0]).startswith("OPENED [warning] run exp: loss divergence at step 105")
    # Restarted on the same state (as after kill -9): the open incident is known, nothing is said again.
    state = State(tmp_path / "state")
    again = Follower([tmp_path / "runs"], rules=default_rules(), state=state, log=lambda _: None, pass_budget=WAIT_FOR_EVERY_READ)
    with open(log, "a") as fh:
        fh.write("".join(f"{i},{values[-1] * 1.08 ** (i - len(values) + 1):.6f}\n" for i in range(len(values), len(values) + 5)))
    later = again.run_pass(100.0).notices + again.run_pass(101.0).notices
    assert [n for n in later if n.incident is not None and n.kind == "opened"] == []
    assert [(r.incident.rule, r.incident.step) for r in state.open_incidents("exp")] == [("loss-divergence", 105)]
    state.close()


def test_a_divergence_on_calm_optimiser_signals_is_told_as_a_climb_and_its_lr_named(tmp_path, capsys):
    """The causes of a climb no LR jump, grad-norm growth or overflow explains: the climb in words
    (not a step up to a level), and the LR held at its peak beside it."""
    rows = []
    for s in range(400):
        loss = 2.0 * math.exp(-s / 100) + 1.0 + 0.01 * ((s * 7) % 5 - 2) if s < 300 else 1.05 + 0.02 * (s - 300)
        rows.append(json.dumps({"step": s, "loss": loss, "lr": 3e-4 * min(1, s / 50), "grad_norm": 1.0 + 0.01 * (s % 3)}) + "\n")
    log = tmp_path / "runs" / "exp" / "metrics.jsonl"
    log.parent.mkdir(parents=True)
    log.write_text("".join(rows))
    (run,) = _scan(capsys, tmp_path / "runs")
    (inc,) = run["spikes"]
    causes = {c["cause"]: c["evidence"] for c in inc["causes"]}
    assert inc["rule"] == "loss-divergence" and set(causes) == {"unknown", "lr_too_high"}
    assert causes["unknown"].startswith(f"the loss kept rising (clear from step {inc['step']})") and "stepped up" not in causes["unknown"]
    assert "near its peak since step 50" in causes["lr_too_high"]
