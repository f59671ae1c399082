"""The daemon's incremental pass: what is new in the followed files, judged by the engine `scan`
uses, turned into lifecycle notices, committed with the read offsets and outbox entries in one
transaction.

Each stream keeps a tail in the state store: enough points for every rule's window, plus the span of
any incident still open, so that judging tail + new points finds exactly the incidents a full pass
would, under the same keys (run, rule, first step). This module only says which windows are new
(`Seen`) and acts on what the engine and the lifecycle decide. The clock is passed in.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import polars as pl

from ..ingest import readmany, table
from ..alerts.lifecycle import decide, stalled
from .budget import PASS_BUDGET, Budget
from ..detection.causes import RunContext
from ..detection.engine import CONTEXT_TAGS, JUDGED, SCAN_NEEDS, Seen, context_from, judge_runs
from ..model import Incident, Notice
from ..alerts.picture import picture
from ..ingest.reader import ReadOptions, ReadResult, read
from ..detection.rules import RuleSet
from ..ingest.discover import segment_order
from .followed import Sighting, Tracker, offset_of
from ..state import FileRow, RunRow, State, Tail, Transaction
from ..detection.streams import NO_POINTS, Points, by_run, by_run_and_metric, collapse_points

TAIL_CAP = 20_000
CONTEXT_TAIL = 400
BATCH_BYTES = 8 << 20
"""New bytes a pass reads in one batch at most (lossguard.ingest.readmany): the first pass over a thousand
runs' history reads them over a few passes rather than in one long one."""
READ_LIMIT = 16 << 20
"""Bytes of one file a pass reads at most: a long history is read over several passes, so the
daemon's memory is bounded by this, the streams and their windows, not by the size of the logs."""


@dataclass
class PassReport:
    files: int = 0
    rows: int = 0
    walked: bool = False
    """The pass walked the roots (rather than re-checking only the paths inotify named)."""
    unfinished: list[str] = field(default_factory=list)
    """Files with more to read than this pass took (a block of READ_LIMIT, or left over when the pass
    spent its budget): the next pass should come at once. (A file whose read outlasted the budget is
    not among them: its read asks for the pass itself when it is done.)"""
    notices: list[Notice] = field(default_factory=list)
    problems: int = 0
    """Problems the readers met (each logged): the metrics count them."""


def _holding_finite(values: np.ndarray, n: int) -> int:
    """How many last points hold `n` finite ones: statistical rules' windows count finite values
    only, so a tail cut by points alone would come up short after a run of NaNs."""
    finite = np.flatnonzero(np.isfinite(values))
    return len(values) if finite.size <= n else len(values) - int(finite[-n])


def _frame(tail: Tail) -> pl.DataFrame:
    return pl.DataFrame({"step": pl.Series(tail.steps, dtype=pl.Int64()), "value": pl.Series(tail.values, dtype=pl.Float64())})


def _as_rows(tail: Tail, *, run: str, metric: str, tag: str) -> pl.DataFrame:
    """A tail in the canonical table's shape, for the context the labeller reads."""
    return _frame(tail).select(
        pl.lit(run).alias("run"), pl.lit("").alias("source"), "step", pl.lit(metric).alias("metric"),
        pl.lit(tag).alias("tag"), "value", pl.lit(None, dtype=pl.Float64).alias("wall_time"),
    )


_NO_ROWS = table.empty()


def _run_rows(parts: list[pl.DataFrame]) -> pl.DataFrame:
    return parts[0] if len(parts) == 1 else pl.concat(parts, rechunk=False)


def _capped(row: FileRow, limit: int) -> int:
    """How much of the file a read may take: history found at the first start is read apart from
    what was written after it (a read ends where the file ended then), so a spike appended while
    the history is still being read is never taken for history with its last block."""
    left = row.quiet - offset_of(row).offset
    return min(limit, left) if left > 0 else limit


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


@dataclass
class FileWrites:
    """The file rows a pass's walk and reads change, kept until the pass commits: those steps run
    before the write lock is taken, and their rows are written in the pass's transaction, with the
    incidents and outbox entries they led to (still one commit: a crash loses or repeats nothing)."""

    writes: list[FileRow | str] = field(default_factory=list)
    """In the order made: a row to put, or the path of a file no longer followed."""

    def put_file(self, f: FileRow) -> None:
        self.writes.append(f)

    def forget_file(self, path: str) -> None:
        self.writes.append(path)

    def apply(self, tx: Transaction) -> None:
        for w in self.writes:
            tx.forget_file(w) if isinstance(w, str) else tx.put_file(w)


class Follower:
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
        update_every: float = 300.0,
        read_limit: int = READ_LIMIT,
        pass_budget: float = PASS_BUDGET,
        log: Callable[[str], None] = print,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self.steady = Steady(clock)
        """How long a run has been quiet, with the wall clock's steps taken out (the daemon passes
        time.monotonic; None: each pass's `now` is trusted, as the tests give it)."""
        self._advanced_at: dict[str, float] = {}
        """Runs that logged a new step while this process ran: when (steady time)."""
        self.rules = rules
        self.state = state
        self.options = options
        self.sinks = list(sinks)
        self.plot_sinks = [s for s in plot_sinks if s in self.sinks]
        """Sinks that show an announced incident's picture: its curves are kept with it for them."""
        self.stall_after = stall_after
        self.update_every = update_every
        self.log = log
        self.first_pass = True
        self.budget = Budget(limit=read_limit, budget=pass_budget)
        self._formats: dict[str, str | None] = {}
        """The formats sniffed in this pass (of files not read before)."""
        self._best: dict[str, dict[str, int]] = {}
        """Per run, the best rank of a tag seen carrying each metric (`streams.by_metric`; kept in
        memory: after a restart the first pass's tags set it again)."""
        """Which runs a pass reads first and how long it waits for one file (set its `wake`)."""
        self.before_commit: Callable[[], None] = lambda: None
        """Called as a pass is about to commit (the daemon's crash hook for tests)."""
        self.tracker = Tracker(list(roots), options.globs, log)

    def run_pass(self, now: float, changed: Collection[str] | None = None) -> PassReport:
        """One pass: over every file under the roots, or (`changed`, from inotify) over just those
        paths, which falls back to the whole walk when they are not all files already followed."""
        report = PassReport()
        self.steady.tick(now)
        # The walk and the reads before the write lock is taken: a walk that hangs on NFS or a slow
        # read holds up no other writer (the sender recording a delivered alert, a `silence add`);
        # the lock is held only while judging and committing, a few ms.
        files = FileWrites()
        sightings = self._sightings(files, changed, report)
        frames, quiet, last_steps = self._read(files, sightings, report)
        with self.state.transaction() as tx:
            files.apply(tx)
            if last_steps:
                self._judge_runs(tx, frames, last_steps, now=now, quiet=quiet, report=report)
            self._stalls(tx, now, set(last_steps), report)
            if self.state.fresh:
                tx.settle()
            self.before_commit()
        self.state.fresh = self.first_pass = False
        return report

    def _sightings(self, tx: FileWrites, changed: Collection[str] | None, report: PassReport) -> dict[str, Sighting]:
        current = None
        if changed is not None and not self.first_pass:
            tracked = self.state.files(changed)
            current = self.tracker.recheck(changed, tracked)
        if current is None:
            tracked = self.state.files()
            current, gone = self.tracker.walk(tracked, quiet=self.first_pass and self.state.fresh)
            for path in gone:
                tx.forget_file(path)
                self.budget.forget(path)
            report.walked = True
        for path, seen in current.items():
            if seen.row != tracked.get(path):
                tx.put_file(seen.row)  # new, renamed, replaced or truncated
        return current

    def _read(
        self, tx: FileWrites, sightings: dict[str, Sighting], report: PassReport
    ) -> tuple[dict[str, list[pl.DataFrame]], dict[str, bool], dict[str, int]]:
        """The new rows of each run (only of the tags judging reads: SCAN_NEEDS), whether all of them
        are history (quiet), and the last step each run's new lines reached, whatever tags they hold.
        Runs left over from the last pass first, then the cheapest; a run whose file is slow to read
        waits for it, the others do not (lossguard.watch.budget)."""
        todo: dict[str, list[tuple[str, Sighting]]] = {}
        for path, seen in sightings.items():
            if not (seen.row.dead or seen.unchanged):
                todo.setdefault(seen.row.run, []).append((path, seen))
        order = self.budget.order({run: [(path, seen.size - offset_of(seen.row).offset) for path, seen in files] for run, files in todo.items()})
        frames: dict[str, list[pl.DataFrame]] = {}
        quiet: dict[str, bool] = {}
        self.budget.deferred = set()
        for run in todo:
            # A rotated segment before its live log, so a run's lines are judged in the order written.
            todo[run].sort(key=lambda item: segment_order(item[0]))
        self._formats = {}
        together = self._read_together(tx, order, todo, report)
        rest = [run for run in order if run not in together]
        for i, run in enumerate(rest):
            if (i or together) and self.budget.spent():
                self.budget.deferred = set(rest[i:])
                report.unfinished += [path for r in rest[i:] for path, _ in todo[r]]
                break
            got: list[tuple[pl.DataFrame, bool]] = []
            for path, seen in todo[run]:
                if not self._read_file(tx, path, seen, got, report):
                    break  # still reading: the run's later files wait for it, to keep their order
            together[run] = got
        last_steps: dict[str, int] = {}
        for run in order:
            for frame, history, span in together.get(run, ()):
                frames.setdefault(run, []).append(frame)
                quiet[run] = quiet.get(run, True) and history
                last_steps[run] = max(last_steps.get(run, span[1]), span[1])
        return frames, quiet, last_steps

    def _read_together(self, tx: FileWrites, order: list[str], todo: dict[str, list[tuple[str, Sighting]]], report: PassReport) -> dict[str, list]:
        """The runs whose files are of formats read together (JSON lines, Megatron, key-value logs)
        with little new in them, read in one batch (lossguard.ingest.readmany: a parse per format), in `order`
        up to BATCH_BYTES; a file the batch leaves is read on its own, in its place among its run's
        files. Returns each run's (frame, history) parts."""
        chosen, waiting = [], 0
        for run in order:
            files = todo[run]
            pending = [seen.size - offset_of(seen.row).offset for _, seen in files]
            if not all(readmany.batched(self._format(path, seen), self.options) and self.budget.together(path, n) for (path, seen), n in zip(files, pending)):
                continue
            if chosen and waiting + sum(pending) > BATCH_BYTES:
                break
            chosen.append(run)
            waiting += sum(pending)
        jobs = [(path, seen) for run in chosen for path, seen in todo[run]]
        if not jobs:
            return {}
        started = time.monotonic()
        results = readmany.read_many(
            [
                readmany.Job(Path(path), offset_of(seen.row), seen.row.run, self._format(path, seen) or "", _capped(seen.row, self.budget.block(path)))
                for path, seen in jobs
            ],
            options=self.options,
            needs=SCAN_NEEDS,
        )
        share = (time.monotonic() - started) / len(jobs)
        got: dict[str, list] = {run: [] for run in chosen}
        for (path, seen), res in zip(jobs, results):
            if res is not None:
                self.budget.took(path, offset_of(seen.row), res, share)
            self._read_file(tx, path, seen, got[seen.row.run], report, res=res)
        return got

    def _format(self, path: str, seen: Sighting) -> str | None:
        """The file's format: as read before, else as sniffed (once a pass: a new file's head)."""
        if seen.row.format:
            return seen.row.format
        if path not in self._formats:
            self._formats[path] = self.options.format_of(Path(path))
        return self._formats[path]

    def _read_file(self, tx: FileWrites, path: str, seen: Sighting, got: list, report: PassReport, *, res: ReadResult | None = None) -> bool:
        """Read `path` on from its cursor (`res`: already read); False while the read still runs
        (lossguard.watch.budget)."""
        row = seen.row
        fmt = self._format(path, seen)
        if fmt is None:
            return True
        cursor = offset_of(row)
        block = self.budget.block(path)
        if res is None:
            job = lambda limit: read(  # noqa: E731
                Path(path), cursor, run=row.run, fmt=fmt, final=False, options=self.options, limit=_capped(row, limit), needs=SCAN_NEEDS
            )
            res = self.budget.read(path, cursor, seen.size - cursor.offset, job)
        if res is None:
            return False
        for p in res.problems:
            self.log(f"warning: {p}")
        report.problems += len(res.problems)
        report.files += 1
        if seen.size > cursor.offset + _capped(row, block):  # (the read was cut short: more than a partial line waits)
            report.unfinished.append(path)
        if res.span is not None:
            # Lines holding only tags no rule reads give no rows, but their steps still move the run on.
            got.append((res.frame, cursor.offset < row.quiet, res.span))
        # Quiet until the read passes the size the file had at the first start.
        quiet_until = row.quiet if res.cursor.offset < row.quiet else 0
        updated = FileRow(path, row.run, fmt, row.device, row.inode, row.fingerprint, res.cursor.to_json(), res.dead, quiet_until, seen.mtime)
        if updated != row:
            tx.put_file(updated)
        return True

    def _judge_runs(
        self, tx: Transaction, frames: dict[str, list[pl.DataFrame]], last_steps: dict[str, int], *, now: float, quiet: dict[str, bool], report: PassReport
    ) -> None:
        """Every run with new rows, judged together: their tails in one query, their new points split
        into streams by one query, each rule run over all of them at once (engine.judge_runs), their
        tails and positions written in a few statements. Per run only numpy and Python remain, and
        the polars calls of labelling for the rare run that has something to label: a pass used
        to cost ~10 ms per busy run, which held the one-second promise for ~30 runs."""
        runs = sorted(frames)
        frame = pl.concat([part for run in runs for part in frames[run]], rechunk=False)
        report.rows += frame.height
        keys = [*JUDGED, *(f"tag:{tag}" for tag in CONTEXT_TAGS)]
        tails = self.state.tails_of(runs, keys)
        new, _ = by_run_and_metric(frame, JUDGED, best=self._best)
        empty = Tail.empty()
        windows: list[dict[str, Points]] = []
        seen: list[Seen] = []
        for run in runs:
            mine = {}
            for m in JUDGED:
                tail, fresh = tails.get((run, m), empty), new.get((run, m))
                if not tail.steps.size:
                    mine[m] = fresh if fresh is not None else NO_POINTS
                elif fresh is None:
                    mine[m] = collapse_points(tail.steps, tail.values)
                else:
                    mine[m] = collapse_points(np.concatenate([tail.steps, fresh[0]]), np.concatenate([tail.values, fresh[1]]))
            windows.append(mine)
        firsts = {run: min(int(w[0].min()) for w in mine.values() if w[0].size) for run, mine in zip(runs, windows) if any(w[0].size for w in mine.values())}
        known = self.state.incident_keys_of(firsts)
        open_before = {run: tuple(r.incident for r in rows) for run, rows in self.state.open_incidents_of(runs).items()}
        for run in runs:
            seen.append(Seen(
                before={m: max(0, tails.get((run, m), empty).seen - tails.get((run, m), empty).steps.size) for m in JUDGED},
                new_from={m: int(new[(run, m)][0][0]) for m in JUDGED if (run, m) in new},
                known=known.get(run, frozenset()),
                open=open_before.get(run, ()),
            ))
        active = [self.rules.for_run(run) for run in runs]

        tagged = frame.filter(pl.col("tag").is_in(list(CONTEXT_TAGS)))
        tag_rows = tagged.partition_by("run", as_dict=True, maintain_order=True) if tagged.height else {}

        def view(k: int) -> tuple[Callable[[str], int], RunContext]:
            return (lambda m: int(windows[k][m][2].max()) if windows[k][m][2].size else 0), self._context(runs[k], tag_rows.get((runs[k],)), windows[k], tails)

        found = judge_runs(by_run(windows, JUDGED), runs=runs, rules=active, seen=seen, view=view)
        positions = self.state.runs_of(runs)
        kept: list[tuple[str, str, Tail]] = []
        moved: list[tuple[str, int]] = []
        for k, run in enumerate(runs):
            incidents = found.get(k, ())
            if incidents:
                source = ", ".join(_run_rows(frames[run]).get_column("source").unique(maintain_order=True).to_list())
                for inc in incidents:
                    self._lifecycle(tx, inc, now=now, quiet=quiet[run], source=source, report=report, windows=windows[k])
            judged = {i.key for i in incidents}
            still_open = [i.step for i in seen[k].open if i.key not in judged] + [i.step for i in incidents if not i.over]
            fresh = {m: new[(run, m)][0].size for m in JUDGED if (run, m) in new}
            kept += self._keep_tails(run, windows[k], fresh, tails, active[k], still_open)
            if self._advanced(tx, positions.get(run), run, int(last_steps[run]), now=now, report=report):
                moved.append((run, int(last_steps[run])))
        tx.put_tails(kept + self._keep_tag_tails(tagged, tails))
        tx.advance_runs(moved, now=now)

    def _context(self, run: str, tagged: pl.DataFrame | None, windows: dict[str, Points], tails: dict) -> RunContext:  # noqa: ANN001
        """Labels with the context the daemon has: each stream's window (its tail, then what just
        arrived, in the order written: a resume shows as a segment, as in `scan`), and the tags the
        labeller reads as they are (their tails, then the new rows `tagged`: the later write wins)."""
        parts = []
        for tag in CONTEXT_TAGS:
            tail = tails.get((run, f"tag:{tag}"))
            if tail is not None and tail.steps.size:
                parts.append(_as_rows(tail, run=run, metric="loss_scale" if tag.startswith("OVERFLOW") else tag, tag=tag))
        if tagged is not None:
            parts.append(tagged.select(table.COLUMNS))
        return context_from(pl.concat(parts) if parts else _NO_ROWS, windows)

    def _lifecycle(self, tx: Transaction, inc: Incident, *, now: float, quiet: bool, source: str, report: PassReport,
                   windows: dict[str, Points]) -> None:
        sent = self.state.incident(inc.run, inc.rule, inc.step)
        parent = self.state.incident(inc.run, *inc.follows) if sent is None and inc.follows else None
        decision = decide(sent, inc, now=now, quiet=quiet, update_every=self.update_every, parent=parent)
        if decision.row is None:
            ident = tx.add_incident(inc, source=source, quiet=quiet, now=now, parent=parent.id if parent else None)
        else:
            ident = decision.row.id
            tx.update_incident(decision.row)
        announced = "opened" in decision.kinds or "escalated" in decision.kinds
        # The curves as they are now, committed with the alert: its sparkline, and the picture drawn
        # and sent after it goes out (the sender's thread), from what the daemon saw when it raised it.
        pic = picture(inc, {m: (w[0], w[1]) for m, w in windows.items() if w[0].size}) if announced else None
        for kind in decision.kinds:
            previous = decision.previous_cause if kind in ("resolved", "relabelled") else None
            spark = pic.around() if pic is not None and kind in ("opened", "escalated") else ()
            self._notify(tx, Notice(kind, inc.run, inc, source=source, previous_cause=previous, spark=spark), ident, now, report)
        if self.plot_sinks and pic is not None:
            tx.add_plot(ident, json.dumps(pic.to_json()), sinks=self.plot_sinks, now=now)

    def _keep_tails(self, run: str, windows: dict[str, Points], fresh: dict[str, int], tails: dict, active, open_steps: list[int]) -> list[tuple[str, str, Tail]]:  # noqa: ANN001
        # Keep each stream's tail: windows for every rule, and the span of incidents still open.
        need = max([r.lookback for r in active] + [16]) + 8
        judged = {r.metric for r in active}
        out = []
        for m, (steps, values, _) in windows.items():
            if not steps.size:
                continue
            keep = need
            if open_steps and m in judged:
                keep = max(keep, int(np.count_nonzero(steps >= min(open_steps))) + need)
            keep = max(keep, CONTEXT_TAIL) if m != "loss" else keep
            keep = max(keep, _holding_finite(values, need))
            n = min(keep, TAIL_CAP)
            before = tails.get((run, m))
            out.append((run, m, Tail(steps[-n:], values[-n:], (before.seen if before is not None else 0) + fresh.get(m, 0))))
        return out

    def _keep_tag_tails(self, tagged: pl.DataFrame, tails: dict) -> list[tuple[str, str, Tail]]:  # noqa: ANN001
        """The context tags' tails (DeepSpeed's OVERFLOW lines, Megatron's counters), for the runs
        whose new rows (`tagged`: the pass's rows of those tags) hold any."""
        out = []
        for (run, tag), rows in tagged.partition_by("run", "tag", as_dict=True, maintain_order=True).items() if tagged.height else ():
            old = tails.get((run, f"tag:{tag}"), Tail.empty())
            both = pl.concat([_frame(old), rows.select("step", "value")]).tail(CONTEXT_TAIL)
            out.append((run, f"tag:{tag}", Tail(both.get_column("step").to_numpy(), both.get_column("value").to_numpy(), old.seen + rows.height)))
        return out

    def _advanced(self, tx: Transaction, known: RunRow | None, run: str, last_step: int, *, now: float, report: PassReport) -> bool:
        """Whether the run's last step moved (a stalled run that moves has resumed: said here)."""
        if known is None or known.last_step is None or last_step != known.last_step:
            self._advanced_at[run] = self.steady.now
            if known is not None and known.stalled:
                self._notify(tx, Notice("resumed", run, step=last_step), None, now, report)
            return True
        return False

    def _stalls(self, tx: Transaction, now: float, active_runs: set[str], report: PassReport) -> None:
        """Runs quiet for `stall_after`, measured on the steady clock: a wall clock stepped forward
        (NTP after boot) stalls no run that is writing, and one stepped back delays no stall. A run
        last seen by an earlier process counts from the wall time it stored."""
        steady = self.steady.now
        for row in self.state.runs() if self.stall_after > 0 else ():
            row = replace(row, advanced_at=self._advanced_at.get(row.run, row.advanced_at))
            if row.run not in active_runs and stalled(row, now=steady, stall_after=self.stall_after):
                tx.mark_stalled(row.run)
                minutes = round((steady - row.advanced_at) / 60, 1)
                self._notify(tx, Notice("stalled", row.run, step=row.last_step, minutes=minutes), None, now, report)

    def _notify(self, tx: Transaction, notice: Notice, incident_id: int | None, now: float, report: PassReport) -> None:
        report.notices.append(notice)
        tx.enqueue(notice, incident_id=incident_id, sinks=self.sinks, now=now)
