"""The daemon's crash findings: when a run's console output has ended in an error, said once.

A traceback arrives over several passes (its frames, then its exception line, then a launcher's
table), and a run may live through one (a logged exception, then more steps). So a run is judged
for a crash only once it has gone quiet: no console file of it grew and no step was logged for
`crash_after` seconds (on the steady clock). Then the crash rules read the tails of its console
logs, as `scan` does; a crash found is an incident (run, rule, last step) like any other, so the
state says it once across restarts, and the run is marked stalled without a notice: the crash
said why it stopped. A run that logs a new step after its crash was said has been restarted: the
crash is resolved there.

The stall notice asks here too (`before_stall`): a run quiet for the stall window whose log ends
in an error is said as the crash, never as a bare `stalled`.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import replace

import polars as pl

from ..detection.crash import Crash, TailSays, find_crash, tail_says
from ..detection.ranks import causes_first, together
from ..detection.rules import RuleSet
from ..ingest.sources.texttail import is_console, tails_of
from ..model import Incident
from ..state import IncidentRow, State, Transaction
from .followed import Sighting
from .notices import Notices
from .pass_report import PassReport


class Crashes:
    """Which runs wrote console output lately, and the crash of those that went quiet since."""

    def __init__(self, *, state: State, notices: Notices, rules: Callable[[], RuleSet], crash_after: float) -> None:
        self.state = state
        self.notices = notices
        self.rules = rules
        self.crash_after = crash_after
        self._sizes: dict[str, int] = {}
        """Each console file's size as last seen (a restart sees every file anew: each of its runs is
        judged again once quiet, and the state says nothing it said before)."""
        self._pending: dict[str, tuple[float, bool]] = {}
        """Runs whose output moved: (steady time it last moved, whether that was history read at the
        first start, judged without a word)."""

    def saw(self, sightings: Mapping[str, Sighting], *, now: float, history: bool) -> None:
        """The pass's sightings: a console file that grew (or is new) makes its run pending."""
        for path, seen in sightings.items():
            if is_console(path) and self._sizes.get(path) != seen.size:
                self._sizes[path] = seen.size
                self._pending[seen.row.run] = (now, history)

    def moved(self, tx: Transaction, runs: Collection[tuple[str, int]], open_rows: Mapping[str, Sequence[IncidentRow]], *,
              now: float, steady: float, report: PassReport, frames: Mapping[str, Sequence[pl.DataFrame]]) -> None:
        """Runs that logged a new step (run, last step): their quiet starts again, and a crash said of
        one is over (the run was restarted: past it, or from a checkpoint before it, the first step
        of its new rows, `frames`). `open_rows`: the runs' incidents open before the pass (the pass's own judge
        read them; a crash is never opened by it)."""
        for run, _ in runs:
            if run in self._pending:
                self._pending[run] = (steady, self._pending[run][1])
        for run, step in runs:
            for row in open_rows.get(run, ()):
                if row.incident.is_crash:
                    # (A read of lines no rule judges moves the run on with no row: its new last step is the restart's.)
                    firsts = [int(first) for f in frames.get(run, ()) if (first := f.get_column("step").min()) is not None]
                    ended = replace(row.incident, end_step=step) if step > row.incident.step else replace(row.incident, resumed_from=min(firsts, default=step))
                    self.notices.incident(tx, ended, now=now, quiet=False, source=row.source, report=report, windows={})

    def judge(self, tx: Transaction, *, now: float, steady: float, report: PassReport) -> None:
        """The runs quiet for `crash_after` since their output last moved, judged (each once); the
        ranks of one run that crashed together are one crash naming them (detection.ranks.together)."""
        due = [run for run, (at, _) in self._pending.items() if steady - at >= self.crash_after]
        found = []
        for run in due:
            _, history = self._pending.pop(run)
            crash = self._find(run)
            if crash is not None:
                found.append((run, crash, history))
        named = together([crash.incident for _, crash, _ in found])
        for k in causes_first(named, [crash.failed_at for _, crash, _ in found]):
            run, crash, history = found[k]
            self._record(tx, run, named[k], source=crash.source, now=now, quiet=history, report=report)

    def crash_of(self, tx: Transaction, run: str, *, now: float, quiet: bool, report: PassReport) -> Incident | None:
        """The run's crash, if its console logs end in one: recorded, said (unless `quiet`), and the
        run marked stalled without a notice of its own."""
        crash = self._find(run)
        if crash is None:
            return None
        self._record(tx, run, crash.incident, source=crash.source, now=now, quiet=quiet, report=report)
        return crash.incident

    def _find(self, run: str) -> Crash | None:
        mine = self.rules().crashes_for(run)
        if not mine:
            return None
        known = self.state.runs_of([run]).get(run)
        return find_crash(tails_of(self._files(run), final=True, live=True), mine, run=run, last_step=known.last_step if known is not None else None)

    def _record(self, tx: Transaction, run: str, inc: Incident, *, source: str, now: float, quiet: bool, report: PassReport) -> None:
        self.notices.incident(tx, inc, now=now, quiet=quiet, source=source, report=report, windows={})
        known = self.state.runs_of([run]).get(run)
        if known is not None and not known.stalled:
            tx.mark_stalled(run)

    def before_stall(self, tx: Transaction, run: str, *, now: float, report: PassReport) -> TailSays | Incident:
        """What to say of a run quiet for the stall window: its crash (said here), or what its logs'
        tails say (the stall notice carries it)."""
        self._pending.pop(run, None)
        found = self.crash_of(tx, run, now=now, quiet=False, report=report)
        if found is not None:
            return found
        tails = tails_of(self._files(run), final=True, live=True)
        said = [tail_says(t.lines) for t in tails]
        return next((s for s in said if s.finished), next((s for s in said if s.last_line), TailSays(False, None)))

    def _files(self, run: str) -> list[str]:
        """The run's files (tails_of reads the console ones, among those the run writes now)."""
        return sorted(self.state.files_of_runs([run]))
