"""What a read of a W&B transaction log (formats/wandb.py) waits on or passes over, beside the
records it frames a chunk at a time: a record cut into more chunks than a read holds (followed
chunk by chunk, remembered in the cursor, up to MAX_RECORD), and runs of zeros where records should
be (a sparse tail of gigabytes is jumped, not read)."""

from __future__ import annotations

from typing import BinaryIO

import numpy as np

from ..cursor import Cursor
from ..problems import Problem
from ..sources.wandb_follow import MAX_RECORD, Pending, scan_pending, zeros_end
from ..sources.wandb_log import BLOCK, CHUNK_HEADER, PAD, Needed, Padded, Records, damage_problem, frame, read_padded


def on_pending(
    fh: BinaryIO, cursor: Cursor, pending: Pending, *, size: int, final: bool, source: str, problems: list[Problem], needed: Needed
) -> tuple[Records | None, Cursor]:
    """A record cut into chunks at the cursor, followed as far as `size` (scan_pending): once whole
    (and no larger than MAX_RECORD), its bytes framed (the records to decode, the cursor as it
    was); else none, and the cursor after it: still at its start, knowing how far its chunks were
    checked, or past it (too large, or damaged: said in `problems`)."""
    got = scan_pending(fh, pending, size=size, final=final)
    if got.damage is not None:
        problems.append(damage_problem(source, 1, got.damage))
        return None, cursor.advance(offset=got.at, skipping=got.resyncing, scanned=None)
    if got.end is None:
        return None, cursor.advance(scanned=got.at if got.at > got.start else None)
    if got.size > MAX_RECORD:
        problems.append(Problem(
            source, f"a record of {got.size / (1 << 20):,.1f} MiB, over the {MAX_RECORD >> 20} MiB a W&B record may have here: passed over, the records after it are read",
            offset=got.start,
        ))
        return None, cursor.advance(offset=got.end, skipping=False, scanned=None)
    fh.seek(got.start)
    return frame(read_padded(fh, got.end - got.start), base=got.start, skipping=cursor.skipping, final=final and got.end == size, source=source, needed=needed), cursor


def past_zeros(fh: BinaryIO, cursor: Cursor, *, size: int, final: bool, source: str) -> tuple[Cursor, list[Problem]] | None:
    """The cursor past a run of zeros where a chunk should start (None: it ends in the cursor's
    block, which `frame` reads: damage, or padding). Zeros hold no record: reading goes on at the
    block their run ends in, or at the file's end; a growing file's last block stays unread (the
    zeros there may be a write not landed yet), and the run is said when it ends (Cursor.zeros)."""
    nonzero = zeros_end(fh, cursor.offset, size)
    target = nonzero // BLOCK * BLOCK if nonzero < size or not final else size
    if target <= cursor.offset:
        return None
    began = cursor.zeros if cursor.zeros is not None else cursor.offset
    if nonzero == size and not final:
        return cursor.advance(offset=target, skipping=False, scanned=None, zeros=began), []
    return cursor.advance(offset=target, skipping=False, scanned=None, zeros=None), zeros_said(began, target, source)


def zero_block(got: Padded, offset: int) -> int | None:
    """The first block after the first of `got` (file bytes from `offset`) that starts with a
    chunk header of zeros: a run of zeros, which `past_zeros` passes over and says, not `frame`."""
    first = -(-offset // BLOCK) * BLOCK if offset % BLOCK else offset + BLOCK
    starts = np.arange(first - offset, got.size - CHUNK_HEADER + 1, BLOCK)
    if not starts.size:
        return None
    heads = got.room[PAD + starts[:, None] + np.arange(CHUNK_HEADER)]
    zero = np.flatnonzero(~heads.any(axis=1))
    return offset + int(starts[zero[0]]) if zero.size else None


def zeros_said(began: int, end: int, source: str) -> list[Problem]:
    """The warning for zeros from `began` to `end`, where they fill a block or more, counted from
    the first block they fill (the rest of a block after a record is its padding, LevelDB's own):
    the same words however many reads the run took."""
    whole = -(-began // BLOCK) * BLOCK
    if end - whole < BLOCK:
        return []
    return [Problem(
        source, f"{end - whole:,} bytes of zeros in this W&B log, no record in them (a file extended with zeros, or blocks never written): passed over",
        offset=whole,
    )]
