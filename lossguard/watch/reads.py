"""What a pass reads: the new lines of each followed file, from its cursor, before the write lock.

The reads run before the pass takes the state's write lock (a slow read holds up no other writer),
so the file rows they move on are kept (`FileWrites`) and written in the pass's transaction. Which
runs are read first, and how long the pass waits for a file, is the budget's (lossguard.watch.
budget); files of formats read together, with little new in them, are read in one batch
(lossguard.ingest.readmany)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import polars as pl

from ..detection.engine import SCAN_NEEDS
from ..ingest import readmany
from ..ingest.discover import segment_order
from ..ingest.cursor import Cursor
from ..ingest.reader import ReadOptions, ReadResult, read, unrecognised
from ..ingest.formats.base import LATER_WRITE_WINS
from ..ingest.sources import sqlite_db
from ..state import FileRow, Transaction
from .budget import Budget
from .followed import Sighting, offset_of
from .pass_report import PassReport

BATCH_BYTES = 8 << 20
"""New bytes a pass reads in one batch at most (lossguard.ingest.readmany): the first pass over a thousand
runs' history reads them over a few passes rather than in one long one."""
READ_LIMIT = 16 << 20
"""Bytes of one file a pass reads at most: a long history is read over several passes, so the
daemon's memory is bounded by this, the streams and their windows, not by the size of the logs."""

Part = tuple[str, pl.DataFrame, bool, tuple[int, int], bool]
"""One run's share of a file's read: the run, its new rows, whether they are all history, the
span of steps its lines reached, and whether the read began at the file's start."""


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


@dataclass
class NewRows:
    """What a pass's reads found, per run."""

    frames: dict[str, list[pl.DataFrame]]
    """The new rows (only of the tags judging reads: SCAN_NEEDS), a frame per file read."""
    quiet: dict[str, bool]
    """Whether all of them are history (read from what the file held at the first start)."""
    last_steps: dict[str, int]
    """The last step each run's new lines reached, whatever tags they hold."""
    anew: set[str] = field(default_factory=set)
    """The runs with rows of a file read from its start (new, replaced, written again, truncated):
    where their steps go back, they may be another run's (lossguard.watch.tails.restarted)."""
    later_write_wins: set[str] = field(default_factory=set)
    """The runs with rows of a file of a format whose later write of a step replaces the earlier
    (formats.base.LATER_WRITE_WINS: TensorBoard's event files)."""


def _capped(row: FileRow, limit: int) -> int:
    """How much of the file a read may take: history found at the first start is read apart from
    what was written after it (a read ends where the file ended then), so a spike appended while
    the history is still being read is never taken for history with its last block."""
    left = row.quiet - offset_of(row).offset
    return min(limit, left) if left > 0 else limit


def _pending(seen: Sighting) -> int:
    """Bytes waiting in the file past its cursor."""
    return seen.size - offset_of(seen.row).offset


class Reads:
    """A pass's reads, with the budget that orders and bounds them and the formats it sniffed."""

    def __init__(self, *, options: ReadOptions, budget: Budget, warn: Callable[[str], None]) -> None:
        self.options = options
        self.budget = budget
        self.warn = warn
        self._formats: dict[str, str | None] = {}
        """The formats sniffed in this pass (of files not read before)."""
        self._said: dict[str, frozenset[str]] = {}
        """What the last read of each file warned of: said again only once it changed (a database
        locked at every pass for a minute is one warning, not one a pass)."""

    def read(self, tx: FileWrites, sightings: dict[str, Sighting], report: PassReport) -> NewRows:
        """The new rows of each run whose files changed. Runs left over from the last pass first,
        then the cheapest; a run whose file is slow to read waits for it, the others do not
        (lossguard.watch.budget)."""
        todo: dict[str, list[tuple[str, Sighting]]] = {}
        for path, seen in sightings.items():
            if not (seen.row.dead or seen.unchanged):
                todo.setdefault(seen.row.run, []).append((path, seen))
        order = self.budget.order({run: [(path, _pending(seen)) for path, seen in files] for run, files in todo.items()})
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
            got: list[Part] = []
            for path, seen in todo[run]:
                if not self._read_file(tx, path, seen, got, report):
                    break  # still reading: the run's later files wait for it, to keep their order
            together[run] = got
        rows = _by_run(order, together)
        rows.later_write_wins.update(
            run for run, files in todo.items() if run in rows.frames and any(self._format(path, seen) in LATER_WRITE_WINS for path, seen in files)
        )
        return rows

    def _read_together(self, tx: FileWrites, order: list[str], todo: dict[str, list[tuple[str, Sighting]]], report: PassReport) -> dict[str, list[Part]]:
        """The runs whose files are of formats read together (JSON lines, Megatron, key-value logs)
        with little new in them, read in one batch (lossguard.ingest.readmany: a parse per format), in `order`
        up to BATCH_BYTES; a file the batch leaves is read on its own, in its place among its run's
        files. Returns each run's parts."""
        chosen = self._batch(order, todo)
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
        got: dict[str, list[Part]] = {run: [] for run in chosen}
        for (path, seen), res in zip(jobs, results):
            if res is not None:
                self.budget.took(path, offset_of(seen.row), res, share)
            self._read_file(tx, path, seen, got[seen.row.run], report, res=res)
        return got

    def _batch(self, order: list[str], todo: dict[str, list[tuple[str, Sighting]]]) -> list[str]:
        """The runs read in one batch: those whose every file may be (readmany.batched, and little
        waiting by the budget), in `order`, until BATCH_BYTES are waiting in them."""
        chosen, waiting = [], 0
        for run in order:
            files = todo[run]
            pending = [_pending(seen) for _, seen in files]
            if not all(readmany.batched(self._format(path, seen), self.options) and self.budget.together(path, n) for (path, seen), n in zip(files, pending)):
                continue
            if chosen and waiting + sum(pending) > BATCH_BYTES:
                break
            chosen.append(run)
            waiting += sum(pending)
        return chosen

    def _format(self, path: str, seen: Sighting) -> str | None:
        """The file's format: as read before, else as sniffed (once a pass: a new file's head)."""
        if seen.row.format:
            return seen.row.format
        if path not in self._formats:
            self._formats[path] = self.options.format_of(Path(path))
        return self._formats[path]

    def _read_file(self, tx: FileWrites, path: str, seen: Sighting, got: list[Part], report: PassReport, *, res: ReadResult | None = None) -> bool:
        """Read `path` on from its cursor (`res`: already read); False while the read still runs
        (lossguard.watch.budget)."""
        row = seen.row
        fmt = self._format(path, seen)
        if fmt is None:
            if row.quiet and sqlite_db.is_database(row.fingerprint):
                # A database no format claims is an application's, never read, or one whose tables a
                # writer's lock hid: then it is no history (nothing of it could be read), and what
                # it holds is judged as new once its tables can be read.
                if (blocked := unrecognised(Path(path), explicit=False)) is not None:
                    self.warn(str(blocked))
                tx.put_file(replace(row, quiet=0))
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
        said = frozenset(map(str, res.problems))
        for text in dict.fromkeys(map(str, res.problems)):
            if text not in self._said.get(path, ()):
                self.warn(text)
        if said:
            self._said[path] = said
        else:
            self._said.pop(path, None)
        report.problems += len(res.problems)
        report.files += 1
        if seen.size > cursor.offset + _capped(row, block):  # (the read was cut short: more than a partial line waits)
            report.unfinished.append(path)
        if res.named:
            got.extend(_own_runs(res.frame, cursor.offset < row.quiet))
        elif res.span is not None:
            # Lines holding only tags no rule reads give no rows, but their steps still move the run on.
            got.append((row.run, res.frame, cursor.offset < row.quiet, res.span, cursor.offset == 0))
        # Quiet until the read passes the size the file had at the first start (or, for a database,
        # which shrinks when checkpointed, the size it has now: a database's read that got every
        # row says so by its offset, sources.sqlite_db), unless the file could not be read at all.
        quiet_until = row.quiet if res.cursor.offset < min(row.quiet, seen.size) and not _unread(cursor, res) else 0
        updated = FileRow(path, row.run, fmt, row.device, row.inode, row.fingerprint, res.cursor.to_json(), res.dead, quiet_until, seen.mtime)
        if updated != row:
            tx.put_file(updated)
        return True


def _unread(cursor: Cursor, res: ReadResult) -> bool:
    """Whether a read of a file never read before got nothing of it, and said why (locked, denied,
    an I/O error): what could not be read while the history was is no history. Once it can be, it
    is judged as new, and what it holds alerted (once: the incidents go with the cursor's commit).
    A record not yet whole (a W&B log's first) is not that: it is read, in time."""
    return cursor.offset == 0 and res.cursor.offset == 0 and res.span is None and not res.dead and any(not p.unfinished for p in res.problems)


def _own_runs(frame: pl.DataFrame, history: bool) -> list[Part]:
    """A read of a file that names its rows' runs (a tracker's database), as a part per run; their
    spans are their rows' (a run whose new rows judging does not read is not moved on)."""
    if not frame.height:
        return []
    return [
        (str(key[0]), rows, history, (int(rows.get_column("step").min()), int(rows.get_column("step").max())), False)
        for key, rows in frame.partition_by("run", as_dict=True, maintain_order=True).items()
    ]


def _by_run(order: list[str], parts: dict[str, list[Part]]) -> NewRows:
    """The parts read, gathered per run in `order` (a run the budget left has none); the runs a
    file names come after the run of the file that holds them."""
    rows = NewRows({}, {}, {})
    for file_run in order:
        for run, frame, history, span, anew in parts.get(file_run, ()):
            rows.frames.setdefault(run, []).append(frame)
            if anew:
                rows.anew.add(run)
            rows.quiet[run] = rows.quiet.get(run, True) and history
            rows.last_steps[run] = max(rows.last_steps.get(run, span[1]), span[1])
    return rows
