"""TensorBoard event files: TF1 `simple_value` scalars and TF2-style rank-0 tensor scalars.

Speed comes from the shape of real event files: a writer emits millions of records that differ only
in step, wall time, value and (same-length) tag. Each new record shape is parsed once by a small
protobuf walker that also returns its layout (where step, wall time, tag and value sit); every other
record of the same length whose remaining bytes equal that template's is then decoded in bulk with
numpy. Records of any other shape (several values, histograms, half-precision varints...) go through
the walker one by one, so nothing is lost, only slower.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl

from .. import table
from ..cursor import Cursor
from ..problems import Problem
from ..sources.tfrecord import data_checksums_ok, frame, rows_at
from .base import Format, Keep, Parsed, Sink, kept_rows
from .tb_parts import renamed, sub_writer

CHUNK = 16 << 20
MAX_TEMPLATES = 64

# TensorFlow DataType enum values that can hold a scalar we read.
DT_FLOAT, DT_DOUBLE, DT_INT32, DT_INT64, DT_BFLOAT16, DT_HALF = 1, 2, 3, 9, 14, 19
_CONTENT_KIND = {DT_FLOAT: "<f4", DT_DOUBLE: "<f8", DT_HALF: "<f2", DT_BFLOAT16: "bf16", DT_INT32: "<i4", DT_INT64: "<i8"}
_WIDTH = {"<f4": 4, "<f8": 8, "<f2": 2, "bf16": 2, "<i4": 4, "<i8": 8}


class _Malformed(Exception):
    pass


def _varint(buf: memoryview, i: int, end: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if i >= end or shift > 63:
            raise _Malformed("varint")
        byte = buf[i]
        i += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, i
        shift += 7


def _fields(buf: memoryview, i: int, end: int):
    """(field number, wire type, value or (start, end) for length-delimited, start of the value)."""
    while i < end:
        key, i = _varint(buf, i, end)
        number, wire = key >> 3, key & 7
        at = i
        if wire == 0:
            value, i = _varint(buf, i, end)
        elif wire == 1:
            value, i = (at, at + 8), at + 8
        elif wire == 5:
            value, i = (at, at + 4), at + 4
        elif wire == 2:
            length, i = _varint(buf, i, end)
            at = i
            value, i = (i, i + length), i + length
        else:
            raise _Malformed(f"wire type {wire}")
        if i > end:
            raise _Malformed("field past the end")
        yield number, wire, value, at


def _decode_value(kind: str, raw: bytes) -> float:
    if kind == "bf16":
        return float((np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view("<f4")[0])
    return float(np.frombuffer(raw, dtype=kind)[0])


def _tensor_scalar(buf: memoryview, start: int, end: int) -> tuple[float, tuple[int, str]] | None:
    """The value of a rank-0 numeric TensorProto, and where its bytes sit (None: not bulk-decodable)."""
    dtype = 0
    rank0 = True
    content: tuple[int, int] | None = None
    packed: dict[int, tuple[int, int, int]] = {}
    for number, wire, value, _ in _fields(buf, start, end):
        if number == 1 and wire == 0:
            dtype = value
        elif number == 2 and wire == 2:
            rank0 = not any(n in (2, 3) for n, *_ in _fields(buf, *value))
        elif number == 4 and wire == 2:
            content = value
        elif number in (5, 6, 7, 10, 13) and wire in (0, 1, 2, 5):
            packed[number] = (wire, *(value if isinstance(value, tuple) else (value, value)))
    kind = _CONTENT_KIND.get(dtype)
    if not rank0 or kind is None:
        return None
    width = _WIDTH[kind]
    if content is not None and content[1] - content[0] == width:
        return _decode_value(kind, bytes(buf[content[0] : content[1]])), (content[0], kind)
    field_of = {DT_FLOAT: 5, DT_DOUBLE: 6, DT_INT32: 7, DT_INT64: 10, DT_HALF: 13, DT_BFLOAT16: 13}
    entry = packed.get(field_of[dtype])
    if entry is None:
        return None
    wire, a, b = entry
    if dtype in (DT_FLOAT, DT_DOUBLE) and b - a == width:
        return _decode_value(kind, bytes(buf[a:b])), (a, kind)
    # Varint-packed values (int, half_val): decode, not bulk-decodable.
    if wire == 0:
        number = a
    else:
        number, _ = _varint(buf, a, b)
    if dtype in (DT_HALF, DT_BFLOAT16):
        bits = np.array([number & 0xFFFF], dtype="<u2")
        number = float(bits.view("<f2")[0]) if dtype == DT_HALF else float((bits.astype(np.uint32) << 16).view("<f4")[0])
    elif dtype in (DT_INT32, DT_INT64):
        number = float(np.array([number], dtype=np.uint64).view(np.int64)[0])
    return float(number), None


@dataclass(frozen=True)
class Layout:
    """Where the variable parts of a single-scalar record sit, relative to the record's start."""

    wall: int | None
    step: int | None
    step_len: int
    tag: int
    tag_len: int
    value: int
    kind: str


def parse_event(buf: memoryview, start: int, end: int) -> tuple[list[tuple[int, float | None, str, float]], Layout | None]:
    """Scalars of one Event record, and its layout when it holds exactly one bulk-decodable scalar."""
    wall = None
    wall_at = step_at = None
    step = 0
    step_len = 0
    summary: tuple[int, int] | None = None
    for number, wire, value, at in _fields(buf, start, end):
        if number == 1 and wire == 1:
            wall = struct.unpack_from("<d", buf, value[0])[0]
            wall_at = value[0]
        elif number == 2 and wire == 0:
            step = value - (1 << 64) if value >= 1 << 63 else value
            step_at = at
            step_len = _varint(buf, at, end)[1] - at
        elif number == 5 and wire == 2:
            summary = value
    if summary is None:
        return [], None
    out: list[tuple[int, float | None, str, float]] = []
    spots: list[tuple[int, int, int, str] | None] = []
    for number, wire, value, _ in _fields(buf, *summary):
        if number != 1 or wire != 2:
            continue
        tag = ""
        tag_at: tuple[int, int] | None = None
        scalar: float | None = None
        spot: tuple[int, str] | None = None
        for vnum, vwire, vval, _ in _fields(buf, *value):
            if vnum == 1 and vwire == 2:
                tag = bytes(buf[vval[0] : vval[1]]).decode("utf-8", errors="replace")
                tag_at = vval
            elif vnum == 2 and vwire == 5:
                scalar = struct.unpack_from("<f", buf, vval[0])[0]
                spot = (vval[0], "<f4")
            elif vnum == 8 and vwire == 2:
                found = _tensor_scalar(buf, *vval)
                if found is not None:
                    scalar, spot = found
        if scalar is None:
            continue
        out.append((step, wall, tag, scalar))
        spots.append(None if spot is None or tag_at is None else (tag_at[0], tag_at[1] - tag_at[0], *spot))
    layout = None
    if len(out) == 1 and spots[0] is not None:
        tag_pos, tag_len, value_pos, kind = spots[0]
        layout = Layout(
            wall=None if wall_at is None else wall_at - start,
            step=None if step_at is None else step_at - start,
            step_len=step_len,
            tag=tag_pos - start,
            tag_len=tag_len,
            value=value_pos - start,
            kind=kind,
        )
    return out, layout


def _variable_mask(layout: Layout, length: int) -> np.ndarray:
    mask = np.ones(length, dtype=bool)
    if layout.wall is not None:
        mask[layout.wall : layout.wall + 8] = False
    if layout.step is not None:
        mask[layout.step : layout.step + layout.step_len] = False
    mask[layout.tag : layout.tag + layout.tag_len] = False
    mask[layout.value : layout.value + _WIDTH[layout.kind]] = False
    return mask


def _bulk(rows: np.ndarray, layout: Layout) -> dict[str, np.ndarray]:
    """Decode many records of one layout: rows is (records, length) uint8."""
    k = rows.shape[0]
    if layout.wall is not None:
        wall = np.ascontiguousarray(rows[:, layout.wall : layout.wall + 8]).view("<f8").ravel()
    else:
        wall = np.full(k, np.nan)
    if layout.step is not None:
        step = np.zeros(k, dtype=np.uint64)
        for j in range(layout.step_len):
            step |= (rows[:, layout.step + j].astype(np.uint64) & np.uint64(0x7F)) << np.uint64(7 * j)
        step = step.view(np.int64)
    else:
        step = np.zeros(k, dtype=np.int64)
    raw = np.ascontiguousarray(rows[:, layout.value : layout.value + _WIDTH[layout.kind]])
    if layout.kind == "bf16":
        value = (raw.view("<u2").astype(np.uint32) << 16).view("<f4").ravel().astype(np.float64)
    else:
        value = raw.view(layout.kind).ravel().astype(np.float64)
    tags = np.ascontiguousarray(rows[:, layout.tag : layout.tag + layout.tag_len])
    return {"step": step, "wall": wall, "tags": tags, "value": value}


def _step_continuation_ok(rows: np.ndarray, layout: Layout) -> np.ndarray:
    if layout.step is None or layout.step_len == 0:
        return np.ones(rows.shape[0], dtype=bool)
    ok = rows[:, layout.step + layout.step_len - 1] < 0x80
    for j in range(layout.step_len - 1):
        ok &= rows[:, layout.step + j] >= 0x80
    return ok


def decode(buf: bytes, starts: np.ndarray, lengths: np.ndarray, *, source: str, base_offset: int) -> tuple[pl.DataFrame, list[Problem]]:
    """Scalar rows (step, tag, value, wall_time) of the framed records, in file order."""
    arr = np.frombuffer(buf, dtype=np.uint8)
    view = memoryview(buf)
    problems: list[Problem] = []
    parts: list[dict[str, np.ndarray]] = []
    slow: list[tuple[int, int, float, str, float]] = []  # (record, step, wall, tag, value)
    malformed = 0
    first_malformed = None
    bad_crc = 0
    first_bad_crc: int | None = None

    def walk(rec: int, *, bulk: bool = True) -> Layout | None:
        """Parse one record; its rows go to `slow` unless it has a layout the bulk path will decode."""
        nonlocal malformed, first_malformed
        s = int(starts[rec])
        try:
            found, layout = parse_event(view, s, s + int(lengths[rec]))
        except _Malformed:
            malformed += 1
            first_malformed = first_malformed if first_malformed is not None else base_offset + s - 12
            return None
        if layout is None or not bulk:
            slow.extend((rec, st, float("nan") if w is None else w, t, v) for st, w, t, v in found)
            return None
        return layout

    if starts.size:
        unique_lengths, inverse = np.unique(lengths, return_inverse=True)
        order = np.argsort(inverse, kind="stable")
        bounds = np.searchsorted(inverse[order], np.arange(unique_lengths.size + 1))
        for g, length in enumerate(unique_lengths.tolist()):
            members = order[bounds[g] : bounds[g + 1]]
            if length == 0:
                continue
            both = rows_at(arr, starts[members], length + 4)
            matrix = both[:, :length]
            stored = np.ascontiguousarray(both[:, length:]).view("<u4").ravel()
            ok = data_checksums_ok(matrix, stored)
            if not ok.all():
                bad_crc += int((~ok).sum())
                at = base_offset + int(starts[members][~ok].min()) - 12
                first_bad_crc = at if first_bad_crc is None else min(first_bad_crc, at)
                members, matrix = members[ok], matrix[ok]
            pending = np.arange(members.size)
            templates = 0
            while pending.size:
                first = int(pending[0])
                layout = walk(int(members[first]))
                if layout is None:
                    pending = pending[1:]
                    continue
                templates += 1
                if templates > MAX_TEMPLATES:
                    for rec in pending.tolist():
                        walk(int(members[rec]), bulk=False)
                    break
                mask = _variable_mask(layout, length)
                candidates = matrix[pending]
                match = (candidates[:, mask] == matrix[first, mask]).all(axis=1) & _step_continuation_ok(candidates, layout)
                match[0] = True
                chosen = pending[match]
                part = _bulk(matrix[chosen], layout)
                part["record"] = members[chosen]
                parts.append(part)
                pending = pending[~match]
    if bad_crc:
        problems.append(
            Problem(source, f"{bad_crc} event record(s) with a bad data checksum skipped (first at byte {first_bad_crc})", offset=first_bad_crc)
        )
    if malformed:
        problems.append(Problem(source, f"{malformed} event record(s) that are not valid Event protobufs skipped", offset=first_malformed))
    return _assemble(parts, slow), problems


def _tag_names(tags: np.ndarray) -> tuple[list[str], np.ndarray]:
    """Distinct tags of a (records, tag length) byte matrix and each record's index into them.
    Writers use a handful of tags, so peel them off one at a time rather than sorting rows."""
    k = tags.shape[0]
    index = np.full(k, -1, dtype=np.int64)
    names: list[str] = []
    rows = np.ascontiguousarray(tags).view(np.dtype((np.void, tags.shape[1]))).ravel() if tags.shape[1] else np.zeros(k, dtype="V1")
    left = np.arange(k)
    while left.size:
        if len(names) >= 64:
            uniq, inv = np.unique(rows[left], return_inverse=True)
            index[left] = len(names) + inv.ravel()
            names.extend(bytes(u).decode("utf-8", errors="replace") for u in uniq)
            break
        first = rows[left[0]]
        same = rows[left] == first
        index[left[same]] = len(names)
        names.append(bytes(first).decode("utf-8", errors="replace"))
        left = left[~same]
    return names, index


def _assemble(parts: list[dict[str, np.ndarray]], slow: list[tuple[int, int, float, str, float]]) -> pl.DataFrame:
    frames = []
    if parts:
        # One frame for all the bulk parts (a small file has a few record shapes, and a frame built
        # per shape was half its read): their tag names listed one after another, each part's codes
        # shifted past the names before it.
        names: list[str] = []
        codes = []
        for part in parts:
            mine, inv = _tag_names(part["tags"])
            codes.append(inv + len(names))
            names.extend(mine)
        records = np.concatenate([part["record"] for part in parts]).astype(np.int64)
        frames.append(
            pl.DataFrame(
                {
                    "record": records,
                    "sub": np.zeros(records.size, dtype=np.int64),
                    "step": np.concatenate([part["step"] for part in parts]),
                    "tag": pl.Series(names, dtype=pl.String()).gather(np.concatenate(codes)),
                    "value": np.concatenate([part["value"] for part in parts]),
                    "wall_time": np.concatenate([part["wall"] for part in parts]),
                }
            )
        )
    if slow:
        rec, step, wall, tag, value = zip(*slow)
        sub = np.zeros(len(rec), dtype=np.int64)
        rec_a = np.asarray(rec, dtype=np.int64)
        if rec_a.size > 1:
            same = np.concatenate([[False], rec_a[1:] == rec_a[:-1]])
            # Position of each value within its record (records with several values keep their order).
            run_start = np.maximum.accumulate(np.where(~same, np.arange(rec_a.size), 0))
            sub = np.arange(rec_a.size) - run_start
        frames.append(
            pl.DataFrame(
                {"record": rec_a, "sub": sub, "step": np.asarray(step, dtype=np.int64), "tag": list(tag), "value": np.asarray(value, dtype=np.float64), "wall_time": np.asarray(wall, dtype=np.float64)},
                schema={"record": pl.Int64(), "sub": pl.Int64(), "step": pl.Int64(), "tag": pl.String(), "value": pl.Float64(), "wall_time": pl.Float64()},
            )
        )
    if not frames:
        return table.empty_raw()
    out = pl.concat(frames).sort("record", "sub")
    return table.conform_raw(out.with_columns(pl.col("wall_time").fill_nan(None)))


PEEK = 1 << 16
"""Bytes of an event file read for the tags of its first records (tb_parts: an add_scalars part)."""


_FIRST_TAGS: dict[tuple[str, int], frozenset[str]] = {}
"""first_tags' answers by path and inode, once a file showed a tag: its first records never change."""


def first_tags(file: str) -> frozenset[str]:
    """The scalar tags of an event file's first records (those in its first PEEK bytes)."""
    try:
        key = (file, os.stat(file).st_ino)
    except OSError:
        return frozenset()
    if (known := _FIRST_TAGS.get(key)) is not None:
        return known
    found = _peek_tags(file)
    if found:
        if len(_FIRST_TAGS) >= 16384:
            _FIRST_TAGS.clear()
        _FIRST_TAGS[key] = found
    return found


def _peek_tags(file: str) -> frozenset[str]:
    try:
        with open(file, "rb") as fh:
            buf = fh.read(PEEK)
    except OSError:
        return frozenset()
    framing = frame(buf, base_offset=0, source=file)  # (the whole records, their lengths checked)
    view, tags = memoryview(buf), set()
    for start, length in zip(framing.starts.tolist(), framing.lengths.tolist()):
        try:
            rows, _ = parse_event(view, start, start + length)
        except _Malformed:  # (a damaged record: what came before it is the answer)
            break
        tags.update(tag for _, _, tag, _ in rows)
    return frozenset(tags)


class TfEventsFormat:
    """Event files are decoded a chunk (CHUNK) at a time: each chunk's rows go to `each` as they are
    decoded (`lossguard read` writes them while the next is decoded), and `keep` leaves out the tags
    nobody needs chunk by chunk (TensorBoard logs often hold dozens of tags; judging reads a few)."""

    name = "tfevents"
    streams = True
    projects = True

    def read(
        self, path: Path, cursor: Cursor, *, final: bool, chunk: int | None = None, limit: int | None = None, each: Sink | None = None, keep: Keep | None = None
    ) -> Parsed:
        chunk = chunk or CHUNK
        source = str(path)
        problems: list[Problem] = []
        frames: list[pl.DataFrame] = []
        spans: list[table.Span | None] = []
        offset = cursor.offset
        dead = False
        chunk = min(chunk, limit) if limit else chunk
        split = sub_writer(path.parent, tags_of=first_tags)
        with open(path, "rb") as fh:
            # Only what the file held at open: records appended while these are decoded are the
            # next pass's (chasing a busy writer a few records at a time costs a decode each).
            size = os.fstat(fh.fileno()).st_size
            end = size if limit is None else min(size, cursor.offset + limit)  # (`limit`: no more than that)
            want = chunk
            while True:
                fh.seek(offset)
                buf = fh.read(max(0, min(want, end - offset)))
                if len(buf) < 12:
                    if end < size and offset == cursor.offset:
                        end, want = size, 12  # not one whole record within the limit: the one across it
                        continue
                    break
                framing = frame(buf, base_offset=offset, source=source)
                problems.extend(framing.problems)
                if framing.starts.size:
                    rows, found = decode(buf, framing.starts, framing.lengths, source=source, base_offset=offset)
                    problems.extend(found)
                    if split is not None and rows.height:
                        rows = renamed(rows, split)
                    if rows.height and keep is not None:
                        spans.append(table.span_of(rows))
                        rows = kept_rows(rows, keep)
                    if rows.height:
                        each(rows) if each is not None else frames.append(rows)
                offset += framing.consumed
                if framing.dead:
                    dead = True
                    break
                if limit is not None and offset - cursor.offset >= limit:
                    final = False  # stopped by the limit, not at the end: nothing is cut off
                    break
                if framing.consumed == 0:
                    if framing.need > len(buf) and len(buf) == want:
                        want = framing.need  # one record larger than the chunk
                        continue
                    if framing.need > len(buf) and end < size and offset == cursor.offset:
                        end, want = size, framing.need  # (as above)
                        continue
                    break
                want = chunk
        if final and not dead:
            size = path.stat().st_size
            if size > offset:
                problems.append(Problem(source, f"last event record is incomplete ({size - offset} bytes; file cut off or still being written)", offset=offset, unfinished=True))
        rows = pl.concat(frames, rechunk=False) if frames else table.empty_raw()
        return Parsed(rows, cursor.advance(offset=offset), tuple(problems), dead=dead, span=table.joined(spans), projected=keep is not None)


TFEVENTS = TfEventsFormat()
FORMAT = Format(reader=TFEVENTS, names=("events.out.tfevents*",))
