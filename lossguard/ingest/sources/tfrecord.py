"""TFRecord framing (the container of TensorBoard event files), CRC-checked, from a byte offset.

    uint64 length | uint32 masked_crc32c(length) | data[length] | uint32 masked_crc32c(data)

Finding record boundaries is inherently sequential, but writers repeat themselves: the same few
record lengths cycle for millions of records. Framing walks a few dozen records one by one, learns
the cycle, predicts the next boundaries in bulk and checks every prediction against the lengths
actually stored there (numpy), falling back to walking where the pattern breaks. Checksums are
computed for all records at once too, a column of bytes at a time (crc32c_rows), so no Python code
runs per record. A record cut off at the end of a growing file is not an error: framing stops
before it and the next call resumes there. A bad length checksum means the framing cannot be trusted
past that point: the file is declared dead. A bad data checksum costs only that record.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

import crc32c as _crc32c
import numpy as np

from ..problems import Problem

_MASK_DELTA = 0xA282EAD8
_LEARN = 48
_MAX_PERIOD = 16


def masked_crc(data: bytes) -> int:
    crc = _crc32c.crc32c(data)
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


def _table() -> np.ndarray:
    poly = 0x82F63B78
    table = np.zeros(256, dtype=np.uint32)
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ poly if c & 1 else c >> 1
        table[i] = c
    return table


_TABLE = _table()


def _table16() -> np.ndarray:
    """Two bytes at a time: T16[v] advances the CRC over the 16 bits v (state xor next two bytes)."""
    v = np.arange(65536, dtype=np.uint32)
    first = _TABLE[v & 0xFF]
    return _TABLE[(first ^ (v >> 8)) & 0xFF] ^ (first >> 8)


_TABLE16 = _table16()


def rows_at(arr: np.ndarray, starts: np.ndarray, length: int) -> np.ndarray:
    """The (records, length) matrix of the bytes at each start: a strided view gathered row by row,
    so no (records x length) index array is ever built."""
    if length == 0 or arr.size < length:
        return np.zeros((starts.size, length), dtype=np.uint8)
    windows = np.lib.stride_tricks.as_strided(arr, shape=(arr.size - length + 1, length), strides=(1, 1), writeable=False)
    return windows[starts]


def words_at(arr: np.ndarray, at: np.ndarray) -> np.ndarray:
    """The 8 bytes at each position as a little-endian uint64: two aligned words gathered and
    shifted together, half what gathering the bytes (rows_at) costs. Positions must leave 16
    bytes before the end of `arr` (callers pad it); nearer ones are clipped, their words garbage."""
    lead = -arr.__array_interface__["data"][0] % 8
    n = (arr.size - lead) // 8
    if n < 3:
        return rows_at(np.concatenate([arr, np.zeros(16, dtype=np.uint8)]), np.maximum(at, 0), 8).view("<u8").ravel()
    words = arr[lead : lead + n * 8].view("<u8")
    q = np.minimum(np.maximum(at - lead, 0), n * 8 - 9)
    shift = ((q & 7) << 3).astype(np.uint64)
    out = (words[q >> 3] >> shift) | ((words[(q >> 3) + 1] << (np.uint64(56) - shift)) << np.uint64(8))
    early = at < lead  # (the few bytes before the first aligned word)
    if early.any():
        out[early] = rows_at(arr, np.maximum(at[early], 0), 8).view("<u8").ravel()
    return out


def crc32c_rows(rows: np.ndarray) -> np.ndarray:
    """CRC32C of each row of a (records, length) uint8 matrix, two byte columns at a time."""
    crc = np.full(rows.shape[0], 0xFFFFFFFF, dtype=np.uint32)
    length = rows.shape[1]
    pairs = length // 2
    if pairs:
        words = np.ascontiguousarray(rows[:, : 2 * pairs]).view("<u2")
        for j in range(pairs):
            crc = _TABLE16[(crc ^ words[:, j]) & 0xFFFF] ^ (crc >> 16)
    if length % 2:
        crc = _TABLE[(crc ^ rows[:, -1]) & 0xFF] ^ (crc >> 8)
    return crc ^ np.uint32(0xFFFFFFFF)


def mask(crcs: np.ndarray) -> np.ndarray:
    crcs = crcs.astype(np.uint32)
    return (((crcs >> np.uint32(15)) | (crcs << np.uint32(17))) + np.uint32(_MASK_DELTA)).astype(np.uint32)


@dataclass
class Framing:
    heads: np.ndarray
    """Offsets (within the buffer) of each complete record's header, length checksum verified."""
    lengths: np.ndarray
    consumed: int
    """Bytes of the buffer that held complete records."""
    problems: list[Problem] = field(default_factory=list)
    dead: bool = False
    need: int = 0
    """When no record fits in the buffer: the bytes the next record needs."""

    @property
    def starts(self) -> np.ndarray:
        return self.heads + 12


def _walk(buf: bytes, pos: int, limit: int, heads: list[int], lengths: list[int]) -> tuple[int, int]:
    """Frame up to `limit` records one by one; returns (position after them, bytes the next needs)."""
    n = len(buf)
    unpack = struct.Struct("<Q").unpack_from
    for _ in range(limit):
        if pos + 12 > n:
            return pos, 12
        (length,) = unpack(buf, pos)
        end = pos + 16 + length
        if end > n:
            return pos, end - pos
        heads.append(pos)
        lengths.append(length)
        pos = end
    return pos, 0


def _period(lengths: list[int]) -> int | None:
    tail = lengths[-2 * _MAX_PERIOD :]
    for p in range(1, _MAX_PERIOD + 1):
        if len(tail) >= 2 * p and all(tail[i] == tail[i - p] for i in range(p, len(tail))):
            return p
    return None


def _find_boundaries(buf: bytes) -> tuple[np.ndarray, np.ndarray, int, int]:
    arr = np.frombuffer(buf, dtype=np.uint8)
    n = len(buf)
    heads: list[int] = []
    lengths: list[int] = []
    bulk_heads: list[np.ndarray] = []
    bulk_lengths: list[np.ndarray] = []
    pos = 0
    while True:
        start_count = len(heads)
        pos, need = _walk(buf, pos, _LEARN, heads, lengths)
        if need or pos >= n:
            break
        p = _period(lengths[start_count:])
        if p is None:
            continue
        cycle = np.asarray(lengths[-p:], dtype=np.int64)
        size = cycle + 16
        reps = max(1, (n - pos) // int(size.sum()) + 1)
        sizes = np.tile(size, reps)
        predicted = pos + np.concatenate([[0], np.cumsum(sizes)[:-1]])
        expect = np.tile(cycle, reps)
        fits = predicted + 16 + expect <= n
        predicted, expect = predicted[fits], expect[fits]
        if not predicted.size:
            continue
        # The length actually stored at each predicted header (8 little-endian bytes).
        stored = rows_at(arr, predicted, 8).view("<u8").ravel()
        bad = np.flatnonzero(stored != expect.astype(np.uint64))
        good = int(bad[0]) if bad.size else predicted.size
        if good:
            bulk_heads.append(np.asarray(heads, dtype=np.int64))
            bulk_lengths.append(np.asarray(lengths, dtype=np.int64))
            heads, lengths = [], []
            bulk_heads.append(predicted[:good])
            bulk_lengths.append(expect[:good])
            pos = int(predicted[good - 1] + 16 + expect[good - 1])
    bulk_heads.append(np.asarray(heads, dtype=np.int64))
    bulk_lengths.append(np.asarray(lengths, dtype=np.int64))
    return np.concatenate(bulk_heads), np.concatenate(bulk_lengths), pos, need


def frame(buf: bytes, *, base_offset: int, source: str) -> Framing:
    heads, lengths, pos, need = _find_boundaries(buf)
    arr = np.frombuffer(buf, dtype=np.uint8)
    problems: list[Problem] = []
    dead = False
    # Length checksums of every complete record, and of the header of a cut-off one if it is whole.
    check = heads
    pending = need and pos + 12 <= len(buf)
    if pending:
        check = np.append(heads, pos)
    if check.size:
        both = rows_at(arr, check, 12)
        header = both[:, :8]
        stored = np.ascontiguousarray(both[:, 8:]).view("<u4").ravel()
        ok = mask(crc32c_rows(header)) == stored
        if not ok.all():
            first = int(np.argmin(ok))
            problems.append(
                Problem(source, "corrupt event record (length checksum mismatch); the rest of the file is not read", offset=base_offset + int(check[first]))
            )
            dead = True
            heads, lengths = heads[:first], lengths[:first]
            pos = int(heads[-1] + 16 + lengths[-1]) if heads.size else 0
            need = 0
    return Framing(heads, lengths, pos, problems, dead, need)


def data_checksums_ok(matrix: np.ndarray, stored: np.ndarray) -> np.ndarray:
    """Which rows of a (records, length) matrix of record data match their stored masked CRC."""
    return mask(crc32c_rows(matrix)) == stored
