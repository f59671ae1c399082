"""The daemon's incremental pass: what is new in the followed files, judged by the engine `scan`
uses, turned into lifecycle notices, committed with the read offsets and outbox entries in one
transaction.

A pass walks the roots (or re-checks the paths inotify named), reads what is new (lossguard.watch.
reads), judges each run's tails and new points together (lossguard.watch.tails), says what the
lifecycle says of the incidents found (lossguard.watch.notices) and of the runs that moved on or
went quiet (lossguard.watch.stalls), and commits. This module only says which windows are new
(`Seen`) and hands on what the engine and the lifecycle decide. The clock is passed in.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import replace
from pathlib import Path

import polars as pl

from ..detection.causes import RunContext
from ..detection.engine import CONTEXT_TAGS, JUDGED, Seen, judge_runs
from ..detection.kinds import Rule
from ..detection.ranks import together
from ..detection.rules import RuleSet
from ..detection.streams import Points, by_run, by_run_and_metric
from ..ingest.reader import ReadOptions
from ..model import Incident
from ..state import IncidentRow, State, Transaction
from .budget import PASS_BUDGET, Budget
from .crashes import Crashes
from .followed import Sighting, Tracker, warned_through, within
from .notices import Notices
from .owed import OwedHistory
from .parts import LossParts
from .pass_report import PassReport
from .reads import READ_LIMIT, FileWrites, NewRows, Reads
from .replicas import Replicas
from .stalls import Stalls
from .tails import TAIL_KEYS, Tails, context_of, kept_tag_tails, kept_tails, points_before, restarted, timelines_before, windows_of


def _sources(parts: list[pl.DataFrame]) -> str:
    """The files a run's new rows came from, as an incident names its source."""
    rows = parts[0] if len(parts) == 1 else pl.concat(parts, rechunk=False)
    return ", ".join(rows.get_column("source").unique(maintain_order=True).to_list())


class Follower:
    """The followed files, the state they are judged into, and one pass over them at a time."""

    def __init__(
        self,
        roots: Sequence[Path],
        *,
        rules: RuleSet,
        state: State,
        options: ReadOptions = ReadOptions(),
        sinks: Sequence[str] = ("console",),
        plot_sinks: Sequence[str] = (),
        stall_after: float = 30 * 60,
        crash_after: float = 120.0,
        update_every: float = 300.0,
        read_limit: int = READ_LIMIT,
        pass_budget: float = PASS_BUDGET,
        log: Callable[[str], None] = print,
        warn: Callable[[str], None] | None = None,
        clock: Callable[[], float] | None = None,
        written: Sequence[Path] = (),
        shown: Callable[[str], str] | None = None,
        answered: Callable[[Path], bool] | None = None,
    ) -> None:
        """`shown`: a file's path as an alert names its source (an object's URL for its mirror's copy).
        `answered`: whether a root was read whole in this process (an object store's mirror: one
        complete sync); None: every root is, as a local folder is."""
        self.rules = rules
        self.shown = shown or (lambda text: text)
        self.state = state
        self.first_pass = True
        self.budget = Budget(limit=read_limit, budget=pass_budget)
        """Which runs a pass reads first and how long it waits for one file (set its `wake`)."""
        # `warn`: what is wrong with the input (a corrupt record, a file with no metrics); `log`: the
        # rest (a file followed, renamed, gone). The daemon logs them at WARNING and INFO.
        warn = warn or warned_through(log)
        self.reads = Reads(options=options, budget=self.budget, warn=warn)
        self.notices = Notices(state=state, sinks=sinks, plot_sinks=plot_sinks, update_every=update_every)
        self.replicas = Replicas(state=state, notices=self.notices)
        """The ranks of a run whose pace or loss stays apart from the others' (lossguard.watch.replicas)."""
        self.crashes = Crashes(state=state, notices=self.notices, rules=lambda: self.rules, crash_after=crash_after)
        """The runs whose console output moved, judged for a crash once quiet (lossguard.watch.crashes)."""
        self.stalls = Stalls(state=state, clock=clock, stall_after=stall_after, notices=self.notices, before=self.crashes.before_stall)
        """When runs last moved on, on a clock the wall clock's steps do not move (the daemon passes
        time.monotonic as `clock`; None: each pass's `now` is trusted, as the tests give it)."""
        self._best: dict[str, dict[str, int]] = {}
        """Per run, the best rank of a tag seen carrying each metric (`streams.by_metric`; kept in
        memory: after a restart the first pass's tags set it again)."""
        self.parts = LossParts(state)
        """The runs whose loss is the sum of its parts, and their parts kept between passes."""
        self.before_commit: Callable[[], None] = lambda: None
        """Called as a pass is about to commit (the daemon's crash hook for tests)."""
        self.tracker = Tracker(list(roots), options.globs, log, written, warn=warn)
        """(`written`: what the daemon writes itself, never read as a log: followed.own_files.)"""
        self.owed = OwedHistory(state, self.tracker.roots, answered or (lambda root: True), log)

    def run_pass(self, now: float, changed: Collection[str] | None = None) -> PassReport:
        """One pass: over every file under the roots, or (`changed`, from inotify) over just those
        paths, which falls back to the whole walk when they are not all files already followed."""
        report = PassReport()
        self.stalls.tick(now)
        # The walk and the reads before the write lock is taken: a walk that hangs on NFS or a slow
        # read holds up no other writer (the sender recording a delivered alert, a `silence add`);
        # the lock is held only while judging and committing, a few ms.
        files = FileWrites()
        first = self.first_pass and self.state.fresh
        held, paying = self.owed.due(first=first)
        sightings = self._sightings(files, changed, report, held=held, history=paying)
        if not report.walked:
            paying = []
        late = {p for p in sightings if within(p, paying)}
        self.crashes.saw({p: sightings[p] for p in late}, now=self.stalls.steady.now, history=True)
        self.crashes.saw({p: s for p, s in sightings.items() if p not in late}, now=self.stalls.steady.now, history=first)
        new = self.reads.read(files, sightings, report)
        with self.state.transaction() as tx:
            files.apply(tx)
            self.owed.record(tx, first=first, held=held, paid=paying)
            if new.last_steps:
                self._judge_runs(tx, new, now=now, report=report)
            self.crashes.judge(tx, now=now, steady=self.stalls.steady.now, report=report)
            self.stalls.mark(tx, now, set(new.last_steps), report)
            if self.state.fresh:
                tx.settle()
            self.before_commit()
        self.state.fresh = self.first_pass = False
        self.owed.committed(held=held, paid=paying)
        return report

    def _sightings(self, tx: FileWrites, changed: Collection[str] | None, report: PassReport, *,
                   held: Sequence[str] = (), history: Sequence[str] = ()) -> dict[str, Sighting]:
        """`held`, `history`: roots whose files are not followed yet, and roots whose files are read
        as history (OwedHistory.due), when the pass walks."""
        current = None
        if changed is not None and not self.first_pass:
            changed = self.tracker.named(changed)
            tracked = self.state.files(changed)
            # The other files of those runs too (a stat each): a tracker keeping a metric a file
            # (MLflow's file store, dvclive) writes a step's loss and grad norm to two files, and the
            # loss judged without the grad norm beside it would be labelled without it.
            tracked.update(self.state.files_of_runs({row.run for row in tracked.values()}))
            current = self.tracker.recheck(set(tracked) | changed, tracked)
        if current is None:
            tracked = self.state.files()
            current, gone = self.tracker.walk(tracked, quiet=self.first_pass and self.state.fresh, held=held, history=history)
            for path in gone:
                tx.forget_file(path)
                self.budget.forget(path)
            report.walked = True
        for path, seen in current.items():
            if seen.row != tracked.get(path):
                tx.put_file(seen.row)  # new, renamed, replaced or truncated
        return current

    def _judge_runs(self, tx: Transaction, new: NewRows, *, now: float, report: PassReport) -> None:
        """Every run with new rows, judged together: their tails in one query, their new points split
        into streams by one query, each rule run over all of them at once (engine.judge_runs), their
        tails and positions written in a few statements. Per run only numpy and Python remain, and
        the polars calls of labelling for the rare run that has something to label: a pass used
        to cost ~10 ms per busy run, which held the one-second promise for ~30 runs."""
        runs = sorted(new.frames)
        frame = pl.concat([part for run in runs for part in new.frames[run]], rechunk=False)
        report.rows += frame.height
        tails = self.state.tails_of(runs, TAIL_KEYS)
        sums = self.parts.summed(frame, runs, tails)
        frame = sums.frame
        points, _ = by_run_and_metric(frame, JUDGED, best=self._best)
        # A stream another run's file restarted (tails.restarted) is judged from its new points alone,
        # and so is a loss of the run's own that replaces the sum of its parts (watch.parts).
        restarts = {(run, m): tails[(run, m)].timeline + 1 for run in sorted(new.anew) for m in restarted(run, tails, points)}
        restarts |= {(run, "loss"): tails[(run, "loss")].timeline + 1 for run in sums.switched if (run, "loss") in points}
        if restarts:
            tails = {key: tail for key, tail in tails.items() if key not in restarts}
        windows = [windows_of(run, tails, points) for run in runs]
        open_rows = self.state.open_incidents_of(runs)  # (what the judge holds open, and the crashes a new step ends)
        seen = self._seen(runs, windows, tails, points, open_rows)
        active = [self.rules.for_run(run) for run in runs]
        tagged = frame.filter(pl.col("tag").is_in(list(CONTEXT_TAGS)))
        found = self._judge(runs, windows, seen, active, tagged, tails, [run in new.later_write_wins for run in runs])
        positions = self.state.runs_of(runs)
        kept = []
        moved: list[tuple[str, int]] = []
        said: set = set()
        timelines_of = [{**timelines_before(run, tails), **{m: t for (r, m), t in restarts.items() if r == run}} for run in runs]
        judged_now = [
            tuple(replace(i, timeline=timelines_of[k].get(i.metric, 0) + i.segment) for i in found.get(k, ()))
            # An incident the restarted run's predecessor left open ends where the new one began.
            + tuple(replace(i, resumed_from=int(points[(run, i.metric)][0][0])) for i in seen[k].open
                    if restarts.get((run, i.metric), 0) > i.timeline and not i.over)
            for k, run in enumerate(runs)
        ]
        named = iter(together([i for incidents in judged_now for i in incidents]))  # (the ranks that saw each, this pass)
        judged_now = [tuple(next(named) for _ in incidents) for incidents in judged_now]
        # (A rank apart from the others, raised ahead of its own slowdown: told as the straggler.)
        self.replicas.judge(tx, runs, windows, timelines_of, now=now, quiet=new.quiet, report=report, source=lambda run: self.shown(_sources(new.frames[run])))
        for k, run in enumerate(runs):
            timelines, incidents = timelines_of[k], judged_now[k]
            if incidents:
                source = self.shown(_sources(new.frames[run]))
                loss_points = (tails[(run, "loss")].seen if (run, "loss") in tails else 0) + (points[(run, "loss")][0].size if (run, "loss") in points else 0)
                for inc in incidents:
                    self.notices.incident(tx, inc, now=now, quiet=new.quiet[run], source=source, report=report, windows=windows[k], points=loss_points)
            judged = {i.key for i in incidents}
            said |= judged
            still_open = [i.step for i in seen[k].open if i.key not in judged] + [i.step for i in incidents if not i.over]
            fresh = {m: points[(run, m)][0].size for m in JUDGED if (run, m) in points}
            kept += kept_tails(run, windows[k], fresh, tails, active[k], still_open, timelines)
            if self.stalls.advanced(tx, positions.get(run), run, int(new.last_steps[run]), now=now, report=report):
                moved.append((run, int(new.last_steps[run])))
        tx.put_tails(kept + kept_tag_tails(tagged, tails) + sums.put)
        tx.drop_tails(sums.dropped)
        tx.advance_runs(moved, now=now)
        # (Still open after the pass: what it judged anew, a resume's end among them, is no longer as read.)
        still = {run: [r for r in rows if r.incident.key not in said] for run, rows in open_rows.items()}
        self.crashes.moved(tx, moved, still, now=now, steady=self.stalls.steady.now, report=report, frames=new.frames)

    def _seen(self, runs: list[str], windows: list[dict[str, Points]], tails: Tails, points: dict[tuple[str, str], Points],
              open_rows: Mapping[str, Sequence[IncidentRow]]) -> list[Seen]:
        """What earlier passes already judged of each run's windows: the points before its tails,
        where its new points start, and the incidents the state knows of and holds open (`open_rows`)."""
        firsts = {run: min(int(w[0].min()) for w in mine.values() if w[0].size) for run, mine in zip(runs, windows) if any(w[0].size for w in mine.values())}
        known = self.state.incident_keys_of(firsts)
        open_before = {run: tuple(r.incident for r in rows) for run, rows in open_rows.items()}
        return [
            Seen(
                before=points_before(run, tails),
                new_from={m: int(points[(run, m)][0][0]) for m in JUDGED if (run, m) in points},
                known=known.get(run, frozenset()),
                open=open_before.get(run, ()),
            )
            for run in runs
        ]

    def _judge(self, runs: list[str], windows: list[dict[str, Points]], seen: list[Seen], active: list[tuple[Rule, ...]],
               tagged: pl.DataFrame, tails: Tails, later_write_wins: list[bool]) -> dict[int, tuple[Incident, ...]]:
        """The new incidents of each run (by its index in `runs`), labelled with the context of the
        runs that have any (`tagged`: the pass's rows of the tags the labeller reads;
        `later_write_wins`: per run, whether its writer replaces a step's earlier write)."""
        tag_rows = tagged.partition_by("run", as_dict=True, maintain_order=True) if tagged.height else {}

        def view(k: int) -> tuple[Callable[[str], int], RunContext]:
            return (lambda m: int(windows[k][m][2].max()) if windows[k][m][2].size else 0), context_of(runs[k], tag_rows.get((runs[k],)), windows[k], tails)

        return judge_runs(by_run(windows, JUDGED), runs=runs, rules=active, seen=seen, view=view, later_write_wins=later_write_wins)
