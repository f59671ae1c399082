"""TOML parsing in one place, so every file error reads the same: file, line, what is wrong."""

from __future__ import annotations

import os
import re
import stat
import sys
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from .errors import ConfigError


def load_toml_text(text: str, *, origin: str) -> dict[str, Any]:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{origin}: not valid TOML: {exc}") from None


MAX_BYTES = 1 << 20
"""A rules or config file is a few KB: one past a MiB is the wrong file (a log named by mistake),
and is read no further than that."""


def load_toml(path: Path) -> dict[str, Any]:
    return load_toml_text(read_text(path), origin=str(path))


RULES_OR_CONFIG = "a rules or config file"


def read_text(path: Path, *, what: str = RULES_OR_CONFIG, limit: int = MAX_BYTES) -> str:
    """The text of `path`, a regular file of at most `limit` bytes, or a ConfigError saying why not
    (`what` the file should be: a credential file is read the same way, with a smaller cap).
    What is checked is the file opened, not a name looked at before: opened without blocking (a
    FIFO would wait for a writer forever), then refused unless fstat says it is a regular file
    (/dev/zero would never end), and never read past the cap."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such file") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        noun = "a TOML file" if what == RULES_OR_CONFIG else what
        kind = f"is a folder, not {noun}" if stat.S_ISDIR(mode) else "not a regular file (a FIFO or a device is not read)"
        raise ConfigError(f"{path}: {kind}")
    with os.fdopen(fd, "rb") as file:
        try:
            data = file.read(limit + 1)
        except OSError as exc:
            raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from None
    if len(data) > limit:
        size = f"{limit >> 20} MiB" if limit >= 1 << 20 else f"{limit >> 10} KiB"
        raise ConfigError(f"{path}: larger than {size}, too large for {what} (is it the right file?)")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text: {exc.reason} at byte {exc.start}") from None


_HEADER = re.compile(r"^\s*\[\[?\s*([^\]]+?)\s*\]\]?\s*(?:#.*)?$")


def key_line(path: Path, key: str, *, table: str | None = None) -> int | None:
    """The line (from 1) where `key` is set in `table` (None: the top level), or where `table.key` opens
    as a table of its own; None when the file says it nowhere we can see (dotted keys, inline tables).
    tomllib keeps no positions: error messages find the line by reading it again."""
    try:
        lines = read_text(path).splitlines()
    except ConfigError:
        return None
    assign = re.compile(rf"^\s*[\"']?{re.escape(key)}[\"']?\s*=")
    full = f"{table}.{key}" if table else key
    current = None
    for number, line in enumerate(lines, 1):
        header = _HEADER.match(line)
        if header:
            current = header.group(1)
            if current == full:
                return number
        elif current == table and assign.match(line):
            return number
    return None
