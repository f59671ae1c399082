"""The lifecycle decision, table-driven: what was said about an incident (its row), the incident as
judged now, the clock; what to say now."""

from __future__ import annotations

from dataclasses import replace

import pytest

from lossguard.alerts.lifecycle import decide, stalled
from lossguard.model import Cause, Incident
from lossguard.state import IncidentRow, RunRow

OPEN = Incident(run="r", metric="loss", rule="loss-spike", kind="ratio", severity="warning", step=20, peak_step=20,
                value=5.0, baseline=2.0, threshold=4.0, causes=(Cause("bad_batch", 0.6, "one point", "skip it"),))
RESOLVED = replace(OPEN, end_step=23)
GREW = replace(OPEN, value=9.0, peak_step=21)
RELABELLED = replace(OPEN, causes=(Cause("gradient_explosion", 0.9, "grad norm 40x", "clip"),))


def row(inc: Incident = OPEN, *, status: str = "open", quiet: bool = False, at: float = 100.0) -> IncidentRow:
    top = inc.causes[0].cause if inc.causes else None
    return IncidentRow(1, status, inc, "a.log", quiet, inc.value, at, top, None)


@pytest.mark.parametrize(
    ("sent", "now_", "quiet", "kinds"),
    [
        pytest.param(None, OPEN, False, ("opened",), id="new and open: opened"),
        pytest.param(None, RESOLVED, False, ("opened", "resolved"), id="new and already recovered: opened, resolved"),
        pytest.param(None, OPEN, True, (), id="new, from history: recorded, not said"),
        pytest.param(row(), OPEN, False, (), id="unchanged: quiet"),
        pytest.param(row(), RESOLVED, False, ("resolved",), id="recovered: resolved once"),
        pytest.param(row(RESOLVED, status="resolved"), RESOLVED, False, (), id="still recovered: quiet"),
        pytest.param(row(), GREW, False, ("updated",), id="grew > 10% after update_every: updated"),
        pytest.param(row(at=290.0), GREW, False, (), id="grew, but announced lately: quiet"),
        pytest.param(row(), replace(OPEN, value=5.4), False, (), id="grew < 10%: quiet"),
        pytest.param(row(), RELABELLED, False, ("relabelled",), id="top cause changed: relabelled"),
        pytest.param(row(), replace(RELABELLED, value=9.0), False, ("updated", "relabelled"), id="grew and relabelled"),
        pytest.param(row(), replace(RELABELLED, end_step=23), False, ("resolved",), id="recovered and relabelled: one message"),
        pytest.param(row(quiet=True), RESOLVED, False, (), id="history stays quiet for good"),
    ],
)
def test_what_is_said_about_an_incident(sent, now_, quiet, kinds):
    decision = decide(sent, now_, now=300.0, quiet=quiet, update_every=120.0)
    assert decision.kinds == kinds
    if sent is not None:
        assert decision.row.incident == now_ and decision.row.status == ("resolved" if now_.end_step is not None else "open")


def test_a_revised_cause_is_carried_by_the_resolution_and_the_relabel():
    assert decide(row(), replace(RELABELLED, end_step=23), now=300.0, quiet=False, update_every=120.0).previous_cause == "bad_batch"
    assert decide(row(), RELABELLED, now=300.0, quiet=False, update_every=120.0).previous_cause == "bad_batch"
    assert decide(row(), RESOLVED, now=300.0, quiet=False, update_every=120.0).previous_cause is None


def test_an_update_moves_what_was_announced_and_quiet_does_not():
    updated = decide(row(), GREW, now=300.0, quiet=False, update_every=120.0).row
    assert (updated.notified_value, updated.notified_at) == (9.0, 300.0)
    quiet = decide(row(at=290.0), GREW, now=300.0, quiet=False, update_every=120.0).row
    assert (quiet.notified_value, quiet.notified_at) == (5.0, 290.0)


@pytest.mark.parametrize(
    ("run", "now", "expected"),
    [
        pytest.param(RunRow("r", 10, 1000.0, False), 1599.0, False, id="quiet less than stall_after"),
        pytest.param(RunRow("r", 10, 1000.0, False), 1600.0, True, id="quiet for stall_after: stalled"),
        pytest.param(RunRow("r", 10, 1000.0, True), 9999.0, False, id="already said"),
        pytest.param(RunRow("r", None, None, False), 9999.0, False, id="never advanced"),
    ],
)
def test_when_a_run_is_stalled(run, now, expected):
    assert stalled(run, now=now, stall_after=600.0) is expected
    assert stalled(run, now=now, stall_after=0) is False  # 0: never


GRAD = replace(OPEN, metric="grad_norm", rule="grad-norm-spike", step=18, peak_step=18, value=30.0, baseline=1.0)


@pytest.mark.parametrize(
    ("parent", "inc", "kinds"),
    [
        pytest.param(row(GRAD), replace(OPEN, follows=("grad-norm-spike", 18)), ("escalated",), id="after an announced grad-norm spike: escalated"),
        pytest.param(row(GRAD), replace(RESOLVED, follows=("grad-norm-spike", 18)), ("escalated", "resolved"), id="escalated and already over"),
        pytest.param(row(GRAD, quiet=True), replace(OPEN, follows=("grad-norm-spike", 18)), ("opened",), id="its grad-norm spike was history: opened"),
        pytest.param(None, OPEN, ("opened",), id="no grad-norm spike before: opened"),
    ],
)
def test_a_loss_spike_that_follows_a_grad_norm_spike_is_said_as_its_escalation(parent, inc, kinds):
    assert decide(None, inc, now=300.0, quiet=False, update_every=120.0, parent=parent).kinds == kinds
