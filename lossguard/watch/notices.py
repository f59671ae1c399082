"""What the pass says: the incidents it judged turned into lifecycle notices (lossguard.alerts.
lifecycle decides which), each put in the outbox in the pass's transaction, with the picture of the
curves an announced incident's alert is drawn from.

The notification log is the incidents table: what was said before is read back from the state, so
a restarted daemon says nothing twice."""

from __future__ import annotations

import json
from collections.abc import Sequence

from ..alerts.lifecycle import decide
from ..alerts.picture import Picture, picture
from ..detection.streams import Points
from ..model import Incident, Notice
from ..state import State, Transaction
from .pass_report import PassReport

ANNOUNCING = ("opened", "escalated")
"""The notices that announce an incident: they carry its sparkline, and its picture is kept."""


def _kept_picture(inc: Incident, windows: dict[str, Points]) -> Picture | None:
    """The curves as they are now, committed with the alert: its sparkline, and the picture drawn
    and sent after it goes out (the sender's thread), from what the daemon saw when it raised it."""
    return picture(inc, {m: (w[0], w[1]) for m, w in windows.items() if w[0].size})


class Notices:
    """The sinks each notice goes to (and those that show pictures), and how often a growing
    incident is announced again."""

    def __init__(self, *, state: State, sinks: Sequence[str], plot_sinks: Sequence[str], update_every: float) -> None:
        self.state = state
        self.sinks = list(sinks)
        self.plot_sinks = [s for s in plot_sinks if s in self.sinks]
        """Sinks that show an announced incident's picture: its curves are kept with it for them."""
        self.update_every = update_every

    def incident(self, tx: Transaction, inc: Incident, *, now: float, quiet: bool, source: str, report: PassReport,
                 windows: dict[str, Points]) -> None:
        """Record the incident as judged now, and say what its lifecycle says of it (`quiet`: found
        in the history read at the first start, recorded without a word)."""
        sent = self.state.incident(inc.run, inc.rule, inc.step, inc.timeline)
        parent = self.state.incident(inc.run, *inc.follows) if sent is None and inc.follows else None
        decision = decide(sent, inc, now=now, quiet=quiet, update_every=self.update_every, parent=parent)
        if decision.row is None:
            ident = tx.add_incident(inc, source=source, quiet=quiet, now=now, parent=parent.id if parent else None)
        else:
            ident = decision.row.id
            tx.update_incident(decision.row)
        announced = any(kind in decision.kinds for kind in ANNOUNCING)
        pic = _kept_picture(inc, windows) if announced else None
        for kind in decision.kinds:
            previous = decision.previous_cause if kind in ("resolved", "relabelled") else None
            spark = pic.around() if pic is not None and kind in ANNOUNCING else ()
            self.send(tx, Notice(kind, inc.run, inc, source=source, previous_cause=previous, spark=spark), ident, now, report)
        if self.plot_sinks and pic is not None:
            tx.add_plot(ident, json.dumps(pic.to_json()), sinks=self.plot_sinks, now=now)

    def send(self, tx: Transaction, notice: Notice, incident_id: int | None, now: float, report: PassReport) -> None:
        """Into the outbox, for every sink, in the pass's transaction (and into the pass's report)."""
        report.notices.append(notice)
        tx.enqueue(notice, incident_id=incident_id, sinks=self.sinks, now=now)
