"""Protocol Buffers' wire format walked for many messages at once, with numpy.

A tracker's log holds tens of thousands of small messages of one type (W&B's history records), and
a walker that steps through one field of one message per Python call costs more than the rest of
a read together. Walking is sequential inside a message but independent between messages, so here
every message advances one field per round: a round is a few array operations over all messages
still unfinished, and a read costs as many rounds as its widest message has fields.

Nothing is decoded beyond where each field's value sits: the caller picks the fields it needs and
reads their bytes. A message whose bytes break the wire format (a varint running past its end, a
length beyond it, a group) is marked bad and walked no further; the fields found before the break
are still returned, and the caller decides what a bad message costs.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

MAX_VARINT = 10
WIRE_VARINT, WIRE_FIXED64, WIRE_LEN, WIRE_FIXED32 = 0, 1, 2, 5


def varints(data: np.ndarray, at: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The varint at each position `at` (none may run to `end`): (values, positions after them,
    which ran past their end or past ten bytes). Most are one byte: the rounds after the first
    go on only for the few longer."""
    byte = data[np.minimum(at, data.size - 1)]
    value = (byte & 0x7F).astype(np.uint64)
    after = at + 1
    bad = at >= end
    more = np.flatnonzero((byte >= 0x80) & ~bad)
    for shift in range(7, 7 * MAX_VARINT, 7):
        if not more.size:
            return value, after, bad
        where = after[more]
        past = where >= end[more]
        if past.any():
            bad[more[past]] = True
            more, where = more[~past], where[~past]
        byte = data[where]
        value[more] |= (byte & 0x7F).astype(np.uint64) << np.uint64(shift)
        after[more] = where + 1
        more = more[byte >= 0x80]
    bad[more] = True
    return value, after, bad


@lru_cache(maxsize=64)
def _table(numbers: tuple[int, ...]) -> np.ndarray:
    """A lookup table of field numbers (number -> in the set; its last entry, where larger numbers
    are clipped to, is False), for a test per field per round."""
    out = np.zeros(max(numbers, default=0) + 2, dtype=bool)
    out[list(numbers)] = True
    return out


@dataclass(frozen=True)
class Fields:
    """The fields found, in no particular order across messages (by round): sort by `key_at` for
    their order in the bytes."""

    message: np.ndarray
    """Index (into the messages walked) of the message each field is in."""
    number: np.ndarray
    wire: np.ndarray
    key_at: np.ndarray
    """Where the field's key starts."""
    start: np.ndarray
    """Where its value starts (a length-delimited field: past the length)."""
    end: np.ndarray
    value: np.ndarray
    """A varint field's value; a length-delimited field's length."""
    bad: np.ndarray
    """Per message walked: its bytes break the wire format."""

    def only(self, number: int) -> Fields:
        keep = self.number == number
        return Fields(self.message[keep], self.number[keep], self.wire[keep], self.key_at[keep], self.start[keep], self.end[keep], self.value[keep], self.bad)


def fields(data: np.ndarray, starts: np.ndarray, ends: np.ndarray, *, keep: Collection[int], stop: Collection[int] = ()) -> Fields:
    """The fields numbered in `keep` of the messages at [starts, ends) of `data`. A message is walked
    no further once a field numbered in `stop` is met (a oneof's member, when nothing after it is
    needed), that field included."""
    starts = np.asarray(starts, dtype=np.int64)
    ends = np.asarray(ends, dtype=np.int64)
    if starts.size <= FEW:
        return _fields_one_by_one(data, starts, ends, keep=frozenset(keep), stop=frozenset(stop))
    bad = np.zeros(starts.size, dtype=bool)
    found: list[tuple[np.ndarray, ...]] = []
    keep_t, stop_t = _table(tuple(sorted(keep))), _table(tuple(sorted(stop)))
    live = np.flatnonzero(starts < ends)
    pos = starts[live]
    while live.size:
        end = ends[live]
        key, after, broken = varints(data, pos, end)
        number = (key >> np.uint64(3)).astype(np.int64)
        wire = (key & np.uint64(7)).astype(np.int64)
        value, past_value, broken_value = varints(data, after, end)
        is_len = wire == WIRE_LEN
        sized = is_len | (wire == WIRE_VARINT)
        value_start = np.where(is_len, past_value, after)
        # Lengths past any buffer are clipped: such a field ends past its message, and is broken.
        value_end = np.where(is_len, past_value + np.minimum(value, np.uint64(1 << 62)).astype(np.int64), past_value)
        fixed = ~sized
        if fixed.any():
            width = np.where(wire == WIRE_FIXED64, 8, np.where(wire == WIRE_FIXED32, 4, -1))
            broken |= fixed & (width < 0)
            value_end = np.where(fixed, after + width, value_end)
            value = np.where(fixed, np.uint64(0), value)
        broken |= (sized & broken_value) | (value_end > end)
        ok = ~broken
        wanted = ok & keep_t[np.minimum(number, keep_t.size - 1)]
        if wanted.any():
            found.append((live[wanted], number[wanted], wire[wanted], pos[wanted], value_start[wanted], value_end[wanted], value[wanted]))
        bad[live[broken]] = True
        going = ok & (value_end < end)
        if len(stop):
            going &= ~stop_t[np.minimum(number, stop_t.size - 1)]
        live, pos = live[going], value_end[going]
    if not found:
        empty = np.zeros(0, dtype=np.int64)
        return Fields(empty, empty, empty, empty, empty, empty, np.zeros(0, dtype=np.uint64), bad)
    columns = [np.concatenate(parts) for parts in zip(*found)]
    return Fields(*columns, bad=bad)


FEW = 8
"""Messages walked one by one, in Python, rather than as arrays: a round of array operations costs
a few dozen microseconds whatever its size, a field in Python one (a daemon's read of a few new
records)."""


def _varint(raw: bytes, i: int, end: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if i >= end or shift >= 7 * MAX_VARINT:
            raise ValueError("varint past its message")
        byte = raw[i]
        value |= (byte & 0x7F) << shift
        i += 1
        if byte < 0x80:
            return value, i
        shift += 7


def _fields_one_by_one(data: np.ndarray, starts: np.ndarray, ends: np.ndarray, *, keep: frozenset[int], stop: frozenset[int]) -> Fields:
    """`fields` for a few messages, to the same result."""
    found: list[tuple[int, ...]] = []
    bad = np.zeros(starts.size, dtype=bool)
    for m, (a, b) in enumerate(zip(starts.tolist(), ends.tolist())):
        raw, i = data[a:b].tobytes(), 0
        try:
            while i < len(raw):
                key, after = _varint(raw, i, len(raw))
                number, wire = key >> 3, key & 7
                value, start = 0, after
                if wire in (WIRE_VARINT, WIRE_LEN):
                    value, past = _varint(raw, after, len(raw))
                    start, end = (past, past + value) if wire == WIRE_LEN else (after, past)
                elif wire in (WIRE_FIXED64, WIRE_FIXED32):
                    end = after + (8 if wire == WIRE_FIXED64 else 4)
                else:
                    raise ValueError("wire type")
                if end > len(raw):
                    raise ValueError("field past its message")
                if number in keep:
                    found.append((m, number, wire, a + i, a + start, a + end, value))
                if number in stop:
                    break
                i = end
        except ValueError:
            bad[m] = True
    if not found:
        empty = np.zeros(0, dtype=np.int64)
        return Fields(empty, empty, empty, empty, empty, empty, np.zeros(0, dtype=np.uint64), bad)
    columns = [np.asarray(c, dtype=np.int64) for c in list(zip(*found))[:6]]
    return Fields(*columns, value=np.asarray([f[6] for f in found], dtype=np.uint64), bad=bad)


def spans_of(data: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> list[bytes]:
    """The bytes of a few spans (names, ids): for the handful of values decoded one by one."""
    return [data[a:b].tobytes() for a, b in zip(starts.tolist(), ends.tolist())]
