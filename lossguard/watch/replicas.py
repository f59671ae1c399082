"""The daemon's stragglers: a rank of a run written per rank whose step time stays above the other
ranks' (or, among three or more data parallel replicas, whose loss leaves theirs), judged as scan
judges it (detection.ranks.stragglers) each time the rank's own points arrive, over its window and
the other ranks' tails (their files may be read in other passes). One incident per streak, on the
rank's stream: updated while the rank stays apart, resolved when its points come back among the
others', never raised again for the same streak once the window has moved on."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace

import numpy as np

from ..detection.ranks import COMPARED, Series, back_among, rule_for, stragglers, together
from ..detection.streams import Points
from ..model import Incident, ranked, split_rank
from ..state import State, Transaction
from .notices import Notices
from .pass_report import PassReport


class Replicas:
    def __init__(self, *, state: State, notices: Notices) -> None:
        self.state = state
        self.notices = notices

    def judge(self, tx: Transaction, runs: Sequence[str], windows: Sequence[Mapping[str, Points]], timelines: Sequence[Mapping[str, int]], *,
              now: float, quiet: Mapping[str, bool], source: Callable[[str], str], report: PassReport) -> None:
        """The rank streams among `runs` (the pass's runs with new rows, `windows` theirs; `timelines`
        theirs before the pass, tails.timelines_before), each compared with every rank of its run on
        the timeline each is on now (a job restarted from a checkpoint is compared from its restart);
        `source`: what a run's alert names as its source."""
        bases: dict[str, dict[str, tuple[Mapping[str, Points], Mapping[str, int]]]] = {}
        for run, window, timeline in zip(runs, windows, timelines):
            base, rank = split_rank(run)
            if rank is not None:
                bases.setdefault(base, {})[rank] = (window, timeline)
        for base, mine in bases.items():
            others = [r for r in self.state.rank_streams(base) if split_rank(r)[1] not in mine]
            tails = self.state.tails_of(others, COMPARED)
            for metric in COMPARED:
                series = {rank: _last_timeline(w[metric][0], w[metric][1]) for rank, (w, _) in mine.items() if metric in w and w[metric][0].size}
                series |= {split_rank(r)[1]: _last_timeline(t.steps, t.values) for (r, m), t in tails.items() if m == metric and t.steps.size}
                if len(series) < 2 or not any(rank in series for rank in mine):
                    continue
                # (On the ranks' streams, and each naming the ranks apart with it: one slow node, one alert.)
                found = together([replace(inc, run=ranked(base, inc.ranks[0]), ranks=()) for inc in stragglers(series, run=base, metric=metric, judged=mine)])
                for rank, (window, timeline) in mine.items():
                    if metric not in window or not window[metric][0].size:
                        continue
                    stream = ranked(base, rank)
                    on = timeline.get(metric, 0) + int(window[metric][2][-1])
                    inc = next((replace(i, timeline=on) for i in found if i.run == stream), None)
                    self._one(tx, stream, inc, series, metric=metric, timeline=on, now=now, quiet=quiet.get(stream, False), source=source(stream),
                              report=report)

    def _one(self, tx: Transaction, stream: str, inc: Incident | None, series: Mapping[str, Series], *, metric: str, timeline: int,
             now: float, quiet: bool, source: str, report: PassReport) -> None:
        known = self.state.latest_incident(stream, rule_for(metric), timeline=timeline)
        if known is not None and known.status == "open":
            if inc is None:
                # The window no longer holds its streak: over once the rank's points are among the others' again.
                back = back_among(series, split_rank(stream)[1] or "", metric=metric, after=known.incident.last_flagged_step or known.incident.step)
                if back is not None:
                    self.notices.incident(tx, replace(known.incident, end_step=back), now=now, quiet=quiet, source=source, report=report, windows={})
                return
            # The same streak, seen again: kept under the step it was raised at, over once it ended.
            ended = inc.end_step is not None and inc.step > known.incident.step
            inc = replace(known.incident, end_step=inc.end_step or inc.step) if ended else replace(inc, step=known.incident.step)
        elif inc is None or (known is not None and inc.step <= (known.incident.end_step or known.incident.step)):
            return  # (no streak, or the one already told, its start moved as the window moved on)
        self.notices.incident(tx, inc, now=now, quiet=quiet, source=source, report=report, windows={})


def _last_timeline(steps: np.ndarray, values: np.ndarray) -> Series:
    """A stream's points since its steps last went back (a restart from a checkpoint): the run as it
    is now, which the other ranks' are compared with on the same steps."""
    back = np.flatnonzero(np.diff(steps) <= 0)
    start = int(back[-1]) + 1 if back.size else 0
    return steps[start:], values[start:]
