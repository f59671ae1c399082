"""A W&B transaction log's bytes beyond what `wandb_log.frame` holds at once: the chunks of a
record longer than a read, followed and checked one at a time as the file grows (its bytes held
only once it is whole), and runs of zeros where records should be, jumped or looked at a megabyte
at a time."""

from __future__ import annotations

import os
import zlib
from dataclasses import dataclass
from typing import BinaryIO

from .wandb_log import BLOCK, CHUNK_HEADER, FIRST, FULL, LAST


MAX_RECORD = 256 << 20
"""The largest record read (its chunks' bytes in the file): a record is held whole to be decoded,
so a larger one (a step logging millions of keys, or a length field gone wrong) is passed over with
a problem naming it, and the records after it are read. wandb-core's own reader sets no bound."""


@dataclass(frozen=True)
class Pending:
    """How far the chunks of a record cut into several were followed (`scan_pending`)."""

    start: int
    """File offset of the record's FIRST chunk."""
    at: int
    """Where its next chunk starts (or, with `end`, the end of its LAST)."""
    end: int | None = None
    """The record is complete: the end of its LAST chunk."""
    damage: int | None = None
    """A chunk of it is damaged here (a bad checksum, length or type, or a chunk of another record):
    the record is lost, reading goes on at `at` (the next record's start, or the next block's)."""
    resyncing: bool = False
    """Past damage, and the bytes ran out among the lost record's own fragments: the next read
    starts at `at`, a block start, as one inside a damaged block does."""

    @property
    def size(self) -> int:
        """The bytes the record spans in the file so far (chunk headers and block trailers too)."""
        return (self.end if self.end is not None else self.at) - self.start


def scan_pending(fh: BinaryIO, pending: Pending, *, size: int, final: bool) -> Pending:
    """Follows a record's chunks from `pending.at` as far as the file's `size` bytes go, checking
    each (header, checksum) as `frame` does, holding one chunk's bytes at a time: a record longer
    than a read is checked once, as it grows, and assembled only when its LAST chunk has come (a
    record whose LAST never comes costs a growing file's reader one look per read, not a re-read
    of all its chunks). As in LevelDB's reader, damage loses the record, and its fragments after
    the damage are passed over up to the next record's first chunk."""
    at, start = pending.at, pending.start
    damage = pending.damage
    while True:
        left = BLOCK - at % BLOCK
        if left < CHUNK_HEADER:  # (a block's trailer: zeros)
            at += left
            continue
        if at + CHUNK_HEADER > size:
            break
        fh.seek(at)
        head = fh.read(CHUNK_HEADER)
        if len(head) < CHUNK_HEADER:
            break
        length, kind = int.from_bytes(head[4:6], "little"), head[6]
        stop = at + CHUNK_HEADER + length
        if head == bytes(CHUNK_HEADER) and (not final or zeros_end(fh, at, size) == size):
            break  # (a write not landed yet, file systems showing a hole as zeros; or the file's end)
        if damage is not None:
            # Past damage: the lost record's MIDDLE and LAST chunks are passed over (a block at a
            # time: a header that makes no sense there is more of the damage).
            if kind in (FULL, FIRST) and stop <= at + left:
                return Pending(at, at, damage=damage)
            if kind == LAST and stop <= at + left:
                if stop > size:
                    break
                return Pending(stop, stop, damage=damage)
            at += left
            if at >= size:
                break
            continue
        if not FULL <= kind <= LAST or stop > at + left or (kind in (FULL, FIRST)) != (at == start):
            damage = at
            at += left
            continue
        if stop > size:
            break
        crc = zlib.crc32(head[6:7])
        crc = zlib.crc32(fh.read(length), crc)
        if crc != int.from_bytes(head[:4], "little"):
            if not final and stop == size:
                break  # (the last chunk of a growing file: a write caught half done)
            damage = at
            at += left
            continue
        if kind in (FULL, LAST):
            return Pending(start, at, end=stop)
        at = stop
    if damage is not None:
        return Pending(at, at, damage=damage, resyncing=True)
    return Pending(start, at)


STRIDE = 1 << 20
"""Bytes of a run of zeros looked at a time (`zeros_end`)."""


def zeros_end(fh: BinaryIO, at: int, end: int) -> int:
    """Where the run of zero bytes at `at` ends (the first byte that is not zero, or `end`): holes
    of a sparse file are jumped at once (SEEK_DATA), written zeros looked at a megabyte at a time
    (a stretch of zeros is no record: a file extended by truncate, or blocks a crash left unwritten
    on some file systems, can hold gigabytes of them)."""
    fd = fh.fileno()
    while at < end:
        try:
            data = os.lseek(fd, at, os.SEEK_DATA) if hasattr(os, "SEEK_DATA") else at
        except OSError:
            return end  # (ENXIO: nothing but a hole from here to the file's end)
        at = min(max(at, data), end)
        if at >= end:
            return end
        fh.seek(at)
        got = fh.read(min(STRIDE, end - at))
        if not got:
            return at
        rest = got.lstrip(b"\0")
        if rest:
            return at + len(got) - len(rest)
        at += len(got)
    return end
