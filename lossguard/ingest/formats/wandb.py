"""Weights & Biases runs: the `run-<id>.wandb` transaction log every run writes, online or offline
(wandb/run-<date>-<id>/ or wandb/offline-run-<date>-<id>/, under WANDB_DIR when it is set).

The log (sources/wandb_log.py) holds protobuf `wandb_internal.Record`s; two kinds matter here:
`run` (RunRecord: the run's id, project and display name, its name in lossguard) and `history`
(HistoryRecord: one `wandb.log` call, items of a key, or nested keys, and a JSON value). Summary,
system stats, console output, config and files records are passed over unread.

Decoding is done for all records at once (the items: formats/wandb_items.py), here for a chunk of
a file, and for the few new records of many files a daemon's pass reads (`read_together`).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path
from typing import BinaryIO

import numpy as np
import polars as pl

from .. import table
from ..cursor import Cursor
from ..problems import Problem
from ..sources.protobuf import WIRE_LEN, fields, spans_of
from ..sources.tfrecord import rows_at
from ..sources.wandb_follow import Pending
from ..sources.wandb_log import BLOCK, CHUNK_HEADER, FILE_HEADER, PAD, Padded, Records, frame, header_problem, read_padded
from .wandb_edges import on_pending, past_zeros, zero_block, zeros_said
from .base import Format, Keep, Layout, Parsed, Sink
from .wandb_items import Items, items_of, named

CHUNK = 4 << 20
"""Bytes framed and decoded at a time (whole 32 KiB blocks): memory stays bounded by a chunk, and a
chunk's arrays stay in the caches and in memory the process already has (on a VM, a page touched
for the first time costs microseconds: 16 MiB chunks cost a read of 10 MB 40% more page faults)."""

RECORD_HISTORY, RECORD_RUN = 2, 17
RECORD_TYPES = frozenset({2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 17, 18, 20, 21, 22, 23, 24, 25, 26, 27, 100})
"""The members of Record's `record_type` oneof: once one is met, nothing after it is needed."""
RUN_ID, RUN_PROJECT, RUN_DISPLAY_NAME = 1, 3, 8

TRAINER_STEPS = ("train/global_step", "trainer/global_step")
"""The trainer's own step, as HF's WandbCallback and Lightning's WandbLogger log it with every
call: W&B's `_step` counts `wandb.log` calls, so an eval call, or logging every 10 steps, would
put the curve at the wrong steps."""
W_AND_B_OWN = ("_step", "_runtime", "_timestamp")
HISTORY = "history"
"""Cursor.steps of a file whose records carry no trainer step: W&B's own step (`_step`)."""
_RUN_FILE = re.compile(r"^run-(?P<id>.+)\.wandb$")


def _run_name(data: np.ndarray, start: int, end: int, fallback: str) -> str:
    """A RunRecord's run as lossguard names it: `project/display name@id`, or `project/id` for a run
    with no display name (offline runs that were not given one: W&B names them when synced). The id
    keeps two runs given the same name apart; a resumed run (same id, a new file) is the same run."""
    found = fields(data, np.array([start]), np.array([end]), keep=(RUN_ID, RUN_PROJECT, RUN_DISPLAY_NAME))
    got = {int(n): b.decode("utf-8", errors="replace") for n, b in zip(found.number.tolist(), spans_of(data, found.start, found.end))}
    run_id = got.get(RUN_ID) or fallback
    display = got.get(RUN_DISPLAY_NAME, "")
    name = f"{display}@{run_id}" if display and display != run_id else run_id
    project = got.get(RUN_PROJECT, "")
    return f"{project}/{name}" if project else name


def steps_from(cursor: Cursor) -> str | None:
    """Where a read took a W&B log's steps from (the cursor after it), for `read`'s metrics line."""
    if cursor.steps in TRAINER_STEPS:
        return f"the trainer's {cursor.steps}"
    return "W&B's step (_step: each wandb.log call's step=, or one per call without it)" if cursor.steps == HISTORY else None


def file_run_id(path: Path) -> str:
    """The run id a transaction log's name carries (`run-<id>.wandb`), for a file whose RunRecord
    was not read before its history (damaged)."""
    match = _RUN_FILE.match(path.name)
    return match["id"] if match else path.stem


def _per_record(items: Items, names: set[str], size: int) -> np.ndarray:
    """Each history record's value of the item named in `names` (NaN where it has none)."""
    out = np.full(size, np.nan)
    take = named(items.names, names.__contains__)[items.code] & items.numeric
    out[items.record[take]] = items.value[take]
    return out


def _filled(steps: np.ndarray, before: float) -> np.ndarray:
    """Records with no step take the one before them (the cursor's last step for the first)."""
    steps = np.concatenate([[before], steps])
    index = np.where(np.isnan(steps), 0, np.arange(steps.size))
    return steps[np.maximum.accumulate(index)][1:]


def _steps(items: Items, step_of: np.ndarray, cursor: Cursor) -> tuple[np.ndarray, str | None]:
    """Each history record's step, and where the file's steps come from (Cursor.steps): the
    trainer's step once a record logs one (records before the first keep W&B's), else the history
    record's own step, else its `_step` item."""
    size = step_of.size
    before = float(cursor.last_step) if cursor.last_step is not None else np.nan
    mode = cursor.steps
    own = np.where(step_of >= 0, step_of.astype(np.float64), _per_record(items, {"_step"}, size))
    if mode not in TRAINER_STEPS:
        present = {items.names[c] for c in np.unique(items.code[items.numeric & np.isfinite(items.value)]).tolist()}
        mode = next((k for k in TRAINER_STEPS if k in present), HISTORY if size else mode)
    if mode == HISTORY or mode is None:
        return _filled(own, before), mode
    trainer = _per_record(items, {mode}, size)
    if cursor.steps != mode:
        first = int(np.flatnonzero(~np.isnan(trainer))[0])
        trainer[:first] = _filled(own[:first], before)
    return _filled(trainer, before), mode


@dataclass(frozen=True)
class _Placed:
    """The items of a chunk's history records that become rows, and where they go."""

    chosen: np.ndarray
    """Indices into the Items."""
    step: np.ndarray
    wall: np.ndarray
    cursor: Cursor
    """The cursor's step state after them."""
    unplaced: int
    """Values that had no step to go at."""
    span: table.Span | None
    """The steps all of them covered (kept by `keep` or not)."""


def _placed(items: Items, step_of: np.ndarray, cursor: Cursor, keep: Keep | None) -> _Placed:
    """The metric items of a chunk's history records (W&B's own items and the trainer's step left
    out; with `keep`, only the tags it keeps, asked once a key), at their steps."""
    size = step_of.size
    steps, mode = _steps(items, step_of, cursor)
    wall = _per_record(items, {"_timestamp"}, size)
    media = _media(items.names)
    skip = named(items.names, lambda n: n in W_AND_B_OWN or n in TRAINER_STEPS or n.startswith("_wandb") or _within(n, media))
    take = items.numeric & ~skip[items.code]
    row_step = steps[items.record[take]]
    placed = ~np.isnan(row_step) & (row_step >= 0) & (row_step < 2.0**63)
    chosen, at = np.flatnonzero(take)[placed], row_step[placed].astype(np.int64)
    span = (int(at.min()), int(at.max())) if at.size else None
    if keep is not None:
        kept = named(items.names, keep)[items.code[chosen]]
        chosen, at = chosen[kept], at[kept]
    known = steps[~np.isnan(steps)]
    last = int(known[-1]) if known.size and 0 <= known[-1] < 2.0**63 else cursor.last_step
    return _Placed(chosen, at, wall[items.record[chosen]], cursor.advance(steps=mode, last_step=last), int((~placed).sum()), span)


def _media(names: list[str]) -> frozenset[str]:
    """The keys logged as W&B objects (an Image, a Table, a Histogram...): a dict W&B tags with a
    `_type` (`samples._type = "image-file"`) whose numbers (`samples.width`, `samples.size`,
    `preds.nrows`, a histogram's `packedBins.min`) describe the object, not a curve. Its `_type`
    item is in the same record as the rest of it, so in the names of the chunk that holds them."""
    return frozenset(n[: -len(TYPED)] for n in names if n.endswith(TYPED))


TYPED = "._type"


def _within(name: str, media: frozenset[str]) -> bool:
    """`name` is a field of one of the `media` objects (or of a dict nested in one)."""
    if not media:
        return False
    parts = name.split(".")
    return any(".".join(parts[:k]) in media for k in range(1, len(parts)))


def _frame(items: Items, chosen: np.ndarray, step: np.ndarray, wall: np.ndarray, run: pl.Series) -> pl.DataFrame:
    """Raw rows of the `chosen` items (NAMED_RAW's columns)."""
    codes = items.code[chosen]
    tags = pl.Series("tag", items.names, dtype=pl.String()).gather(codes) if codes.size > 256 else pl.Series("tag", [items.names[c] for c in codes.tolist()], dtype=pl.String())
    return pl.DataFrame([
        pl.Series("step", step, dtype=pl.Int64()), tags, pl.Series("value", items.value[chosen], dtype=pl.Float64()),
        pl.Series("wall_time", wall, dtype=pl.Float64(), nan_to_null=True), run.alias("run"),
    ])


def _rows(items: Items, step_of: np.ndarray, cursor: Cursor, name: str | None, keep: Keep | None) -> tuple[pl.DataFrame, Cursor, int, table.Span | None]:
    """The metric rows of a chunk's history records (_placed), the cursor's step state after them,
    how many values had no step to go at, and the steps all of them covered."""
    got = _placed(items, step_of, cursor, keep)
    run = pl.repeat(name or "", got.chosen.size, eager=True, dtype=pl.String()).alias("run")
    return _frame(items, got.chosen, got.step, got.wall, run), got.cursor, got.unplaced, got.span


def _empty() -> pl.DataFrame:
    """No rows, with the `run` column all of this format's frames carry (table.finish)."""
    return table.conform_raw(table.empty_raw().with_columns(pl.lit(None, dtype=pl.String).alias("run")))


def _read_here(data: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Which records are history or run records (sources/wandb_log.Needed), as writers lay them
    out, in field order: `num` first, then the record's kind, or `control` (field 16) before the
    kinds numbered above it (a RunRecord's); any other layout is taken to be needed. Read from each
    record's first 8 bytes: `num` is a varint of up to 5 bytes there (a longer one is needed). A
    record may be shorter and the buffer end with it (the exit record wandb writes at a script's
    exit can be 5 bytes): its head is zero-filled past the buffer."""
    near = starts + 8 > data.size
    if near.any():  # (the buffer's last few bytes, zero-filled: not a copy of the whole buffer)
        lead = max(0, data.size - 16)
        tail = np.concatenate([data[lead:], np.zeros(8, dtype=np.uint8)])
        head = rows_at(data, np.where(near, 0, starts), 8)
        head[near] = rows_at(tail, starts[near] - lead, 8)
    else:
        head = rows_at(data, starts, 8)
    last = head[:, 1:6] < 0x80
    after = np.where(last.any(axis=1), 2 + np.argmax(last, axis=1), 7)  # (where the kind is: past the varint)
    row = np.arange(starts.size)
    kind, then = head[row, np.minimum(after, 6)], head[row, np.minimum(after + 1, 7)]
    bad = (after > 6) | (starts + after > ends)
    ours = (kind == 0x12) | (((kind == 0x8A) | (kind == 0x82)) & (then == 0x01))
    return (head[:, 0] != 0x08) | bad | ours


def _decode(rec, path: Path, cursor: Cursor, keep: Keep | None) -> tuple[pl.DataFrame, Cursor, list[Problem], table.Span | None]:
    """A chunk's records (sources/wandb_log.Records) as raw rows named for the file's run (with
    `keep`, of the tags it keeps), and the steps they all covered."""
    source = str(path)
    problems: list[Problem] = []
    data = rec.data
    walked = np.flatnonzero(rec.wanted) if rec.wanted is not None else np.arange(rec.starts.size)
    top = fields(data, rec.starts[walked], rec.ends[walked], keep=(RECORD_HISTORY, RECORD_RUN), stop=RECORD_TYPES)
    if top.bad.any():
        bad = walked[np.flatnonzero(top.bad)]
        problems.append(Problem(source, f"{bad.size} record(s) that are not valid W&B records skipped", offset=int(rec.offsets[bad[0]])))
    whole = (top.wire == WIRE_LEN) & ~top.bad[top.message]
    hist = np.flatnonzero(whole & (top.number == RECORD_HISTORY))
    hist = hist[np.argsort(top.message[hist], kind="stable")]
    name = cursor.name
    if name is None:
        runs = np.flatnonzero(whole & (top.number == RECORD_RUN))
        first_run = runs[np.argmin(top.message[runs])] if runs.size else None
        if first_run is not None and (not hist.size or top.message[first_run] < top.message[hist[0]]):
            name = _run_name(data, int(top.start[first_run]), int(top.end[first_run]), file_run_id(path))
        elif hist.size:
            name = file_run_id(path)
            problems.append(Problem(source, f"history before the run's own record (damaged?): its rows are named for the file's run id, {name}"))
    cursor = cursor.advance(name=name)
    if not hist.size:
        return _empty(), cursor, problems, None
    items, step_of = items_of(data, top.start[hist], top.end[hist])
    rows, cursor, unplaced, span = _rows(items, step_of, cursor, name, keep)
    if unplaced:
        problems.append(Problem(source, f"{unplaced} value(s) in history records with no step (no `_step`, no trainer step) skipped"))
    return rows, cursor, problems, span


class WandbFormat:
    """A `.wandb` file is read a chunk (CHUNK, whole blocks) at a time, each chunk's rows handed to
    `each` as decoded; the cursor also keeps the run's name (from its RunRecord, at the file's
    head) and where its steps come from, for reads that start past them. A record longer than a
    chunk is followed chunk by chunk (the cursor keeps how far: `scanned`) and read once whole,
    up to MAX_RECORD; a run of zeros is passed over (formats/wandb_edges.py)."""

    name = "wandb"
    streams = True
    projects = True

    def read(
        self, path: Path, cursor: Cursor, *, final: bool, chunk: int | None = None, limit: int | None = None, each: Sink | None = None,
        keep: Keep | None = None,
    ) -> Parsed:
        chunk = max(BLOCK, chunk or CHUNK)
        source = str(path)
        problems: list[Problem] = []
        frames: list[pl.DataFrame] = []
        spans: list[table.Span | None] = []
        with open(path, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            if cursor.offset < len(FILE_HEADER):
                head = fh.read(len(FILE_HEADER))
                if len(head) < len(FILE_HEADER):  # (being created: not yet, unless it is final)
                    told = (Problem(source, "W&B transaction log cut inside its 7-byte header"),) if final else ()
                    return Parsed(_empty(), cursor, told)
                wrong = header_problem(head)
                if wrong:
                    return Parsed(_empty(), cursor, (Problem(source, wrong),), dead=True)
            # (A limit counts from where reading goes on: a long record's next chunk, once followed.)
            end = size if limit is None else min(size, max(cursor.offset, cursor.scanned or 0) + limit)
            while cursor.offset < end:
                rec, moved = _next_records(fh, cursor, end=end, size=size, chunk=chunk, final=final, source=source, problems=problems)
                if rec is None:
                    if moved == cursor:
                        break
                    cursor = moved
                    continue
                cursor = moved
                problems.extend(rec.problems)
                rows, moved, found, span = _decode(rec, path, cursor, keep)
                problems.extend(found)
                spans.append(span)
                if rows.height:
                    each(rows) if each is not None else frames.append(rows)
                progressed = rec.consumed > cursor.offset or rec.skipping != cursor.skipping
                cursor = moved.advance(offset=rec.consumed, skipping=rec.skipping, scanned=None)
                if not progressed:
                    break
        if final and cursor.zeros is not None:
            problems.extend(zeros_said(cursor.zeros, cursor.offset, source))
            cursor = cursor.advance(zeros=None)
        if final and cursor.offset < size:
            problems.append(Problem(source, f"last record is incomplete ({size - cursor.offset} bytes; file cut off or still being written)", offset=cursor.offset, unfinished=True))
        rows = pl.concat(frames, rechunk=False) if frames else _empty()
        return Parsed(rows, cursor, tuple(problems), span=table.joined(spans), projected=keep is not None)

    def read_together(
        self, jobs: list[tuple[Path, Cursor, int | None]], *, keep: Keep | None, largest: int
    ) -> tuple[pl.DataFrame, list[Found | None]]:
        """What `read(path, cursor, final=False, limit=limit, keep=keep)` finds in each of many
        files with a few new records each (a daemon's pass over many runs: a read alone costs a
        few milliseconds whatever it holds, the decode of all of them together about as much):
        raw rows, the files' in turn, and per file its cursor, span and number of rows, or None
        where `read` must read it on its own (_frame_small, or anything it would warn of)."""
        return _read_together(jobs, keep, largest)


def _next_records(
    fh: BinaryIO, cursor: Cursor, *, end: int, size: int, chunk: int, final: bool, source: str, problems: list[Problem]
) -> tuple[Records | None, Cursor]:
    """The records of the next chunk from the cursor (and the cursor, its bookkeeping of zeros
    updated); or none, and the cursor past what holds none (zeros, a record too large or damaged),
    or where its long record's chunks were followed to, or as it was: nothing more yet."""
    scanned = cursor.scanned
    if scanned is None:
        stop = _chunk_end(cursor.offset, end, chunk)
        fh.seek(cursor.offset)
        got = read_padded(fh, stop - cursor.offset)
        zeros = zero_block(got, cursor.offset)
        if zeros is not None:  # (framed up to it: the run of zeros is passed over on its own)
            got, stop = Padded(got.room, zeros - cursor.offset), zeros
        if got.size >= CHUNK_HEADER and not got.room[PAD : PAD + CHUNK_HEADER].any():
            skipped = past_zeros(fh, cursor, size=size, final=final, source=source)
            if skipped is not None:
                problems.extend(skipped[1])
                return None, skipped[0]
        elif cursor.zeros is not None:  # (a run of zeros a read before ended inside, over)
            problems.extend(zeros_said(cursor.zeros, cursor.offset, source))
            cursor = cursor.advance(zeros=None)
        rec = frame(got, base=cursor.offset, skipping=cursor.skipping, final=final and stop == size, source=source, needed=_read_here)
        if rec.consumed != cursor.offset or rec.skipping != cursor.skipping or rec.cut != cursor.offset:
            return rec, cursor
        # The record at the cursor runs past what was read: one longer than a chunk, or still being
        # written. Its chunks are followed one at a time, and how far is kept (Cursor.scanned).
        scanned = cursor.offset
    elif size <= scanned:
        return None, cursor  # (nothing new: one look at the file's size)
    return on_pending(fh, cursor, Pending(cursor.offset, scanned), size=end, final=final and end == size, source=source, problems=problems, needed=_read_here)


Found = tuple[Cursor, "table.Span | None", int]
"""A file read together with others (WandbFormat.read_together): its cursor after the read, the
steps its rows covered, and how many of the batch's rows are its."""


def _frame_small(path: Path, cursor: Cursor, limit: int | None, largest: int) -> Records | None:
    """The records of a small read of `path` on from `cursor`, as `WandbFormat.read` would frame
    them, or None where that read must be made: the header or the run's record not read yet,
    `largest` bytes or more new, a problem to tell, or a record running past `limit`."""
    if cursor.name is None or cursor.offset < len(FILE_HEADER) or cursor.scanned is not None or cursor.zeros is not None:
        return None
    try:
        with open(path, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            end = size if limit is None else min(size, cursor.offset + limit)
            if end - cursor.offset >= largest or _chunk_end(cursor.offset, end, CHUNK) != end:
                return None
            fh.seek(cursor.offset)
            buf = fh.read(max(0, end - cursor.offset))
    except OSError:
        return None  # read() names the problem
    if buf[:CHUNK_HEADER] == bytes(CHUNK_HEADER):
        return None  # (zeros where a chunk should start: read() passes over the run of them)
    rec = frame(buf, base=cursor.offset, skipping=cursor.skipping, final=False, source=str(path), needed=_read_here)
    moved = rec.consumed > cursor.offset or rec.skipping != cursor.skipping
    if rec.problems or len(buf) != end - cursor.offset or (not moved and rec.cut is not None and (end < size or _chunked(rec.cut, end))):
        return None
    return rec


def _chunked(cut: int, end: int) -> bool:
    """A record cut at `end` runs past its first block: one cut into chunks, which read() follows
    chunk by chunk (remembering how far), not framed again from its start at every read."""
    return end - cut > BLOCK - cut % BLOCK


def _read_together(jobs: list[tuple[Path, Cursor, int | None]], keep: Keep | None, largest: int) -> tuple[pl.DataFrame, list[Found | None]]:
    """WandbFormat.read_together: each file framed on its own (blocks are the file's), the
    records of all of them walked and decoded as one chunk's, then placed at their steps file by
    file (a file's steps go on from its own cursor)."""
    found: list[Found | None] = [None] * len(jobs)
    framed = [(k, rec) for k, rec in ((k, _frame_small(*job, largest)) for k, job in enumerate(jobs)) if rec is not None]
    if not framed:
        return _empty(), found
    recs = [rec for _, rec in framed]
    sizes = np.array([rec.data.size for rec in recs], dtype=np.int64)
    shift = np.cumsum(sizes) - sizes
    data = np.concatenate([rec.data for rec in recs])
    starts = np.concatenate([rec.starts + d for rec, d in zip(recs, shift.tolist())])
    ends = np.concatenate([rec.ends + d for rec, d in zip(recs, shift.tolist())])
    file_of = np.repeat(np.arange(len(recs)), [rec.starts.size for rec in recs])
    walked = np.flatnonzero(np.concatenate([rec.wanted if rec.wanted is not None else np.ones(rec.starts.size, dtype=bool) for rec in recs]))
    top = fields(data, starts[walked], ends[walked], keep=(RECORD_HISTORY,), stop=RECORD_TYPES)
    broken = set(file_of[walked[top.bad]].tolist())  # (read alone: read() says what is wrong)
    hist = np.flatnonzero((top.wire == WIRE_LEN) & ~top.bad[top.message] & (top.number == RECORD_HISTORY))
    hist = hist[np.argsort(top.message[hist], kind="stable")]
    hist_bounds = np.searchsorted(file_of[walked[top.message[hist]]], np.arange(len(recs) + 1))
    items, step_of = items_of(data, top.start[hist], top.end[hist]) if hist.size else (None, None)
    item_bounds = np.searchsorted(items.record, hist_bounds) if items is not None else hist_bounds
    chosen, steps, walls, names, counts = [], [], [], [], []
    for j, (k, rec) in enumerate(framed):
        cursor = jobs[k][1]
        h0, h1, i0, i1 = int(hist_bounds[j]), int(hist_bounds[j + 1]), int(item_bounds[j]), int(item_bounds[j + 1])
        if j in broken:
            continue
        if h0 == h1 or items is None:
            found[k] = (cursor.advance(offset=rec.consumed, skipping=rec.skipping), None, 0)
            continue
        mine = Items(items.record[i0:i1] - h0, items.code[i0:i1], items.value[i0:i1], items.numeric[i0:i1], items.names)
        got = _placed(mine, step_of[h0:h1], cursor, keep)
        if got.unplaced:
            continue  # (read() says so)
        chosen.append(got.chosen + i0)
        steps.append(got.step)
        walls.append(got.wall)
        names.append(cursor.name)
        counts.append(got.chosen.size)
        found[k] = (got.cursor.advance(offset=rec.consumed, skipping=rec.skipping), got.span, got.chosen.size)
    if not chosen:
        return _empty(), found
    owner = np.repeat(np.arange(len(names)), counts)
    run = pl.Series("run", names, dtype=pl.String()).gather(owner)
    return _frame(items, np.concatenate(chosen), np.concatenate(steps), np.concatenate(walls), run), found


def _chunk_end(offset: int, end: int, chunk: int) -> int:
    """Where a chunk read from `offset` stops: at a block boundary about `chunk` on, or at `end`."""
    boundary = (offset + chunk) // BLOCK * BLOCK
    return end if boundary <= offset or boundary >= end else boundary


def _is_log(below: tuple[str, ...]) -> bool:
    """A run's transaction log in W&B's folder: wandb/run-<date>-<id>/run-<id>.wandb (offline-run-
    for offline runs); copies under files/, the latest-run link and the debug logs are not runs."""
    return len(below) == 2 and (below[0].startswith(("run-", "offline-run-"))) and fnmatchcase(below[1], "run-*.wandb")


def _own(name: str) -> bool:
    """What wandb-core puts in its `wandb/` folder: run folders, the latest-run link, debug logs."""
    return name.startswith(("run-", "offline-run-", "latest-run", "debug", "sweep-")) or name in ("settings", "artifacts", "media")


WANDB = WandbFormat()
FORMAT = Format(
    reader=WANDB,
    names=("*.wandb",),
    names_runs=True,
    layout=Layout(folder="wandb", logs=_is_log, skip=frozenset({"latest-run", "files", "logs", "tmp", "media", "artifacts", "code"}), own=_own),
)
