"""Which format a file is in: by name where the name is conclusive, else by what its head holds.
What each format looks like is declared in its own module (`formats.FORMATS`); here is only the
looking. Sniffing looks further than the first screen because Megatron and friends print pages of
arguments and banners before the first iteration line."""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Callable, Sequence
from fnmatch import fnmatch
from pathlib import Path

from . import FORMATS
from ..sources import sqlite_db
from .base import ANSI, BINARY_LINE, Format
from .custom import LineFormatSpec

HEAD = 256 << 10
DEEP = 8 << 20


LAYOUTS = {fmt.layout.folder: fmt for fmt in FORMATS if fmt.layout is not None}
"""The formats whose files sit in a tracker's folder of their own, by that folder's name."""
RENAMED = tuple(fmt for fmt in FORMATS if fmt.layout is not None and fmt.layout.renamed is not None)
"""The formats whose tracker folder is also known under another name (Layout.renamed)."""


def tracked(path: str) -> tuple[Format, tuple[str, ...]] | None:
    """The format whose tracker folder holds `path` (the nearest such folder above it), and the
    parts of the path below that folder; None for a path in no tracker's folder. Asked of every
    file a walk lists: a few dict lookups."""
    if not LAYOUTS:
        return None
    parts = path.replace(os.sep, "/").split("/")
    for i in range(len(parts) - 2, -1, -1):
        fmt = LAYOUTS.get(parts[i])
        if fmt is not None and (fmt.layout.own is None or fmt.layout.own(parts[i + 1])):  # type: ignore[union-attr]
            return fmt, tuple(parts[i + 1 :])
    for fmt in RENAMED:
        assert fmt.layout is not None and fmt.layout.renamed is not None
        at = fmt.layout.renamed(parts)
        if at is not None:
            return fmt, tuple(parts[at + 1 :])
    return None


def _layout_format(path: str) -> tuple[bool, Format | None]:
    """Whether `path` sits in a tracker's folder, and if so the format reading it (None: a file of
    that folder that is not a log)."""
    found = tracked(path)
    if found is None:
        return False, None
    fmt, below = found
    assert fmt.layout is not None
    return True, fmt if fmt.layout.logs(below) else None


def in_layout(path: str) -> tuple[bool, str | None]:
    """_layout_format, the format by its name."""
    inside, fmt = _layout_format(path)
    return inside, None if fmt is None else fmt.name


def may_name_runs(path: Path) -> bool:
    """Whether the file's format, as its place or name settles it, names its rows' runs (a file
    whose format only its content tells is taken not to)."""
    held = _layout_format(str(path))[1]
    if held is not None:
        return held.names_runs
    if path.name.lower().endswith(sqlite_db.SUFFIXES):
        return True  # (a database's content says whose it is, and trackers' databases hold many runs)
    return any(fmt.names_runs and fmt.claims_name(path.name) for fmt in FORMATS)


def by_name(name: str) -> str | None:
    """The format a file name settles, whatever the file holds."""
    for fmt in FORMATS:
        if fmt.claims_name(name):
            return fmt.name
    return None


def _read_head(path: Path, size: int) -> bytes:
    with open(path, "rb") as fh:
        return fh.read(size)


_ANSI = re.compile(ANSI)
_BINARY = re.compile(BINARY_LINE)
_NOT_BINARY = bytes(b for b in range(256) if not _BINARY.match(chr(b)) or b >= 0x80)
"""Every byte but those BINARY_LINE names: deleting them leaves a head's binary bytes."""


def _text_lines(data: bytes) -> tuple[list[str], int]:
    """The lines of a file's head that are text, and how many lines (cut at newlines, as the readers
    cut them) are binary (base.BINARY_LINE: NUL...). Text lines are then cut as sniffing always cut
    them, at any line break (a tqdm bar's \r too)."""
    decoded = data.decode("utf-8", errors="replace")
    if "\x1b" in decoded:
        decoded = _ANSI.sub("", decoded)
    # The usual case, no binary byte in the head at all, is settled on the bytes in one C loop (the
    # class is ASCII, which UTF-8 writes as itself; a byte is on one line, so no line has one).
    if not data.translate(None, _NOT_BINARY):
        return decoded.splitlines(), 0
    cut = decoded.split("\n")
    text = [line for line in cut if not _BINARY.search(line)]
    return "\n".join(text).splitlines(), len(cut) - len(text)


def by_database(path: Path) -> str | None:
    """The format of a SQLite database, by its tables; None for a database no tracker wrote (an
    application's, lossguard's own state): passed over in silence, never read as lines. None too
    for one whose tables can not be read now (locked: reader.unrecognised says so)."""
    found, damage = sqlite_db.tables_or_damage(path)
    if damage is not None and damage.dead:
        # A damaged database goes to the first database reader, whose open says what is wrong
        # (naming the file) and marks it dead: not passed over as some application's.
        return next(fmt.name for fmt in FORMATS if fmt.tables is not None)
    return next((fmt.name for fmt in FORMATS if fmt.tables is not None and found and fmt.tables <= found), None)


def by_content(path: Path, custom: Sequence[LineFormatSpec] = ()) -> str | None:
    data = _read_head(path, HEAD)
    if sqlite_db.is_database(data):
        return by_database(path)
    lines, binary = _text_lines(data)
    # A binary file (a checkpoint, an archive) is mostly lines of binary; a log that a crash left
    # a run of NULs in has a few such lines, and its text lines still say what it is (the reader
    # skips the others with a warning).
    if binary and binary >= sum(1 for line in lines if line):
        return None
    deep: Callable[[], bytes] = functools.cache(lambda: _read_head(path, DEEP))
    for fmt in FORMATS:
        if fmt.head is not None and fmt.head(path, deep):
            return fmt.name
    found = _count(lines, custom)
    if found is None and len(data) == HEAD:
        found = _count(_text_lines(deep())[0], custom)
    return found


def _count(lines: list[str], custom: Sequence[LineFormatSpec]) -> str | None:
    """The format claiming most lines: the user's own first (any line of theirs settles it), then
    the built-in ones, each line counting for the first format, in precedence, that claims it."""
    for spec in custom:
        if spec.files is None:
            pattern = re.compile(spec.pattern)
            if any(pattern.search(line) for line in lines):
                return spec.name
    tests = [(fmt.name, fmt.line) for fmt in FORMATS if fmt.line is not None]
    counts = dict.fromkeys((name for name, _ in tests), 0)
    for i, line in enumerate(lines, 1):
        for name, claims in tests:
            if claims(line):
                counts[name] += 1
                break
        if i % DECIDED_EVERY == 0 and _decided(counts, len(lines) - i):
            break
    best = max(counts, key=counts.__getitem__)  # the first of equals: precedence breaks a tie
    return best if counts[best] else None


DECIDED_EVERY = 32


def _decided(counts: dict[str, int], left: int) -> bool:
    """No other format can catch up with the leader in the `left` lines still to count (a log is
    mostly lines of one format: half its head settles it, and the count costs ~1 ms a file)."""
    ranked = sorted(counts.values(), reverse=True)
    return ranked[0] > ranked[1] + left


def format_of(path: Path, custom: Sequence[LineFormatSpec] = ()) -> str | None:
    """The name of the format `path` is in (the user's own formats first), or None."""
    for spec in custom:
        if spec.files is not None and fnmatch(path.name, spec.files):
            return spec.name
    fmt = in_layout(str(path))[1]
    if fmt is not None:
        return fmt  # (a file of a tracker's folder that is not its log, named by the user, is sniffed)
    return by_name(path.name) or by_content(path, custom)
