"""Complete lines of a (possibly growing) text file, from a byte offset, in bounded blocks.

The offset only ever moves past a newline: a half-written last line is left for the next call, except
on a final read (a one-shot scan of a finished file), where the last unterminated line counts.
A line longer than MAX_LINE is skipped with one warning instead of being buffered without bound.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from ..cursor import Cursor
from ..problems import Problem

BLOCK = 32 << 20
STREAMED_BLOCK = 8 << 20
"""Blocks of a read whose rows are handed out as each block is read (`lossguard read`): one block's
text, lines and table are then all the memory it holds, and polars' ~1 ms a call is nothing at 8 MB."""
MAX_LINE = 16 << 20
BEHIND = 16
"""Bytes before the offset a cursor keeps (Cursor.behind), to tell a file rewritten in place."""


@dataclass(frozen=True)
class TextBlock:
    data: bytes
    """Complete lines, each ending in a newline (undecoded: the parsers decode in bulk)."""
    first_line: int
    """1-based number of the block's first line in the file."""
    cursor: Cursor
    """Where reading continues after this block."""

    @property
    def newlines(self) -> int:
        """How many newlines `data` holds (one a line), as counted to number the lines."""
        return self.cursor.line - self.first_line + 1


def not_utf8(data: bytes, *, first_line: int, source: str) -> Problem | None:
    """The problem to report for bytes that are not UTF-8 (they are read as U+FFFD), naming the line."""
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = first_line + data.count(b"\n", 0, exc.start)
        return Problem(source, "bytes that are not UTF-8 (replaced; the rest of the file is still read)", line=line)
    return None


def iter_blocks(
    path: Path, cursor: Cursor, *, final: bool, problems: list[Problem], block: int | None = None, max_line: int | None = None,
    limit: int | None = None, carriage: bool = False,
) -> Iterator[TextBlock]:
    """Blocks of whole lines from the cursor on; with `limit`, no more than `limit` bytes (the
    daemon reads a long history a bounded piece per pass, and history apart from what came after
    its first start): the whole lines within it, or, when not one fits, the one line that goes
    over it. With `carriage`, a carriage return ends a record too: a progress bar redraws one line,
    and each redraw is complete at its \r (a block may then end inside a line: lines are still
    numbered by their newlines, so the rest of it, in the next block, has the same number).

    Reads stop at the size the file had when it was opened: a writer appending while the blocks
    are parsed would otherwise be chased a few lines at a time, each paying a whole parse (what is
    written meanwhile is the next pass's, which its inotify event or the next poll starts)."""
    source = str(path)
    # The module's sizes, looked up at the call; BLOCK caps every read's blocks (a test reads a file
    # in many blocks by setting it).
    block, max_line = min(block or BLOCK, BLOCK), max_line or MAX_LINE
    block = min(block, limit) if limit else block
    offset, line, skipping = cursor.offset, cursor.line, cursor.skipping
    last = cursor
    with open(path, "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        end = size if limit is None else min(size, cursor.offset + limit)
        over = False
        fh.seek(offset)
        carry = b""
        while True:
            data = fh.read(min(block, end - fh.tell())) if fh.tell() < end else b""
            if not data:
                if end < size and offset == cursor.offset and not over:
                    end, over = size, True  # not one whole line within the limit: the one across it
                    continue
                break
            buf = carry + data if carry else data
            carry = b""
            if skipping:
                nl = _first_break(buf, carriage)
                if nl < 0:
                    offset += len(buf)
                    continue
                offset += nl + 1
                line += buf[nl] == 0x0A
                buf = buf[nl + 1 :]
                skipping = False
            cut = _first_break(buf, carriage) if over else _last_break(buf, carriage)
            if cut < 0:
                if len(buf) > max_line:
                    problems.append(Problem(source, f"line longer than {max_line >> 20} MiB skipped", line=line + 1))
                    offset += len(buf)
                    skipping = True
                else:
                    carry = buf
                continue
            # The part line after the cut is read again with what follows it (seeking back costs
            # less than copying the block onto it).
            tail = len(buf) - cut - 1
            complete = buf[: cut + 1] if tail else buf
            offset += len(complete)
            first = line + 1
            line += complete.count(b"\n")
            last = cursor.advance(offset=offset, line=line, skipping=False, behind=complete[-BEHIND:].hex())
            yield TextBlock(complete, first, last)
            if limit is not None and offset - cursor.offset >= limit:
                return
            if tail > max_line:
                problems.append(Problem(source, f"line longer than {max_line >> 20} MiB skipped", line=line + 1))
                offset += tail
                skipping = True
            elif tail:
                fh.seek(-tail, os.SEEK_CUR)
    if final and carry and not skipping:
        offset += len(carry)
        line += 1
        yield TextBlock(carry + b"\n", line, cursor.advance(offset=offset, line=line, skipping=False, behind=carry[-BEHIND:].hex()))
    elif (offset, skipping) != (last.offset, last.skipping):
        # No more lines, but an over-long line was skipped past: report where reading stands.
        yield TextBlock(b"", line + 1, cursor.advance(offset=offset, line=line, skipping=skipping, behind=None))


def _first_break(buf: bytes, carriage: bool) -> int:
    """Where the first record of `buf` ends (its newline, or with `carriage` a carriage return); -1: none."""
    nl = buf.find(b"\n")
    if not carriage:
        return nl
    cr = buf.find(b"\r", 0, nl if nl >= 0 else len(buf))
    return cr if cr >= 0 else nl


def _last_break(buf: bytes, carriage: bool) -> int:
    """Where the last complete record of `buf` ends; -1: none."""
    nl = buf.rfind(b"\n")
    return max(nl, buf.rfind(b"\r", nl + 1)) if carriage else nl
