"""Which runs moved on and which went quiet: when each run last logged a new step, on a clock the
wall clock's steps do not move, and the resumed and stalled notices that follow from it.

A wall clock stepped forward (NTP after boot) must stall no run that is writing, and one stepped
back must delay no stall; yet a run last seen by an earlier process counts from the wall time it
stored. So quiet spells are measured on `Steady`, a clock that keeps the wall clock's reading but
not its steps."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from ..alerts.lifecycle import stalled
from ..detection.crash import TailSays
from ..model import Incident, Notice, split_rank
from ..state import RunRow, State, Transaction
from .notices import Notices
from .pass_report import PassReport


class Steady:
    """The wall clock with the steps it took since this process started taken out (each pass's
    wall time, less what it moved beyond the monotonic clock since the pass before): the time
    durations inside one process are measured in, which stored wall times of an earlier process
    still compare with."""

    def __init__(self, monotonic: Callable[[], float] | None) -> None:
        self.monotonic = monotonic
        self.skew = 0.0
        self.now = 0.0
        self._last: tuple[float, float] | None = None

    def tick(self, wall: float) -> None:
        if self.monotonic is not None:
            mono = self.monotonic()
            if self._last is not None:
                self.skew += (wall - self._last[0]) - (mono - self._last[1])
            self._last = (wall, mono)
        self.now = wall - self.skew


class Stalls:
    """When each run last advanced while this process ran, and which runs are quiet for `stall_after`."""

    def __init__(self, *, state: State, clock: Callable[[], float] | None, stall_after: float, notices: Notices,
                 before: Callable[..., TailSays | Incident] | None = None) -> None:
        self.state = state
        self.before = before
        """What to say of a run about to be called stalled (watch.crashes.Crashes.before_stall): its
        crash, said there instead, or what its logs' last lines say, which the notice carries."""
        self.steady = Steady(clock)
        """How long a run has been quiet, with the wall clock's steps taken out (the daemon passes
        time.monotonic; None: each pass's `now` is trusted, as the tests give it)."""
        self.stall_after = stall_after
        self.notices = notices
        self._advanced_at: dict[str, float] = {}
        """Runs that logged a new step while this process ran: when (steady time)."""
        self._resumed_jobs: set[str] = set()
        """Jobs written per rank whose resume this pass said (by their first rank to move)."""

    def tick(self, now: float) -> None:
        """A pass begins at wall time `now`."""
        self.steady.tick(now)
        self._resumed_jobs = set()

    def advanced(self, tx: Transaction, known: RunRow | None, run: str, last_step: int, *, now: float, report: PassReport) -> bool:
        """Whether the run's last step moved (a stalled run that moves has resumed: said here, once
        for a job written per rank: by its first rank to move again)."""
        if known is None or known.last_step is None or last_step != known.last_step:
            self._advanced_at[run] = self.steady.now
            if known is not None and known.stalled and self._first_of_its_job(run):
                self.notices.send(tx, Notice("resumed", run, step=last_step), None, now, report)
            return True
        return False

    def _first_of_its_job(self, run: str) -> bool:
        """Not a rank stream, or the first of its job's ranks to resume (in this pass, and none of
        the others running already): the job was said stalled when its last running rank went quiet."""
        job, rank = split_rank(run)
        if rank is None:
            return True
        first = job not in self._resumed_jobs and not self.state.ranks_running(job, but=run)
        self._resumed_jobs.add(job)
        return first

    def mark(self, tx: Transaction, now: float, active_runs: set[str], report: PassReport) -> None:
        """Mark and say the runs quiet for `stall_after`, measured on the steady clock (`active_runs`
        moved in this pass)."""
        steady = self.steady.now
        told: set[str] = set()
        for row in self.state.runs() if self.stall_after > 0 else ():
            row = replace(row, advanced_at=self._advanced_at.get(row.run, row.advanced_at))
            if row.run not in active_runs and stalled(row, now=steady, stall_after=self.stall_after):
                said = self.before(tx, row.run, now=now, report=report) if self.before is not None else TailSays(False, None)
                tx.mark_stalled(row.run)
                job, rank = split_rank(row.run)
                if isinstance(said, Incident):
                    told.add(job)
                    continue  # a crash supersedes the stall: it was said as the crash
                if rank is not None and (job in told or self.state.ranks_running(job, but=row.run)):
                    continue  # (a job written per rank stalls as one: said when its last running rank goes quiet)
                told.add(job)
                minutes = round((steady - row.advanced_at) / 60, 1)
                notice = Notice("stalled", row.run, step=row.last_step, minutes=minutes, tail=said.last_line, finished=said.finished)
                self.notices.send(tx, notice, None, now, report)
