"""TFRecord framing (the container of TensorBoard event files), CRC-checked, from a byte offset.

    uint64 length | uint32 masked_crc32c(length) | data[length] | uint32 masked_crc32c(data)

The loop here only finds record boundaries and computes CRCs (in C, via the crc32c package); the
masking and comparison are done afterwards for all records at once in numpy. A record cut off at the
end of a growing file is not an error: the end offset stops before it and the next call resumes there.
A bad length CRC means the framing can not be trusted past that point: the file is declared dead
(reported once, not reopened in a loop). A bad data CRC costs only that record.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

import crc32c as _crc32c
import numpy as np

from ..problems import Problem

_HEADER = struct.Struct("<QI")
_FOOTER = struct.Struct("<I")
_MASK_DELTA = 0xA282EAD8


def masked_crc(data: bytes) -> int:
    crc = _crc32c.crc32c(data)
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


def _mask(crcs: np.ndarray) -> np.ndarray:
    crcs = crcs.astype(np.uint64)
    return ((((crcs >> np.uint64(15)) | (crcs << np.uint64(17))) + np.uint64(_MASK_DELTA)) & np.uint64(0xFFFFFFFF)).astype(
        np.uint32
    )


@dataclass
class Framing:
    starts: np.ndarray
    """Offsets (within the buffer) of each good record's data."""
    lengths: np.ndarray
    consumed: int
    """Bytes of the buffer that held complete records (good or skipped)."""
    problems: list[Problem] = field(default_factory=list)
    dead: bool = False
    need: int = 0
    """When no record fits in the buffer: the bytes the next record needs."""


def frame(buf: bytes, *, base_offset: int, source: str) -> Framing:
    n = len(buf)
    view = memoryview(buf)
    crc = _crc32c.crc32c
    unpack_header = _HEADER.unpack_from
    unpack_footer = _FOOTER.unpack_from
    starts: list[int] = []
    lengths: list[int] = []
    header_crcs: list[int] = []
    header_want: list[int] = []
    data_crcs: list[int] = []
    data_want: list[int] = []
    pos = 0
    need = 0
    while pos + 12 <= n:
        length, want = unpack_header(buf, pos)
        start = pos + 12
        end = start + length + 4
        if end > n:
            # Cut off, or a corrupt length: only the header CRC can tell which.
            header_crcs.append(crc(view[pos : pos + 8]))
            header_want.append(want)
            need = end - pos
            break
        header_crcs.append(crc(view[pos : pos + 8]))
        header_want.append(want)
        data_crcs.append(crc(view[start : end - 4]))
        data_want.append(unpack_footer(buf, end - 4)[0])
        starts.append(start)
        lengths.append(length)
        pos = end
    problems: list[Problem] = []
    header_ok = _mask(np.asarray(header_crcs, dtype=np.uint64)) == np.asarray(header_want, dtype=np.uint32)
    dead = False
    complete = len(starts)
    if header_crcs and not header_ok.all():
        first_bad = int(np.argmin(header_ok))
        offset = base_offset + (starts[first_bad] - 12 if first_bad < complete else pos)
        problems.append(Problem(source, "corrupt event record (length checksum mismatch); the rest of the file is not read", offset=offset))
        dead = True
        complete = min(complete, first_bad)
        pos = starts[complete] - 12 if complete < len(starts) else pos
        need = 0
    starts_a = np.asarray(starts[:complete], dtype=np.int64)
    lengths_a = np.asarray(lengths[:complete], dtype=np.int64)
    data_ok = _mask(np.asarray(data_crcs[:complete], dtype=np.uint64)) == np.asarray(data_want[:complete], dtype=np.uint32)
    if not data_ok.all():
        bad = np.flatnonzero(~data_ok)
        problems.append(
            Problem(
                source,
                f"{bad.size} event record(s) with a bad data checksum skipped (first at byte {base_offset + int(starts_a[bad[0]]) - 12})",
                offset=base_offset + int(starts_a[bad[0]]) - 12,
            )
        )
        starts_a, lengths_a = starts_a[data_ok], lengths_a[data_ok]
    return Framing(starts_a, lengths_a, pos, problems, dead, need)
