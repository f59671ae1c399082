"""The items of W&B's history records (`wandb.log` calls), decoded for many records at once.

A HistoryRecord holds items (`key`, or `nested_key` parts, and `value_json`) and a HistoryStep;
a record's items are found in a few array rounds (sources/protobuf.py), the few distinct keys
decoded once each, and the values, JSON numbers (`NaN`, `Infinity` and `-Infinity` as W&B writes
them), parsed by polars in one call (the few of a daemon's read, one by one). A value that is not
a number (a histogram, an image, a table, text, a boolean) is passed over quietly: it is not a
curve lossguard could judge.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import polars as pl

from ..sources.protobuf import WIRE_LEN, fields, spans_of
from ..sources.tfrecord import rows_at, words_at

HISTORY_ITEM, HISTORY_STEP = 1, 2
ITEM_KEY, ITEM_NESTED_KEY, ITEM_VALUE_JSON = 1, 2, 16
_NUMBER_START = np.zeros(256, dtype=bool)
_NUMBER_START[list(b"-0123456789NI")] = True
"""First bytes of a JSON number (and of W&B's NaN, Infinity, -Infinity)."""
LONGEST_NUMBER = 32
SMALL = 512
"""Values parsed one by one (float) rather than by polars, whose CSV reader costs ~1 ms a call:
what a daemon's pass finds in a file is a few steps' values."""

@dataclass(frozen=True)
class Items:
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


def named(names: list[str], pick: Callable[[str], bool]) -> np.ndarray:
    """Per key code, whether `pick` takes its name: a look-up table, where np.isin costs ~0.1 ms a
    call on a daemon's few items."""
    return np.fromiter((pick(n) for n in names), dtype=bool, count=len(names))


def items_of(data: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> tuple[Items, np.ndarray]:
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
    read = ~named(names, lambda n: n in unread)[codes]
    record, codes, vstart, vend = record[read], codes[read], vstart[read], vend[read]
    values, numeric = _numbers(data, vstart, vend)
    return Items(record, codes, values, numeric, names), step_of
