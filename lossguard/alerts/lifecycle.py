"""What to say about an incident, and about a run that went quiet: pure decisions over what was
already said (the incidents table is the notification log) and the incident as judged now, with
the clock passed in — Alertmanager's needsUpdate, for lossguard's lifecycle:

- a new incident is announced (opened; and resolved at once if it already recovered), unless it
  was found in the history read at the first start; a loss spike that follows an announced
  grad-norm spike is announced as its escalation (in that alert's thread);
- an open incident that grew by more than GROWTH since the last announcement is announced again
  (updated), at most every `update_every` seconds;
- its recovery is announced once (resolved), carrying a revised cause if the label changed;
- a changed top cause is announced (relabelled);
- a crash said resolved (the run moved on) and found again at its step (the run, restarted, died
  there again) is announced again (opened);
- a firing within its run's noise (`folds`, detection.noise.fold) is folded: recorded, said only in
  the run's noisy notice, its growth and resolution never posted, unless it grows outside that
  noise, when it is announced (opened) at once, as new;
- otherwise nothing is said.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..model import Incident
from ..state import IncidentRow, RunRow

GROWTH = 1.1
"""An open incident is announced again when its peak grew by more than this factor."""


@dataclass(frozen=True)
class Decision:
    kinds: tuple[str, ...]
    """Notices to send, in order: opened, updated, resolved, relabelled."""
    row: IncidentRow | None
    """The known incident's row as it should now read (None: a new incident, to be added)."""
    previous_cause: str | None = None
    """The top cause announced before, when the new one differs."""
    folded: bool = False
    """The incident is (still) folded into its run's noisy notice: recorded, not said."""


def decide(
    sent: IncidentRow | None, inc: Incident, *, now: float, quiet: bool, update_every: float, parent: IncidentRow | None = None,
    folds: bool = False, was_folded: bool = False,
) -> Decision:
    """`sent`: the incident as last recorded (None: never seen); `quiet`: a new incident from
    history, recorded without a word; `parent`: the announced incident a new one escalates (the
    grad-norm spike a loss spike followed): it is said as an escalation of that one. `folds`: the
    incident as judged now is within its run's noise (an escalation never is: the loss followed a
    grad-norm spike); `was_folded`: it was folded when last recorded."""
    first = "escalated" if parent is not None and not parent.quiet else "opened"
    if sent is None:
        if not quiet and folds and first == "opened":
            return Decision((), None, folded=True)
        kinds = () if quiet else (first, "resolved") if inc.over else (first,)
        return Decision(kinds, None)
    row = replace(sent, incident=inc, status="resolved" if inc.over else "open")
    if sent.quiet:
        return Decision((), row)
    if was_folded:
        if folds or (sent.status == "resolved" and inc.over):
            return Decision((), row, folded=True)  # (its resolution held, as a silence holds one never announced)
        # It grew outside the run's noise: announced now, as a new incident would be.
        row = replace(row, notified_value=inc.value, notified_at=now)
        return Decision(("opened", "resolved") if inc.over else ("opened",), row)
    if inc.is_crash and sent.status == "resolved" and row.status == "open":
        # The run died again where it died before (a crash loop: the same batch, the same OOM after a restart).
        return Decision(("opened",), replace(row, notified_value=inc.value, notified_at=now))
    top = inc.causes[0].cause if inc.causes else None
    relabelled = sent.top_cause is not None and top is not None and top != sent.top_cause
    previous = sent.top_cause if relabelled else None
    if sent.status == "open" and row.status == "resolved":
        return Decision(("resolved",), row, previous)  # one message: it carries the revised cause
    kinds: tuple[str, ...] = ()
    grew = sent.notified_value is not None and inc.value > sent.notified_value * GROWTH
    if row.status == "open" and grew and now - (sent.notified_at or 0) >= update_every:
        row = replace(row, notified_value=inc.value, notified_at=now)
        kinds = ("updated",)
    if relabelled:
        kinds = (*kinds, "relabelled")
    return Decision(kinds, row, previous)


def stalled(run: RunRow, *, now: float, stall_after: float) -> bool:
    """The run logged nothing new for `stall_after` seconds, and that was not said yet."""
    return stall_after > 0 and not run.stalled and run.advanced_at is not None and now - run.advanced_at >= stall_after
