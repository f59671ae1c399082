"""What the pass says: the incidents it judged turned into lifecycle notices (lossguard.alerts.
lifecycle decides which), each put in the outbox in the pass's transaction, with the picture of the
curves an announced incident's alert is drawn from.

The notification log is the incidents table: what was said before is read back from the state, so
a restarted daemon says nothing twice."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from ..alerts.lifecycle import decide
from ..alerts.picture import Picture, picture
from ..detection.noise import fold, foldable, is_noisy, noise_ceiling, spread_before
from ..detection.streams import NO_POINTS, Points
from ..detection.ranks import launched, same_event, same_slowness, span, with_ranks
from ..model import Incident, NoisyRun, Notice, split_rank
from ..state import IncidentRow, State, Transaction
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
                 windows: dict[str, Points], points: int = 0) -> None:
        """Record the incident as judged now, and say what its lifecycle says of it (`quiet`: found
        in the history read at the first start, recorded without a word; `points`: the run's loss
        points read so far, for the rate its noisy notice says)."""
        sent = self.state.incident(inc.run, inc.rule, inc.step, inc.timeline)
        was_folded, joined = self.state.recorded_as(sent.id) if sent is not None else (False, None)
        if sent is not None and joined is not None:
            tx.update_incident(replace(sent, incident=replace(inc, ranks=())))  # (said by the incident it joined, which names the ranks)
            if sent.status == "open" and inc.over:
                self._last_rank_over(tx, joined, now=now, report=report)
            return
        if sent is None and (lead := self._same_event(inc)) is not None:
            self._join(tx, inc, lead, now=now, quiet=quiet, source=source, report=report)
            return
        if sent is not None and len(sent.incident.rank_list) > len(inc.rank_list):
            inc = with_ranks(inc, *sent.incident.rank_list, host=sent.incident.host)  # (ranks that joined it since)
        parent = self._parent(inc) if sent is None and inc.follows else None
        spread = None
        if not quiet and foldable(inc) and (sent is None or was_folded):
            steps, values, _ = windows.get("loss", NO_POINTS)
            spread = spread_before(steps, values, inc.step)
        folds = spread is not None and fold(inc, earlier=self.state.firings(inc.run, inc.rule, before=inc.step), spread=spread)
        decision = decide(sent, inc, now=now, quiet=quiet, update_every=self.update_every, parent=parent, folds=folds, was_folded=was_folded)
        if "resolved" in decision.kinds and sent is not None and self.state.open_joined(sent.id):
            # Its own rank recovered, not every rank that saw it: resolved when the last one is (_last_rank_over).
            decision = replace(decision, kinds=tuple(k for k in decision.kinds if k != "resolved"))
        if decision.row is None:
            ident = tx.add_incident(inc, source=source, quiet=quiet, now=now, parent=parent.id if parent else None, folded=decision.folded)
            if decision.folded and spread is not None:
                # (The rate up to this firing: a pass that read a whole file holds the points after it too.)
                after = int(np.count_nonzero(windows["loss"][0] > inc.step))
                self._noisy(tx, inc, points=points - after, ceiling=noise_ceiling(spread), source=source, now=now, report=report)
        else:
            ident = decision.row.id
            tx.update_incident(decision.row)
            if was_folded and not decision.folded:
                tx.unfold(ident)
        announced = any(kind in decision.kinds for kind in ANNOUNCING)
        pic = _kept_picture(inc, windows) if announced else None
        for kind in decision.kinds:
            previous = decision.previous_cause if kind in ("resolved", "relabelled") else None
            spark = pic.around() if pic is not None and kind in ANNOUNCING else ()
            self.send(tx, Notice(kind, inc.run, inc, source=source, previous_cause=previous, spark=spark), ident, now, report)
        if self.plot_sinks and pic is not None:
            tx.add_plot(ident, json.dumps(pic.to_json()), sinks=self.plot_sinks, now=now)

    def _same_event(self, inc: Incident) -> IncidentRow | None:
        """The incident another rank of the run raised first for the same event, if `inc` is a rank
        stream's (data parallel replicas all see a bad batch's spike; a failing rank takes the
        others down with errors of their own): the alert is that one's, naming every rank. Or the
        rank's own slowdown its straggling overlaps (or the reverse): one slow rank, one alert."""
        run, rank = split_rank(inc.run)
        if rank is None:
            # A launcher's own output (`torchrun ... > launcher.log`) ends in its table of the ranks' failure.
            folder = launched(inc)
            return next((row for row in self.state.launched_crashes(folder) if row.status == "open"), None) if folder else None
        rows = self.state.rank_event(run, inc.rule, timeline=inc.timeline, upto=span(inc)[1], crash=inc.is_crash)
        lead = next((row for row in rows if row.incident.run != inc.run and same_event(row.incident, inc)), None)
        if lead is None and inc.kind in ("throughput", "straggler"):
            # A rank slower than its past and than the other ranks is one slow rank: told by the first raised.
            lead = next((row for row in self.state.paced(inc.run, upto=span(inc)[1]) if same_slowness(row.incident, inc)), None)
        folded = lead is not None and self.state.recorded_as(lead.id)[0]
        lead = self._said_by(lead)
        if lead is not None and (folded or self.state.recorded_as(lead.id)[0]):
            return None  # (one rank's noise: another rank's firing is judged against its own noise, alerted if outside it)
        if lead is not None and lead.status == "resolved" and not inc.over and not self.state.open_joined(lead.id):
            return None  # (said resolved already: a rank still in trouble is an alert of its own, not hidden behind it)
        return lead

    def _join(self, tx: Transaction, inc: Incident, lead: IncidentRow, *, now: float, quiet: bool, source: str, report: PassReport) -> None:
        """Record `inc` as part of `lead`, another rank's incident of the same event, and have the
        lead name its rank: at once in the lead's alert when both were found in one pass
        (detection.ranks.together), else in an update of that alert while it is open."""
        folded, _ = self.state.recorded_as(lead.id)
        tx.add_incident(replace(inc, ranks=()), source=source, quiet=quiet or lead.quiet, now=now, joined=lead.id, folded=folded)
        rank = split_rank(inc.run)[1]
        if rank is None:  # (a launcher's table: the host of the rank it names, where the lead has none)
            if inc.host and not lead.incident.host and set(inc.rank_list) <= set(lead.incident.rank_list):
                tx.update_incident(replace(lead, incident=replace(lead.incident, host=inc.host)))
            return
        if rank in lead.incident.rank_list and (lead.incident.host or not inc.host):
            return
        widened = with_ranks(lead.incident, *inc.rank_list, host=inc.host)
        tx.update_incident(replace(lead, incident=widened))
        if not (quiet or lead.quiet or folded) and (lead.status == "open" or self.state.open_joined(lead.id)):  # (open, or its resolution held)
            self.send(tx, Notice("updated", widened.run, widened, source=lead.source, also=rank), lead.id, now, report)

    def _last_rank_over(self, tx: Transaction, lead_id: int, *, now: float, report: PassReport) -> None:
        """A rank's incident that joined another rank's just recovered: if it was the last one open
        and the incident it joined recovered before it, that incident's resolution, held until now."""
        lead = self.state.incident_of(lead_id)
        if lead is None or lead.status != "resolved" or lead.quiet or self.state.recorded_as(lead_id)[0] or self.state.open_joined(lead_id):
            return
        self.send(tx, Notice("resolved", lead.incident.run, lead.incident, source=lead.source), lead_id, now, report)

    def _parent(self, inc: Incident) -> IncidentRow | None:
        """The announced incident `inc` escalates: the grad-norm spike it follows, or, where that
        spike joined another rank's, the one that was announced."""
        return self._said_by(self.state.incident(inc.run, *inc.follows) if inc.follows else None)

    def _said_by(self, row: IncidentRow | None) -> IncidentRow | None:
        """`row`, or, where it joined another rank's incident, that one: the incident whose alert was sent."""
        joined = self.state.recorded_as(row.id)[1] if row is not None else None
        return row if joined is None else self.state.incident_of(joined)

    def _noisy(self, tx: Transaction, inc: Incident, *, points: int, ceiling: float, source: str, now: float, report: PassReport) -> None:
        """The run's noisy notice for the rule, once the firings it folded make it noisy as `scan`
        says a run is (detection.noise.is_noisy), and once per run and rule (kept in the state)."""
        fired, folded, largest = self.state.fold_counts(inc.run, inc.rule)
        if largest is None or not is_noisy(folded, points) or not tx.note_noisy(inc.run, inc.rule, now=now):
            return
        note = NoisyRun(rule=inc.rule, firings=fired, points=points, folded=folded, largest=largest[0], largest_step=largest[1], ceiling=ceiling)
        self.send(tx, Notice("noisy", inc.run, source=source, step=inc.step, noisy=note), None, now, report)

    def send(self, tx: Transaction, notice: Notice, incident_id: int | None, now: float, report: PassReport) -> None:
        """Into the outbox, for every sink, in the pass's transaction (and into the pass's report)."""
        report.notices.append(notice)
        tx.enqueue(notice, incident_id=incident_id, sinks=self.sinks, now=now)
