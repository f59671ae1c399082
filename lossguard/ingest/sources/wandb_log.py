"""W&B's transaction log (`run-<id>.wandb`): LevelDB's log format behind a 7-byte file header.

    header  ':W&B' | magic 0xBEE1 (uint16 LE) | version 0
    blocks  32 KiB each (the header is the first block's first bytes), holding chunks
    chunk   crc32 (uint32 LE) | length (uint16 LE) | type (1 byte) | data[length]

A record too long for what is left of a block is cut into a FIRST chunk, MIDDLE ones and a LAST
(one that fits is FULL); fewer than 7 bytes left at a block's end are zero padding. The checksum is
zlib's CRC-32 (not LevelDB's CRC-32C) over the type byte and the data, as wandb-core writes it.

Chunks never cross a block boundary, so every block starts with a chunk header: blocks are framed
side by side (numpy), one chunk of every block per round, and a file costs as many rounds as its
fullest block has chunks, not one Python step per chunk. Damage costs the rest of its block only,
as in LevelDB's reader: the next block starts afresh. wandb-core writes its buffer out when a block
fills and at each flush, so a growing file's last record may be cut: it is "not yet", and the
cursor stays before it. A record longer than a read, and runs of zeros where chunks should start,
are the reader's to follow and pass over (sources/wandb_follow.py, formats/wandb_edges.py).
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from typing import BinaryIO
from dataclasses import dataclass, field

import numpy as np

from ..problems import Problem

BLOCK = 32 << 10
CHUNK_HEADER = 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4
FILE_HEADER = b":W&B" + (0xBEE1).to_bytes(2, "little") + bytes([0])
PAD = 64
"""Zero bytes on either side of Records.data: a window of a few dozen bytes around any field of a
record stays inside it, so a decoder can cut fixed-width rows without checking each one's bounds."""


def header_problem(head: bytes) -> str | None:
    """What is wrong with a file's first 7 bytes (None: a W&B transaction log, version 0)."""
    if head == FILE_HEADER:
        return None
    if head[:4] != FILE_HEADER[:4] or head[4:6] != FILE_HEADER[4:6]:
        return "not a W&B transaction log (its first bytes are not ':W&B' and the magic 0xBEE1); not read"
    return f"W&B transaction log of an unknown version ({head[6]}; version 0 is read); not read"


@dataclass
class Records:
    """The complete records of a piece of the file, in file order."""

    data: np.ndarray
    """The bytes read (uint8), then the records that were cut into several chunks, joined, with PAD
    zero bytes before and after (the spans below count them)."""
    starts: np.ndarray
    ends: np.ndarray
    offsets: np.ndarray
    """File offset of each record's first chunk (for problems that name one)."""
    consumed: int
    """The file offset the next read starts at: past the last complete record (or damage)."""
    skipping: bool = False
    """`consumed` is inside a damaged block: the next read starts at the block after it."""
    cut: int | None = None
    """File offset of a record cut off by the end of what was read (more bytes would complete it)."""
    problems: list[Problem] = field(default_factory=list)
    wanted: np.ndarray | None = None
    """Per record: one the reader said it decodes (`needed`); the others' checksums were not checked."""


@dataclass
class _Chunks:
    pos: np.ndarray
    """Relative to the buffer, like everything here."""
    length: np.ndarray
    kind: np.ndarray
    block: np.ndarray
    block_start: np.ndarray
    """Per block of the buffer: where it starts (negative for the first, begun before the buffer)."""
    damaged: dict[int, int]
    """Block -> where its damage starts."""
    cut: int | None
    """Where a chunk runs past the end of the buffer."""
    padded: list[int] = field(default_factory=list)
    """Where a block's rest is zeros (padding, nothing to read)."""
    wanted: np.ndarray | None = None
    """Per chunk: its record is one the reader decodes (Needed); None: all are."""


def _u16(arr: np.ndarray, at: np.ndarray) -> np.ndarray:
    return arr[at].astype(np.int64) | (arr[at + 1].astype(np.int64) << 8)


@dataclass
class _Found:
    pos: list[np.ndarray] = field(default_factory=list)
    block: list[np.ndarray] = field(default_factory=list)
    damaged: dict[int, int] = field(default_factory=dict)
    cuts: list[int] = field(default_factory=list)
    padded: list[int] = field(default_factory=list)


def _walk(arr: np.ndarray, base: int, *, skipping: bool, final: bool) -> _Chunks:
    """Every chunk header of the buffer (file bytes from `base`): the blocks it holds whole side
    by side, the one it ends inside (a growing file's last) chunk by chunk."""
    n = arr.size
    block_abs = np.arange(base // BLOCK, (base + n - 1) // BLOCK + 1, dtype=np.int64) * BLOCK
    start = np.maximum(block_abs - base, 0)
    if block_abs[0] == 0:
        start[0] = max(int(start[0]), len(FILE_HEADER) - base)
    block_end = block_abs + BLOCK - base
    if skipping and base % BLOCK:
        start[0] = block_end[0]  # the rest of a damaged block
    out = _Found()
    whole = block_end <= n
    _walk_whole(arr, np.flatnonzero(whole), start, block_end, out)
    if not whole[-1]:
        _walk_last(arr, block_abs.size - 1, int(start[-1]), int(block_end[-1]), final=final, out=out)
    pos = np.concatenate(out.pos) if out.pos else np.zeros(0, dtype=np.int64)
    block = np.concatenate(out.block) if out.block else np.zeros(0, dtype=np.int64)
    order = np.argsort(pos, kind="stable")
    pos, block = pos[order], block[order]
    return _Chunks(
        pos, _u16(arr, pos + 4), arr[pos + 6].astype(np.int64), block, block_start=block_abs - base, damaged=out.damaged,
        cut=min(out.cuts) if out.cuts else None, padded=out.padded,
    )


def _walk_whole(arr: np.ndarray, blocks: np.ndarray, start: np.ndarray, block_end: np.ndarray, out: _Found) -> None:
    """Whole blocks, one chunk of each per round: a round is a dozen array operations whatever the
    number of blocks, and the rare odd header (padding, damage) is looked at on its own."""
    live = blocks[block_end[blocks] - start[blocks] >= CHUNK_HEADER]  # (fewer bytes left: the block's padding)
    p, end = start[live], block_end[live]
    while live.size:
        stop = p + CHUNK_HEADER + _u16(arr, p + 4)
        ok = ((arr[p + 6] - np.uint8(1)) < 4) & (stop <= end)
        if not ok.all():
            for b, at, e in zip(live[~ok].tolist(), p[~ok].tolist(), end[~ok].tolist()):
                if arr[at:e].any():
                    out.damaged[b] = at
                else:
                    out.padded.append(at)
            live, p, stop, end = live[ok], p[ok], stop[ok], end[ok]
        out.pos.append(p)
        out.block.append(live)
        going = end - stop >= CHUNK_HEADER
        if going.all():
            p = stop
        else:
            live, p, end = live[going], stop[going], end[going]


def _walk_last(arr: np.ndarray, block: int, at: int, end: int, *, final: bool, out: _Found) -> None:
    """The block the buffer ends inside, chunk by chunk: a chunk the buffer ends inside is cut (the
    next read has it whole); a header of zeros there is a write not landed yet (file systems that
    show a hole as zeros), unless the file is final."""
    n = arr.size
    found: list[int] = []
    while end - at >= CHUNK_HEADER:
        if at + CHUNK_HEADER > n:
            if at < n:
                out.cuts.append(at)
            break
        length, kind = int(arr[at + 4]) | int(arr[at + 5]) << 8, int(arr[at + 6])
        stop = at + CHUNK_HEADER + length
        if kind == 0 and length == 0 and not arr[at : at + 4].any():
            if arr[at:n].any():
                out.damaged[block] = at
            elif not final:
                out.cuts.append(at)
            else:
                out.padded.append(at)
            break
        if not FULL <= kind <= LAST or stop > end:
            out.damaged[block] = at
            break
        if stop > n:
            out.cuts.append(at)
            break
        found.append(at)
        at = stop
    out.pos.append(np.asarray(found, dtype=np.int64))
    out.block.append(np.full(len(found), block, dtype=np.int64))


Needed = Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]
"""Given the buffer and the data spans of its FULL chunks, which of them the reader will decode:
only those (and every chunk of a record cut into several) are checksummed. A checksum is a Python
call per chunk, a third of a read; damage in a record nobody reads costs nothing, and damage
that breaks the framing shows in the chunk headers after it, which are all checked."""


def _checksums(buf: memoryview, arr: np.ndarray, ch: _Chunks, *, final: bool, needed: Needed | None) -> None:
    """Marks the blocks of chunks whose checksum is wrong damaged from there on. The last chunk of
    a growing file may be a write caught half done: not yet, unless the file is final."""
    if not ch.pos.size:
        return
    check = np.arange(ch.pos.size)
    if needed is not None:
        full = ch.kind == FULL
        wanted = ~full
        wanted[full] = needed(arr, ch.pos[full] + CHUNK_HEADER, ch.pos[full] + CHUNK_HEADER + ch.length[full])
        ch.wanted = wanted.copy()
        wanted[-1] = True  # (the last: a write caught half done is seen by its checksum)
        check = np.flatnonzero(wanted)
    pos = ch.pos[check]
    view = memoryview(buf)
    starts, stops = (pos + 6).tolist(), (pos + CHUNK_HEADER + ch.length[check]).tolist()
    computed = np.fromiter((zlib.crc32(view[a:b]) for a, b in zip(starts, stops)), dtype=np.uint32, count=len(starts))
    stored = (_u16(arr, pos) | (_u16(arr, pos + 2) << 16)).astype(np.uint32)
    for k in np.flatnonzero(computed != stored).tolist():
        i = int(check[k])
        if not final and stops[k] == arr.size:
            ch.cut = int(ch.pos[i]) if ch.cut is None else min(ch.cut, int(ch.pos[i]))
        else:
            b = int(ch.block[i])
            ch.damaged[b] = min(ch.damaged.get(b, stops[k]), int(ch.pos[i]))


def _follows(ch: _Chunks, j: int, i: int) -> bool:
    """Chunk i continues chunk j's record: the next chunk, right after it or at the next block's start."""
    if i != j + 1:
        return False
    end = int(ch.pos[j] + CHUNK_HEADER + ch.length[j])
    if ch.pos[i] == end:
        return True
    b = int(ch.block[j])
    return int(ch.block[i]) == b + 1 and ch.pos[i] == ch.block_start[b + 1] and ch.block_start[b] + BLOCK - end < CHUNK_HEADER


@dataclass
class _Joined:
    """Records cut into several chunks, put back together."""

    data: bytearray = field(default_factory=bytearray)
    first: list[int] = field(default_factory=list)
    starts: list[int] = field(default_factory=list)
    last_end: int = -1
    broken: list[int] = field(default_factory=list)
    """Where fragments with no start or no end are (damage the checksums did not show)."""
    pending: int | None = None
    """Where a record the buffer ends inside starts."""
    lost_end: int = -1
    """The end of the last fragment passed over as a damaged record's."""
    lost_open: bool = False
    """... and it was a MIDDLE: the record's fragments go on in the next block."""


def _join(buf: memoryview, ch: _Chunks, skipping: bool) -> _Joined:
    """FIRST, MIDDLE..., LAST chunks joined into records (a few per block: no array work needed)."""
    out = _Joined()
    held: list[int] = []
    lost = -2
    """The block of the last fragment of a record damage cut: its fragments in the blocks after it
    are passed over, as LevelDB's reader resyncs, not each counted as more damage."""
    for i in np.flatnonzero(ch.kind != FULL).tolist():
        kind = int(ch.kind[i])
        if held and not _follows(ch, held[-1], i):
            if not _cut_by_damage(ch, held[-1]):
                out.broken.append(int(ch.pos[held[0]]))
            held = []
        b = int(ch.block[i])
        if kind == FIRST:
            held = [i]
        elif (b == lost + 1 and ch.pos[i] == ch.block_start[b]) or (not held and _after_damage(ch, i, skipping)):
            held, lost = [], (b if kind == MIDDLE else -2)
            out.lost_end, out.lost_open = int(ch.pos[i] + CHUNK_HEADER + ch.length[i]), kind == MIDDLE
        elif held:
            held.append(i)
            if kind == LAST:
                out.first.append(int(ch.pos[held[0]]))
                out.starts.append(len(out.data))
                for k in held:
                    a = int(ch.pos[k]) + CHUNK_HEADER
                    out.data += buf[a : a + int(ch.length[k])]
                out.last_end = max(out.last_end, int(ch.pos[i] + CHUNK_HEADER + ch.length[i]))
                held = []
        else:
            out.broken.append(int(ch.pos[i]))
    if held:
        out.pending = int(ch.pos[held[0]])
    return out


def _cut_by_damage(ch: _Chunks, j: int) -> bool:
    """The record chunk j belongs to was cut by damage (in its block, or at the next block's start)."""
    b = int(ch.block[j])
    return b in ch.damaged or (b + 1) in ch.damaged


def _after_damage(ch: _Chunks, i: int, skipping: bool) -> bool:
    """A fragment at a block's start whose record began in a damaged block (or one skipped)."""
    b = int(ch.block[i])
    after_skip = skipping and b == (1 if ch.block_start[0] < 0 else 0)
    return ch.pos[i] == ch.block_start[b] and ((b - 1) in ch.damaged or after_skip)


@dataclass(frozen=True)
class Padded:
    """File bytes read in place, `room[PAD : PAD + size]`, into a buffer with PAD zero bytes before
    them and room after for the records `frame` joins from chunks: the chunk's megabytes are not
    copied again (a copy costs ~2 ms a 4 MiB chunk, most of it touching new pages)."""

    room: np.ndarray
    size: int


def read_padded(fh: BinaryIO, size: int) -> Padded:
    """Up to `size` bytes of `fh` from where it is, for `frame`. The room after them is as large as
    they are (the joined records are no larger): its pages are never touched unless used."""
    room = np.empty(2 * (PAD + size), dtype=np.uint8)
    room[:PAD] = 0
    return Padded(room, fh.readinto(memoryview(room)[PAD : PAD + size]) or 0)


def frame(buf: bytes | Padded, *, base: int, skipping: bool = False, final: bool, source: str, needed: Needed | None = None) -> Records:
    """The complete records of `buf`, the file's bytes from offset `base` (a record boundary, or
    inside a damaged block when `skipping`); base 0 starts past the file header (checked apart)."""
    if isinstance(buf, Padded):
        room, arr = buf.room, buf.room[PAD : PAD + buf.size]
    else:
        room, arr = None, np.frombuffer(buf, dtype=np.uint8)
    buf = memoryview(arr)
    if not arr.size:
        return Records(np.zeros(2 * PAD, dtype=np.uint8), *(np.zeros(0, dtype=np.int64),) * 3, consumed=base, skipping=skipping)
    ch = _walk(arr, base, skipping=skipping, final=final)
    _checksums(buf, arr, ch, final=final, needed=needed)
    if ch.damaged:
        start_of = np.full(ch.block_start.size, arr.size + 1, dtype=np.int64)
        for b, at in ch.damaged.items():
            start_of[b] = at
        keep = ch.pos < start_of[ch.block]
        wanted = ch.wanted[keep] if ch.wanted is not None else None
        ch = _Chunks(ch.pos[keep], ch.length[keep], ch.kind[keep], ch.block[keep], ch.block_start, ch.damaged, ch.cut, ch.padded, wanted)
    joined = _join(buf, ch, skipping)
    full = np.flatnonzero(ch.kind == FULL)
    starts = np.concatenate([ch.pos[full] + CHUNK_HEADER, arr.size + np.asarray(joined.starts, dtype=np.int64)])
    ends = np.concatenate([ch.pos[full] + CHUNK_HEADER + ch.length[full], arr.size + np.asarray([*joined.starts[1:], len(joined.data)], dtype=np.int64)])
    firsts = np.concatenate([ch.pos[full], np.asarray(joined.first, dtype=np.int64)])
    wanted = np.concatenate([ch.wanted[full] if ch.wanted is not None else np.ones(full.size, dtype=bool), np.ones(len(joined.first), dtype=bool)])
    order = np.argsort(firsts, kind="stable")
    data = _padded(arr, joined.data, room)
    consumed, still = _consumed(ch, joined, full, base, arr.size, skipping)
    cut = min(c for c in (ch.cut, joined.pending) if c is not None) if (ch.cut is not None or joined.pending is not None) else None
    problems = []
    damage = sorted([*ch.damaged.values(), *joined.broken])
    if damage:
        problems.append(damage_problem(source, len(damage), base + damage[0]))
    return Records(
        data, PAD + starts[order], PAD + ends[order], base + firsts[order], consumed=consumed, skipping=still, cut=None if cut is None else base + cut,
        problems=problems, wanted=wanted[order],
    )


def damage_problem(source: str, count: int, offset: int) -> Problem:
    """What damage costs, said once a read: the rest of the damaged chunk's block (with the record
    it was part of), never the blocks after it."""
    return Problem(
        source, f"{count} damaged chunk(s) in this W&B log (a bad checksum, length or type); the rest of each one's 32 KiB block is skipped, the blocks after it are read",
        offset=offset,
    )


def _padded(arr: np.ndarray, joined: bytearray, room: np.ndarray | None) -> np.ndarray:
    """Records.data: PAD zeros, the bytes read, the joined records, PAD zeros; in `room` (where
    the bytes read already are: read_padded) when it is given."""
    n, extra = arr.size, len(joined)
    if room is None or 2 * PAD + n + extra > room.size:
        pad = np.zeros(PAD, dtype=np.uint8)
        return np.concatenate([pad, arr, np.frombuffer(bytes(joined), dtype=np.uint8), pad])
    room[PAD + n : PAD + n + extra] = np.frombuffer(joined, dtype=np.uint8)
    room[PAD + n + extra : 2 * PAD + n + extra] = 0
    return room[: 2 * PAD + n + extra]


def _consumed(ch: _Chunks, joined: _Joined, full: np.ndarray, base: int, n: int, skipping: bool) -> tuple[int, bool]:
    """Where the next read starts: past the last complete record and past damage, never inside a
    record still to come; and whether that is inside, or at the end of, a damaged block (the
    fragments the next read meets first are then its records', no further damage)."""
    at = max(0, len(FILE_HEADER) - base)
    ends = [int(ch.block_start[b]) + BLOCK for b in ch.damaged]
    if skipping:
        ends.append(int(ch.block_start[0]) + BLOCK if base % BLOCK else 0)
    if full.size:
        at = max(at, int(ch.pos[full[-1]] + CHUNK_HEADER + ch.length[full[-1]]))
    at = max(at, joined.last_end, joined.lost_end, *(min(end, n) for end in ends))
    # Past a block's padding when it was read whole: a file ending at a block's end ends there.
    left = BLOCK - (base + at) % BLOCK
    if (left < CHUNK_HEADER or at in ch.padded) and at + left <= n:
        at += left
    return base + at, any(end - BLOCK < at <= end for end in ends) or (joined.lost_open and at <= joined.lost_end + CHUNK_HEADER)

