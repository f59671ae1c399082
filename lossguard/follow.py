"""The daemon's incremental pass: what is new in the followed files, judged with the same detection
and labelling as `scan`, turned into incident lifecycle events, committed with the read offsets and
outbox entries in one transaction.

Each stream keeps a tail in the state store: enough points for every rule's window, plus the span of
any incident still open, so that detection over tail + new points finds exactly the incidents a full
pass would, under the same keys (run, rule, first step). The clock is passed in.
"""

from __future__ import annotations

import json
import os
from collections import OrderedDict
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import polars as pl

from . import table
from .cursor import Cursor
from .detect import detect
from .engine import JUDGED, run_context
from .causes import label_all
from .errors import UsageError
from .model import Cause, Incident
from .reader import ReadOptions, collect, read
from .sources.discover import Listings, is_candidate, segment_order
from .rules import RuleSet
from .state import FileRow, State
from .streams import by_metric, collapse

FINGERPRINT = 64
TAIL_CAP = 20_000
CONTEXT_TAIL = 400
TAIL_CACHE = 512
READ_LIMIT = 16 << 20
"""Bytes of one file a pass reads at most: a long history is read over several passes, so the
daemon's memory is bounded by this, the streams and their windows, not by the size of the logs."""
CONTEXT_TAGS = ("OVERFLOW loss scale", "number of skipped iterations", "number of nan iterations")


def incident_from_json(body: dict) -> Incident:
    def num(x: object) -> float | None:
        return None if x is None else float(x)

    return Incident(
        run=body["run"], metric=body["metric"], rule=body["rule"], kind=body["kind"], severity=body["severity"],
        step=body["step"], peak_step=body["peak_step"], value=float(body["value"]), baseline=num(body["baseline"]),
        threshold=num(body["threshold"]), end_step=body["end_step"], points=body["points"],
        causes=tuple(Cause(**c) for c in body["causes"]),
    )


@dataclass
class PassReport:
    files: int = 0
    rows: int = 0
    walked: bool = False
    """The pass walked the roots (rather than re-checking only the paths inotify named)."""
    unfinished: list[str] = field(default_factory=list)
    """Files with more to read than one pass takes (READ_LIMIT): the next pass should come at once."""
    notices: list[tuple[str, dict]] = field(default_factory=list)


@lru_cache(maxsize=65536)
def _cursor(text: str) -> Cursor:
    return Cursor.from_json(text)


def offset_of(row: FileRow) -> Cursor:
    """The row's cursor (parsed once per distinct state: idle passes see the same JSON again)."""
    return _cursor(row.cursor)


def _head(path: Path) -> bytes:
    with open(path, "rb") as fh:
        return fh.read(FINGERPRINT)


def _same_file(row: FileRow, device: int, inode: int, head: bytes) -> bool:
    if (row.device, row.inode) != (device, inode):
        return False
    n = min(len(row.fingerprint), len(head))
    return row.fingerprint[:n] == head[:n]


class Follower:
    def __init__(
        self,
        roots: Sequence[Path],
        *,
        rules: RuleSet,
        state: State,
        options: ReadOptions = ReadOptions(),
        sinks: Sequence[str] = ("console",),
        stall_after: float = 30 * 60,
        update_every: float = 300.0,
        read_limit: int = READ_LIMIT,
        log: Callable[[str], None] = print,
    ) -> None:
        self.roots = list(roots)
        self.rules = rules
        self.state = state
        self.options = options
        self.sinks = list(sinks)
        self.stall_after = stall_after
        self.update_every = update_every
        self.read_limit = read_limit
        self.log = log
        self.first_pass = True
        self._warned: set[str] = set()
        self._now = 0.0
        self._listings = Listings()
        # Stream tails as committed, for the runs written to lately: a busy run's pass need not
        # decode its tails from SQLite again. What a pass writes is staged until its commit.
        self._tails: OrderedDict[tuple[str, str], tuple[pl.DataFrame, int]] = OrderedDict()
        self._staged: dict[tuple[str, str], tuple[pl.DataFrame, int]] = {}

    # --- which files ---------------------------------------------------------------------------
    def _discover(self, db, tracked: dict[str, FileRow]) -> dict[str, FileRow]:  # noqa: ANN001
        quiet = self.first_pass and self.state.fresh
        try:
            found, problems = collect(self.roots, self.options, listings=self._listings)
        except UsageError as exc:
            self._warn_once(str(exc))
            found, problems = [], []
        for p in problems:
            self._warn_once(str(p))
        by_ident = {(r.device, r.inode): r for r in tracked.values()}
        current: dict[str, FileRow] = {}
        seen_paths = set()
        for f in found:
            path = str(f.path)
            seen_paths.add(path)
            row = self._identify(path, f.run, tracked.get(path), by_ident, quiet)
            if row is not None:
                current[path] = row
        for path, row in tracked.items():
            if path not in current and path not in seen_paths and all(r.inode != row.inode or r.device != row.device for r in current.values()):
                self.log(f"{path}: file is gone; no longer followed")
                db.execute("DELETE FROM files WHERE path=?", (path,))
        return current

    def _recheck(self, changed: Collection[str], tracked: dict[str, FileRow]) -> dict[str, FileRow] | None:
        """The files inotify said changed, when they are all files we follow (appends: the hot
        path); None when the tree itself changed (a new log, a file gone) and only a walk can tell
        what is what."""
        globs = [s.files for s in self.options.custom if s.files]
        current: dict[str, FileRow] = {}
        for path in changed:
            row = tracked.get(path)
            if row is None:
                if is_candidate(os.path.basename(path), globs):
                    return None
                continue  # checkpoints, wandb files, our own state: nothing to read
            identified = self._identify(path, row.run, row, {}, False)
            if identified is None:
                return None
            current[path] = identified
        return current

    def _identify(self, path: str, run: str, row: FileRow | None, by_ident: dict, quiet: bool) -> FileRow | None:
        """The row to read `path` with: the saved one if the file is the one we followed, a fresh one
        if it is new, replaced or truncated, the old one renamed if it moved here (rotation)."""
        try:
            st = os.stat(path)
            device, inode, size = st.st_dev, st.st_ino, st.st_size
            # A stat is enough for a file untouched since the last read; one that changed gets its
            # first bytes compared too (truncated and rewritten between two passes, even to the
            # same size).
            settled = (
                row is not None and (row.device, row.inode) == (device, inode) and len(row.fingerprint) >= FINGERPRINT
                and size == offset_of(row).offset and row.mtime == st.st_mtime_ns
            )
            head = row.fingerprint if settled else _head(Path(path))
        except OSError:
            return None
        self.mtimes[path] = st.st_mtime_ns
        self.sizes[path] = size
        if row is not None and _same_file(row, device, inode, head):
            cursor = offset_of(row)
            if size < cursor.offset:
                self.log(f"{path}: file shrank below the read offset (truncated in place, copytruncate?): reading it again from the start")
                return FileRow(path, row.run, row.format, device, inode, head, Cursor().to_json(), False, 0)
            if len(row.fingerprint) < FINGERPRINT and len(head) > len(row.fingerprint):
                return FileRow(path, row.run, row.format, device, inode, head, row.cursor, row.dead, row.quiet, row.mtime)
            return row
        moved = by_ident.get((device, inode))
        if moved is not None and moved.path != path and _same_file(moved, device, inode, head):
            # Renamed (log rotation): keep reading it from where we were, under its new name.
            self.log(f"{moved.path}: renamed to {path}; reading on from byte {Cursor.from_json(moved.cursor).offset}")
            return FileRow(path, moved.run, moved.format, device, inode, moved.fingerprint, moved.cursor, moved.dead, moved.quiet, moved.mtime)
        if row is not None:
            self.log(f"{path}: replaced by another file; reading the new one from the start")
        # History found at the first start is read (to fill the windows) but not alerted on.
        return FileRow(path, run, None, device, inode, head, Cursor().to_json(), False, size if quiet else 0)

    def _warn_once(self, text: str) -> None:
        if text not in self._warned:
            self._warned.add(text)
            self.log(f"warning: {text}")

    # --- one pass ------------------------------------------------------------------------------
    def run_pass(self, now: float, changed: Collection[str] | None = None) -> PassReport:
        """One pass: over every file under the roots, or (`changed`, from inotify) over just those
        paths, which falls back to the whole walk when they are not all files already followed."""
        self._now = now
        report = PassReport()
        self.sizes: dict[str, int] = {}
        self.mtimes: dict[str, int] = {}
        self._staged.clear()
        try:
            self._pass(now, changed, report)
        except BaseException:
            self._staged.clear()
            self._tails.clear()
            raise
        for key, tail in self._staged.items():
            self._tails[key] = tail
            self._tails.move_to_end(key)
        while len(self._tails) > TAIL_CACHE:
            self._tails.popitem(last=False)
        self.first_pass = False
        return report

    def _pass(self, now: float, changed: Collection[str] | None, report: PassReport) -> None:
        with self.state.transaction() as db:
            current = None
            if changed is not None and not self.first_pass:
                tracked = self.state.files(changed)
                current = self._recheck(changed, tracked)
            if current is None:
                tracked = self.state.files()
                current = self._discover(db, tracked)
                report.walked = True
            new_rows: dict[str, list[pl.DataFrame]] = {}
            quiet_runs: dict[str, bool] = {}
            # A rotated segment before its live log, so a run's lines are judged in the order written.
            for path, row in sorted(current.items(), key=lambda item: segment_order(item[0])):
                if row != tracked.get(path):
                    self.state.put_file(db, row)  # new, renamed, replaced or truncated
                if row.dead:
                    continue
                cursor = offset_of(row)
                if row.format is not None and self.sizes.get(path) == cursor.offset and row.mtime == self.mtimes.get(path) and not cursor.skipping:
                    continue  # nothing new: no read, no write (this is what keeps 1,000 idle runs cheap)
                fmt = row.format or self.options.format_of(Path(path))
                if fmt is None:
                    continue
                res = read(Path(path), cursor, run=row.run, fmt=fmt, final=False, options=self.options, limit=self.read_limit)
                for p in res.problems:
                    self.log(f"warning: {p}")
                report.files += 1
                if res.cursor.offset - cursor.offset >= self.read_limit:
                    report.unfinished.append(path)
                if res.frame.height:
                    new_rows.setdefault(row.run, []).append(res.frame)
                    quiet_runs[row.run] = quiet_runs.get(row.run, True) and cursor.offset < row.quiet
                # Quiet until the read passes the size the file had at the first start.
                quiet_until = row.quiet if res.cursor.offset < row.quiet else 0
                updated = FileRow(path, row.run, fmt, row.device, row.inode, row.fingerprint, res.cursor.to_json(), res.dead, quiet_until, self.mtimes.get(path, 0))
                if updated != row:
                    self.state.put_file(db, updated)
            for run, frames in sorted(new_rows.items()):
                frame = pl.concat(frames, rechunk=False)
                report.rows += frame.height
                self._judge_run(db, run, frame, now=now, quiet=quiet_runs.get(run, False), report=report)
            self._stalls(db, now, set(new_rows), report)

    def _tail_frame(self, run: str, metric: str, tag: str | None = None) -> tuple[pl.DataFrame, int]:
        key = (run, metric if tag is None else f"tag:{tag}")
        cached = self._tails.get(key)
        if cached is not None:
            self._tails.move_to_end(key)
            return cached
        steps, values, seen = self.state.stream(*key)
        return pl.DataFrame({"step": pl.Series(steps, dtype=pl.Int64()), "value": pl.Series(values, dtype=pl.Float64())}), seen

    def _put_tail(self, db, run: str, key: str, tail: pl.DataFrame, seen: int) -> None:  # noqa: ANN001
        self.state.put_stream(db, run, key, tail.get_column("step").to_numpy(), tail.get_column("value").to_numpy(), seen)
        self._staged[(run, key)] = (tail, seen)

    def _judge_run(self, db, run: str, frame: pl.DataFrame, *, now: float, quiet: bool, report: PassReport) -> None:  # noqa: ANN001
        active = self.rules.for_run(run)
        metrics = JUDGED
        tails: dict[str, tuple[pl.DataFrame, int]] = {m: self._tail_frame(run, m) for m in metrics}
        new_streams = by_metric(frame, metrics)
        windows = {}
        for m in metrics:
            tail, _ = tails[m]
            new = new_streams[m]
            if tail.height:
                windows[m] = collapse(pl.concat([tail, new[["step", "value"]]])) if new.height else collapse(tail)
            else:
                windows[m] = new
        found: list[Incident] = []
        for rule in active:
            tail, seen = tails[rule.metric]
            new = new_streams[rule.metric]
            if not new.height:
                continue
            first_new = int(new.get_column("step")[0])
            for inc in detect(windows[rule.metric], rule, run=run, seen_before=max(0, seen - tail.height)):
                last = inc.last_flagged_step if inc.last_flagged_step is not None else inc.step
                known = self.state.incident(run, inc.rule, inc.step)
                if known is None and last < first_new:
                    continue  # judged before, in an earlier pass (or history the tail cannot re-judge)
                found.append(inc)
        if found:
            self._label_and_record(db, run, frame, tails, metrics, found, now=now, quiet=quiet, report=report)
        self._keep_tails(db, run, frame, active, tails, windows, new_streams, metrics, now=now, report=report)

    def _label_and_record(self, db, run, frame, tails, metrics, found, *, now, quiet, report) -> None:  # noqa: ANN001
        # Labels with the context the daemon has: the tails and what just arrived.
        def as_rows(tail: pl.DataFrame, metric: str, tag: str) -> pl.DataFrame:
            return tail.select(
                pl.lit(run).alias("run"), pl.lit("").alias("source"), "step", pl.lit(metric).alias("metric"),
                pl.lit(tag).alias("tag"), "value", pl.lit(None, dtype=pl.Float64).alias("wall_time"),
            )

        context_frames = [frame]
        for m in metrics:
            tail, _ = tails[m]
            if tail.height:
                context_frames.append(as_rows(tail, m, m))
        for tag in CONTEXT_TAGS:
            tail, _ = self._tail_frame(run, "", tag)
            if tail.height:
                context_frames.append(as_rows(tail, "loss_scale" if tag.startswith("OVERFLOW") else tag, tag))
        context = pl.concat([f.select(table.COLUMNS) for f in context_frames]).sort("step", maintain_order=True)
        ctx_streams = by_metric(context, metrics)
        everything = tuple(found) + tuple(incident_from_json(json.loads(r[3])) for r in self.state.open_incidents(run) if not any(i.rule == r[1] and i.step == r[2] for i in found))
        labelled = label_all(list(found), run_context(context, ctx_streams, everything))
        sources = frame.get_column("source").unique(maintain_order=True).to_list()
        source = sources[0] if len(sources) == 1 else ", ".join(sources)
        for inc in labelled:
            self._lifecycle(db, inc, now=now, quiet=quiet, report=report, source=source)

    def _keep_tails(self, db, run, frame, active, tails, windows, new_streams, metrics, *, now, report) -> None:  # noqa: ANN001
        # Keep each stream's tail: windows for every rule, and the span of incidents still open.
        need = max([r.lookback for r in active] + [16]) + 8
        open_steps = [r[0] for r in self.state.db.execute("SELECT step FROM incidents WHERE run=? AND status='open'", (run,)).fetchall()]
        for m in metrics:
            window = windows[m]
            if not window.height:
                continue
            keep = need
            if open_steps and m in {r.metric for r in active}:
                first_open = min(open_steps)
                keep = max(keep, window.filter(pl.col("step") >= first_open).height + need)
            keep = max(keep, CONTEXT_TAIL) if m != "loss" else keep
            _, seen = tails[m]
            self._put_tail(db, run, m, window.tail(min(keep, TAIL_CAP))[["step", "value"]], seen + new_streams[m].height)
        tagged = frame.filter(pl.col("tag").is_in(CONTEXT_TAGS))
        for tag in CONTEXT_TAGS if tagged.height else ():
            rows = tagged.filter(pl.col("tag") == tag).select("step", "value")
            if rows.height:
                tail, seen = self._tail_frame(run, "", tag)
                self._put_tail(db, run, f"tag:{tag}", pl.concat([tail, rows]).tail(CONTEXT_TAIL), seen + rows.height)
        last_step = int(frame.get_column("step").max())
        row = db.execute("SELECT last_step, stalled FROM runs WHERE run=?", (run,)).fetchone()
        if row is None or row[0] is None or last_step != row[0]:
            if row is not None and row[1]:
                self._notify(db, None, "resumed", {"run": run, "step": last_step}, report)
            db.execute("INSERT OR REPLACE INTO runs (run, last_step, advanced_at, stalled) VALUES (?,?,?,0)", (run, last_step, now))

    def _stalls(self, db, now: float, active_runs: set[str], report: PassReport) -> None:  # noqa: ANN001
        if self.stall_after <= 0:
            return
        for run, last_step, advanced_at, stalled in db.execute("SELECT run, last_step, advanced_at, stalled FROM runs").fetchall():
            if run in active_runs or stalled or advanced_at is None:
                continue
            if now - advanced_at >= self.stall_after:
                db.execute("UPDATE runs SET stalled=1 WHERE run=?", (run,))
                self._notify(db, None, "stalled", {"run": run, "step": last_step, "minutes": round((now - advanced_at) / 60, 1)}, report)

    def _lifecycle(self, db, inc: Incident, *, now: float, quiet: bool, report: PassReport, source: str = "") -> None:  # noqa: ANN001
        body = {**inc.to_json(), "source": source}
        known = self.state.incident(inc.run, inc.rule, inc.step)
        top = inc.causes[0].cause if inc.causes else None
        status = "resolved" if inc.end_step is not None else "open"
        if known is None:
            cur = db.execute(
                "INSERT INTO incidents (run, rule, step, status, body, quiet, notified_value, notified_at, top_cause) VALUES (?,?,?,?,?,?,?,?,?)",
                (inc.run, inc.rule, inc.step, status, json.dumps(body), int(quiet), inc.value, now, top),
            )
            if not quiet:
                self._notify(db, cur.lastrowid, "opened", body, report)
                if status == "resolved":
                    self._notify(db, cur.lastrowid, "resolved", body, report)
            return
        ident, old_status, _, was_quiet, notified_value, notified_at, old_top = known
        db.execute("UPDATE incidents SET status=?, body=?, top_cause=? WHERE id=?", (status, json.dumps(body), top, ident))
        if was_quiet:
            return
        relabelled = old_top is not None and top is not None and top != old_top
        if old_status == "open" and status == "resolved":
            # One message: the resolution carries the revised cause, if any.
            self._notify(db, ident, "resolved", {**body, "previous_cause": old_top} if relabelled else body, report)
            return
        if status == "open" and notified_value is not None and inc.value > notified_value * 1.1 and now - (notified_at or 0) >= self.update_every:
            db.execute("UPDATE incidents SET notified_value=?, notified_at=? WHERE id=?", (inc.value, now, ident))
            self._notify(db, ident, "updated", body, report)
        if relabelled:
            self._notify(db, ident, "relabelled", {**body, "previous_cause": old_top}, report)

    def _notify(self, db, incident_id: int | None, kind: str, payload: dict, report: PassReport) -> None:  # noqa: ANN001
        report.notices.append((kind, payload))
        for sink in self.sinks:
            db.execute(
                "INSERT INTO outbox (incident_id, kind, payload, created) VALUES (?,?,?,?)",
                (incident_id, kind, json.dumps({"sink": sink, **payload}), self._now),
            )
