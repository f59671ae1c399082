"""Weights & Biases runs: the `run-<id>.wandb` transaction log every run writes, online or offline
(wandb/run-<date>-<id>/ or wandb/offline-run-<date>-<id>/, under WANDB_DIR when it is set).

The log (sources/wandb_log.py) holds protobuf `wandb_internal.Record`s; two kinds matter here:
`run` (RunRecord: the run's id, project and display name, its name in lossguard) and `history`
(HistoryRecord: one `wandb.log` call, items of a key, or nested keys, and a JSON value). Summary,
system stats, console output, config and files records are passed over unread.

Decoding is done for all records at once (sources/protobuf.py): a history record's items are found
in a few array rounds, the few distinct keys are decoded once each, and the values, JSON numbers
(`NaN`, `Infinity` and `-Infinity` as W&B writes them), are parsed by polars in one call (the few
of a daemon's read, one by one). A value
that is not a number (a histogram, an image, a table, text, a boolean) is passed over quietly: it
is not a curve lossguard could judge.
"""

from __future__ import annotations

import io
import os
import re
from dataclasses import dataclass
from functools import lru_cache
from fnmatch import fnmatchcase
from pathlib import Path

import numpy as np
import polars as pl

from .. import table
from ..cursor import Cursor
from ..problems import Problem
from ..sources.protobuf import WIRE_LEN, fields, spans_of
from ..sources.tfrecord import rows_at, words_at
from ..sources.wandb_log import BLOCK, FILE_HEADER, frame, header_problem
from .base import Format, Keep, Layout, Parsed, Sink

CHUNK = 4 << 20
"""Bytes framed and decoded at a time (whole 32 KiB blocks): memory stays bounded by a chunk, and a
chunk's arrays stay in the caches and in memory the process already has (on a VM, a page touched
for the first time costs microseconds: 16 MiB chunks cost a read of 10 MB 40% more page faults)."""

RECORD_HISTORY, RECORD_RUN = 2, 17
RECORD_TYPES = frozenset({2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 17, 18, 20, 21, 22, 23, 24, 25, 26, 27, 100})
"""The members of Record's `record_type` oneof: once one is met, nothing after it is needed."""
HISTORY_ITEM, HISTORY_STEP = 1, 2
ITEM_KEY, ITEM_NESTED_KEY, ITEM_VALUE_JSON = 1, 2, 16
RUN_ID, RUN_PROJECT, RUN_DISPLAY_NAME = 1, 3, 8

TRAINER_STEPS = ("train/global_step", "trainer/global_step")
"""The trainer's own step, as HF's WandbCallback and Lightning's WandbLogger log it with every
call: W&B's `_step` counts `wandb.log` calls, so an eval call, or logging every 10 steps, would
put the curve at the wrong steps."""
W_AND_B_OWN = ("_step", "_runtime", "_timestamp")
HISTORY = "history"
"""Cursor.steps of a file whose records carry no trainer step: W&B's own step (`_step`)."""
_NUMBER_START = np.zeros(256, dtype=bool)
_NUMBER_START[list(b"-0123456789NI")] = True
"""First bytes of a JSON number (and of W&B's NaN, Infinity, -Infinity)."""
LONGEST_NUMBER = 32
SMALL = 512
"""Values parsed one by one (float) rather than by polars, whose CSV reader costs ~1 ms a call:
what a daemon's pass finds in a file is a few steps' values."""
_RUN_FILE = re.compile(r"^run-(?P<id>.+)\.wandb$")


@dataclass(frozen=True)
class _Items:
    """The items of a chunk's history records, one entry per item."""

    record: np.ndarray
    """Index of the item's history record (in file order)."""
    code: np.ndarray
    """Index into `names` of the item's key."""
    value: np.ndarray
    """Float64, NaN where the value is not a number (`numeric` says which)."""
    numeric: np.ndarray
    names: list[str]


_LOW = np.array([(1 << (8 * k)) - 1 if k < 8 else (1 << 64) - 1 for k in range(17)], dtype=np.uint64)
"""_LOW[k]: the low k bytes of a little-endian uint64."""


def _distinct(data: np.ndarray, starts: np.ndarray, stops: np.ndarray) -> tuple[list[bytes], np.ndarray]:
    """The distinct byte strings at [starts, stops) and each one's index among them. Writers log a
    few dozen keys over and over: each string is summed up by its length and its first, middle and
    last 8 bytes (all of it, up to 24 bytes), and the summaries hashed into a table where each
    string meets a representative of its slot: it takes that one's index when they are the same
    (longer strings compared whole), and the few that are not (two keys in one slot) go round
    again with other bits of the hash, then one by one. `data` has zero bytes around the spans
    (sources/wandb_log.PAD)."""
    lengths = stops - starts
    short = np.minimum(lengths, 8)
    head = words_at(data, starts) & _LOW[short]
    mid = words_at(data, starts + 8) & _LOW[np.clip(lengths - 8, 0, 8)]
    tail = words_at(data, stops - 8) & ~_LOW[8 - short]
    mixed = (head * np.uint64(0x9E3779B97F4A7C15)) ^ (mid * np.uint64(0xD6E8FEB86659FD93)) ^ (tail * np.uint64(0xC2B2AE3D27D4EB4F)) ^ lengths.astype(np.uint64)
    mixed = (mixed ^ (mixed >> np.uint64(29))) * np.uint64(0xBF58476D1CE4E5B9)
    rep = np.full(starts.size, -1, dtype=np.int64)
    left = np.arange(starts.size)
    for shift in (48, 32, 16):
        if not left.size:
            break
        slot = ((mixed[left] >> np.uint64(shift)) & np.uint64(0xFFFF)).astype(np.int64)
        table = np.empty(1 << 16, dtype=np.int64)
        table[slot] = left  # (a slot's representative: any one of the strings in it)
        r = table[slot]
        same = (head[left] == head[r]) & (mid[left] == mid[r]) & (tail[left] == tail[r]) & (lengths[left] == lengths[r])
        for first in np.unique(r[same & (lengths[left] > 24)]).tolist():
            members = np.flatnonzero(same & (r == first))
            rows = rows_at(data, starts[left[members]], int(lengths[first]))
            same[members] = (rows == rows_at(data, starts[first : first + 1], rows.shape[1])).all(axis=1)
        rep[left[same]] = r[same]
        left = left[~same]
    firsts = np.flatnonzero(rep == np.arange(starts.size))
    index = np.empty(starts.size, dtype=np.int64)
    index[firsts] = np.arange(firsts.size)
    codes = index[np.maximum(rep, 0)]
    found = [data[starts[f] : stops[f]].tobytes() for f in firsts.tolist()]
    if left.size:  # (slots shared three times over: never seen, but exact all the same)
        known = {k: i for i, k in enumerate(found)}
        for i in left.tolist():
            codes[i] = known.setdefault(data[starts[i] : stops[i]].tobytes(), len(known))
        found = list(known)
    return found, codes


def _get(data: np.ndarray, at: np.ndarray) -> np.ndarray:
    """The bytes at `at` (positions past the end read the last byte: callers check bounds apart)."""
    return data[np.minimum(at, data.size - 1)]


def _item_spans(data: np.ndarray, s: np.ndarray, e: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per item at [s, e): where its key fields end (they are its bytes from `s` on: the key's
    identity) and where its JSON value is; -1 for an item with no value. An item as W&B writes it
    is one key field then `value_json`, found in two words of its bytes (its first, and the value's
    field header); the others (nested keys, long keys) are walked field by field."""
    first = words_at(data, s)
    b0, klen = (first & np.uint64(0xFF)).astype(np.int64), ((first >> np.uint64(8)) & np.uint64(0xFF)).astype(np.int64)
    key_end = s + 2 + klen
    value = words_at(data, key_end)
    vlen1, vlen2 = ((value >> np.uint64(16)) & np.uint64(0xFF)).astype(np.int64), ((value >> np.uint64(24)) & np.uint64(0xFF)).astype(np.int64)
    one = vlen1 < 0x80
    vstart = np.where(one, key_end + 3, key_end + 4)
    vend = vstart + np.where(one, vlen1, (vlen1 & 0x7F) | (vlen2 << 7))
    fast = (
        ((b0 == 0x0A) | (b0 == 0x12)) & (klen < 0x80) & ((value & np.uint64(0xFFFF)) == np.uint64(0x0182))
        & (one | (vlen2 < 0x80)) & (vend == e) & (s + 2 <= e)
    )
    ident_end = np.where(fast, key_end, -1)
    vstart, vend = np.where(fast, vstart, -1), np.where(fast, vend, -1)
    slow = np.flatnonzero(~fast)
    if slow.size:
        found = fields(data, s[slow], e[slow], keep=(ITEM_VALUE_JSON,))
        value = found.wire == WIRE_LEN
        last = found.end == e[slow][found.message]  # the value is the item's last field (as writers order them)
        take = value & last
        at = slow[found.message[take]]
        ident_end[at], vstart[at], vend[at] = found.key_at[take], found.start[take], found.end[take]
    return ident_end, vstart, vend, fast


@lru_cache(maxsize=4096)
def _key_name(raw: bytes) -> str:
    """An item's key fields (`key`, or `nested_key` parts, joined by '.' as W&B's tables show a
    nested dict's keys) as the tag lossguard reads."""
    arr = np.frombuffer(raw, dtype=np.uint8)
    found = fields(arr, np.array([0]), np.array([arr.size]), keep=(ITEM_KEY, ITEM_NESTED_KEY))
    order = np.argsort(found.key_at)
    parts = [b.decode("utf-8", errors="replace") for b in spans_of(arr, found.start[order], found.end[order])]
    return ".".join(parts)


def _numbers(data: np.ndarray, vstart: np.ndarray, vend: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The JSON values at [vstart, vend) as floats, and which are numbers. Short values starting
    like a number are gathered as lines of one width, `x...x<US><value>` (the bytes before a value
    masked, a unit separator just before it), and parsed by polars in one call. `data` has zero
    bytes around the spans (sources/wandb_log.PAD)."""
    length = vend - vstart
    maybe = (vstart >= 0) & (length > 0) & (length <= LONGEST_NUMBER) & _NUMBER_START[data[np.maximum(vstart, 0)]]
    values = np.full(vstart.size, np.nan)
    numeric = np.zeros(vstart.size, dtype=bool)
    picked = np.flatnonzero(maybe)
    if not picked.size:
        return values, numeric
    if picked.size <= SMALL:
        for i, a, b in zip(picked.tolist(), vstart[picked].tolist(), vend[picked].tolist()):
            try:
                values[i], numeric[i] = float(data[a:b].tobytes()), True
            except ValueError:
                pass
        return values, numeric
    size = int(length[picked].max()) + 1
    lines = np.empty((picked.size, size + 1), dtype=np.uint8)
    window = rows_at(data, vend[picked] - size, size)
    lead = (size - length[picked]).astype(np.uint8)  # (where each value starts in its line)
    lines[:, :size] = window
    np.copyto(lines[:, :size], np.uint8(ord("x")), where=np.arange(size, dtype=np.uint8) < lead[:, None] - 1)
    lines[np.arange(picked.size), lead.astype(np.int64) - 1] = 0x1F
    lines[:, size] = 0x0A
    parsed, ok = _parse_floats(lines.tobytes())
    values[picked] = parsed
    numeric[picked] = ok
    return values, numeric


def _parse_floats(text: bytes) -> tuple[np.ndarray, np.ndarray]:
    """The numbers of lines `filler<US>number`, and which were numbers (a line holding something
    else, which only a damaged file has, sends the lot to the slower parse as text, then cast)."""
    options: dict = dict(has_header=False, new_columns=["pad", "v"], quote_char=None, separator="\x1f", columns=[1])
    try:
        column = pl.read_csv(io.BytesIO(text), schema={"pad": pl.String, "v": pl.Float64}, **options).to_series()
    except pl.exceptions.PolarsError:
        column = pl.read_csv(io.BytesIO(text), schema={"pad": pl.String, "v": pl.String}, **options).to_series().cast(pl.Float64, strict=False)
    return column.fill_null(np.nan).to_numpy(), column.is_not_null().to_numpy()


def _items(data: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> tuple[_Items, np.ndarray]:
    """The items of the history records at [starts, ends), and each record's HistoryStep (-1: none)."""
    found = fields(data, starts, ends, keep=(HISTORY_ITEM, HISTORY_STEP))
    steps = found.only(HISTORY_STEP)
    step_of = np.full(starts.size, -1, dtype=np.int64)
    if steps.message.size:
        nums = fields(data, steps.start, steps.end, keep=(1,))
        step_of[steps.message] = 0  # (an empty HistoryStep is step 0: proto3 leaves zeros out)
        step_of[steps.message[nums.message]] = nums.value.astype(np.int64)
    items = found.only(HISTORY_ITEM)
    # By record, then by field: the walker found each record's fields in order, a round at a time.
    # (Records joined from chunks sit after the others in `data`: their positions do not sort.)
    order = np.argsort(items.message, kind="stable")
    s, e, record = items.start[order], items.end[order], items.message[order]
    ident_end, vstart, vend, _ = _item_spans(data, s, e)
    has = ident_end >= 0
    s, record, ident_end, vstart, vend = s[has], record[has], ident_end[has], vstart[has], vend[has]
    keys, codes = _distinct(data, s, ident_end)
    names = [_key_name(k) for k in keys]
    # W&B's `_runtime` is never read, nor its `_step` where the HistoryStep says it already.
    unread = {"_runtime", "_step"} if (step_of >= 0).all() else {"_runtime"}
    read = ~np.isin(codes, [i for i, n in enumerate(names) if n in unread])
    record, codes, vstart, vend = record[read], codes[read], vstart[read], vend[read]
    values, numeric = _numbers(data, vstart, vend)
    return _Items(record, codes, values, numeric, names), step_of


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
    return "W&B's own step (_step, one per wandb.log call)" if cursor.steps == HISTORY else None


def file_run_id(path: Path) -> str:
    """The run id a transaction log's name carries (`run-<id>.wandb`), for a file whose RunRecord
    was not read before its history (damaged)."""
    match = _RUN_FILE.match(path.name)
    return match["id"] if match else path.stem


def _per_record(items: _Items, names: set[str], size: int) -> np.ndarray:
    """Each history record's value of the item named in `names` (NaN where it has none)."""
    codes = [i for i, n in enumerate(items.names) if n in names]
    out = np.full(size, np.nan)
    if codes:
        take = np.isin(items.code, codes) & items.numeric
        out[items.record[take]] = items.value[take]
    return out


def _filled(steps: np.ndarray, before: float) -> np.ndarray:
    """Records with no step take the one before them (the cursor's last step for the first)."""
    steps = np.concatenate([[before], steps])
    index = np.where(np.isnan(steps), 0, np.arange(steps.size))
    return steps[np.maximum.accumulate(index)][1:]


def _steps(items: _Items, step_of: np.ndarray, cursor: Cursor) -> tuple[np.ndarray, str | None]:
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


def _rows(items: _Items, step_of: np.ndarray, cursor: Cursor, name: str | None, keep: Keep | None) -> tuple[pl.DataFrame, Cursor, int, table.Span | None]:
    """The metric rows of a chunk's history records (W&B's own items and the trainer's step left
    out; with `keep`, only the tags it keeps, asked once a key), the cursor's step state after them,
    how many values had no step to go at, and the steps all of them covered."""
    size = step_of.size
    steps, mode = _steps(items, step_of, cursor)
    wall = _per_record(items, {"_timestamp"}, size)
    skip = [i for i, n in enumerate(items.names) if n in W_AND_B_OWN or n in TRAINER_STEPS or n.startswith("_wandb")]
    take = items.numeric & ~np.isin(items.code, skip)
    row_step = steps[items.record[take]]
    placed = ~np.isnan(row_step) & (row_step >= 0) & (row_step < 2.0**63)
    chosen, at = np.flatnonzero(take)[placed], row_step[placed].astype(np.int64)
    span = (int(at.min()), int(at.max())) if at.size else None
    if keep is not None:
        kept = np.isin(items.code[chosen], [i for i, n in enumerate(items.names) if keep(n)])
        chosen, at = chosen[kept], at[kept]
    codes = items.code[chosen]
    tags = pl.Series("tag", items.names, dtype=pl.String()).gather(codes) if codes.size > 256 else pl.Series("tag", [items.names[c] for c in codes.tolist()], dtype=pl.String())
    frame = pl.DataFrame([
        pl.Series("step", at, dtype=pl.Int64()), tags, pl.Series("value", items.value[chosen], dtype=pl.Float64()),
        pl.Series("wall_time", wall[items.record[chosen]], dtype=pl.Float64(), nan_to_null=True),
        pl.Series("run", [name or ""] * chosen.size, dtype=pl.String()),
    ])
    known = steps[~np.isnan(steps)]
    last = int(known[-1]) if known.size and 0 <= known[-1] < 2.0**63 else cursor.last_step
    return frame, cursor.advance(steps=mode, last_step=last), int((~placed).sum()), span


def _empty() -> pl.DataFrame:
    """No rows, with the `run` column all of this format's frames carry (table.finish)."""
    return table.conform_raw(table.empty_raw().with_columns(pl.lit(None, dtype=pl.String).alias("run")))


def _read_here(data: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Which records are history or run records (sources/wandb_log.Needed), as writers lay them
    out, in field order: `num` first, then the record's kind, or `control` (field 16) before the
    kinds numbered above it (a RunRecord's); any other layout is taken to be needed. Read from each
    record's first 8 bytes: `num` is a varint of up to 5 bytes there (a longer one is needed)."""
    word = words_at(data, starts)
    byte = [((word >> np.uint64(8 * k)) & np.uint64(0xFF)).astype(np.uint8) for k in range(8)]
    canonical = byte[0] == 0x08
    after = np.full(starts.size, 7)  # (where the kind is: past the varint)
    for k in range(5, 0, -1):
        after[byte[k] < 0x80] = k + 1
    kind = np.choose(after - 2, byte[2:7], mode="clip")
    then = np.choose(after - 1, byte[2:8], mode="clip")
    bad = (after > 6) | (starts + after > ends)
    ours = (kind == 0x12) | (((kind == 0x8A) | (kind == 0x82)) & (then == 0x01))
    return ~canonical | bad | ours


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
    items, step_of = _items(data, top.start[hist], top.end[hist])
    rows, cursor, unplaced, span = _rows(items, step_of, cursor, name, keep)
    if unplaced:
        problems.append(Problem(source, f"{unplaced} value(s) in history records with no step (no `_step`, no trainer step) skipped"))
    return rows, cursor, problems, span


class WandbFormat:
    """A `.wandb` file is read a chunk (CHUNK, whole blocks) at a time, each chunk's rows handed to
    `each` as decoded; the cursor also keeps the run's name (from its RunRecord, at the file's
    head) and where its steps come from, for reads that start past them."""

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
            end = size if limit is None else min(size, cursor.offset + limit)
            began = cursor.offset
            while cursor.offset < end:
                stop = _chunk_end(cursor.offset, end, chunk)
                fh.seek(cursor.offset)
                rec = frame(
                    fh.read(stop - cursor.offset), base=cursor.offset, skipping=cursor.skipping, final=final and stop == size, source=source, needed=_read_here
                )
                problems.extend(rec.problems)
                rows, moved, found, span = _decode(rec, path, cursor, keep)
                problems.extend(found)
                spans.append(span)
                if rows.height:
                    each(rows) if each is not None else frames.append(rows)
                progressed = rec.consumed > cursor.offset or rec.skipping != cursor.skipping
                cursor = moved.advance(offset=rec.consumed, skipping=rec.skipping)
                if not progressed:
                    if rec.cut is None or stop >= size or cursor.offset > began:
                        break
                    end, chunk = max(end, min(size, stop + chunk)), chunk * 2  # one record longer than the chunk, or past the limit
        if final and cursor.offset < size:
            problems.append(Problem(source, f"last record is incomplete ({size - cursor.offset} bytes; file cut off or still being written)", offset=cursor.offset))
        rows = pl.concat(frames, rechunk=False) if frames else _empty()
        return Parsed(rows, cursor, tuple(problems), span=table.joined(spans), projected=keep is not None)


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
