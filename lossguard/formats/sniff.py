"""Which format a file is in: by name where the name is conclusive, else by what its head holds.
What each format looks like is declared in its own module (`formats.FORMATS`); here is only the
looking. Sniffing looks further than the first screen because Megatron and friends print pages of
arguments and banners before the first iteration line."""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Sequence
from fnmatch import fnmatch
from pathlib import Path

from . import FORMATS
from .custom import LineFormatSpec

HEAD = 256 << 10
DEEP = 8 << 20


def by_name(name: str) -> str | None:
    """The format a file name settles, whatever the file holds."""
    for fmt in FORMATS:
        if fmt.claims_name(name):
            return fmt.name
    return None


def _read_head(path: Path, size: int) -> bytes:
    with open(path, "rb") as fh:
        return fh.read(size)


def by_content(path: Path, custom: Sequence[LineFormatSpec] = ()) -> str | None:
    data = _read_head(path, HEAD)
    if b"\x00" in data[:8192]:
        return None
    deep: Callable[[], bytes] = functools.cache(lambda: _read_head(path, DEEP))
    for fmt in FORMATS:
        if fmt.head is not None and fmt.head(path, deep):
            return fmt.name
    found = _count(data.decode("utf-8", errors="replace"), custom)
    if found is None and len(data) == HEAD:
        found = _count(deep().decode("utf-8", errors="replace"), custom)
    return found


def _count(text: str, custom: Sequence[LineFormatSpec]) -> str | None:
    """The format claiming most lines: the user's own first (any line of theirs settles it), then
    the built-in ones, each line counting for the first format, in precedence, that claims it."""
    lines = text.splitlines()
    for spec in custom:
        if spec.files is None:
            pattern = re.compile(spec.pattern)
            if any(pattern.search(line) for line in lines):
                return spec.name
    tests = [(fmt.name, fmt.line) for fmt in FORMATS if fmt.line is not None]
    counts = dict.fromkeys((name for name, _ in tests), 0)
    for line in lines:
        for name, claims in tests:
            if claims(line):
                counts[name] += 1
                break
    best = max(counts, key=counts.__getitem__)  # the first of equals: precedence breaks a tie
    return best if counts[best] else None


def format_of(path: Path, custom: Sequence[LineFormatSpec] = ()) -> str | None:
    """The name of the format `path` is in (the user's own formats first), or None."""
    for spec in custom:
        if spec.files is not None and fnmatch(path.name, spec.files):
            return spec.name
    return by_name(path.name) or by_content(path, custom)
